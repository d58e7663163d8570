import collections
import os

import pytest
from _influx import influx_store, influxd  # noqa: F401  (influxd fixtures)
from _nats import nats_server  # noqa: F401  (a nats-server with JetStream)
from _notify import notify_make as make  # noqa: F401  (notification test fixtures)
from _notify import notify_rx as rx  # noqa: F401
from _postgres import open_state, postgres_database, postgres_server  # noqa: F401  (state on SQLite and PostgreSQL)
from _snmpd import snmpd  # noqa: F401  (a module-scoped net-snmp snmpd)
from hypothesis import settings

# The property tests draw the same examples on every run (the suite must not fail by chance in CI);
# NMS_HYPOTHESIS=explore draws new ones, to look for counterexamples on purpose.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("NMS_HYPOTHESIS", "repeatable"))

# With `-n 2` (pytest-xdist) every module is a unit of work of its own (its tests in their order, its
# module-scoped fixtures set up once, as in a serial run) on whichever worker is free, except the labs
# (tests/lab/: namespaces, real-time faults, one lab at a time): one unit, run in order on one worker
# and handed out first (pytest_xdist_make_scheduler). Every other test in a worker runs at nice 19, so
# the labs' real-time work gets the CPU whenever it wants it; scripts/test.sh puts only the
# `beside_labs` modules beside the labs.
LABS = "tests/lab/"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist's workers start with COLUMNS=80 and LINES=24, and rich fixes a Console's width from COLUMNS
    # when the console is made (at import): the CLI tables would be cut at 80 columns in every test
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
BESIDE_THE_LABS_NICE = 19
# Modules with no real-time deadline or timer in them (CPU-bound checks: property tests, the API
# fuzz, synthetic correlator runs, replayed cases): marked `beside_labs`, scripts/test.sh runs them
# next to the labs at the lowest CPU priority, on the core the labs leave idle most of the time.
BESIDE_THE_LABS = {
    "test_api_fuzz", "test_store_types", "test_correlator_lowloss", "test_correlator_faults",
    "test_correlator_data", "test_correlator_partial", "test_correlator_queues", "test_fabric_sim",
    "test_counters", "test_hostprobe_config", "test_incident_parents", "test_store_contract",
    "test_collector_cases", "test_cli_napalm_cases", "test_queue_counters", "test_hostprobe_clock_edges",
    "test_hostprobe_report", "test_api", "test_action_manager", "test_incident_parents_api",
    "test_actions_api", "test_cli_widths", "test_steering", "test_audits_service", "test_correlator_trials",
    "test_lab_switch_down",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default (`load`) hands out tests in chunks: a module's tests split over both workers
    (each sets its fixtures up, and a test written after another may run first), and the labs would
    run two at a time once they outgrow a chunk. An explicit other `--dist` is kept."""
    if config.getvalue("dist") not in ("load", "loadfile"):
        return None
    from xdist.scheduler import LoadFileScheduling

    class LabsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return LABS if nodeid.startswith(LABS) else super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # collection order: the labs (tests/lab/ sorts first) first
    return LabsTogether(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(items):
    """Every test under tests/lab/ is marked `lab`, every one of BESIDE_THE_LABS `beside_labs`.

    pytest 9 builds an item's id from its callspec, and schemathesis's items (tests/test_api_fuzz.py,
    one per API operation) have none: all would share one id, and xdist, which schedules by id, would
    run one of them. Each gets the id pytest 8 gave it: its name, the operation in brackets."""
    for item in items:
        if item.nodeid.startswith(LABS):
            item.add_marker(pytest.mark.lab)
        elif item.nodeid.split("::")[0].removeprefix("tests/").removesuffix(".py") in BESIDE_THE_LABS:
            item.add_marker(pytest.mark.beside_labs)
        if item.name.endswith("]") and not item.nodeid.endswith("]"):
            item._id = item.parent.id.child(item.name)
    shared = sorted(nodeid for nodeid, n in collections.Counter(i.nodeid for i in items).items() if n > 1)
    if shared:
        raise pytest.UsageError(f"tests sharing an id (xdist would run one of each): {shared[:5]}")


def pytest_runtest_setup(item):
    beside = os.environ.get("PYTEST_XDIST_WORKER") and not item.nodeid.startswith(LABS)
    if beside and os.nice(0) < BESIDE_THE_LABS_NICE:
        os.nice(BESIDE_THE_LABS_NICE - os.nice(0))


_RERUN_FAILURES: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    """Keep why a test needed its rerun: pytest-rerunfailures shows only that it did (here, not in
    tests/lab/conftest.py: under xdist only this conftest is loaded where the reports are gathered)."""
    if report.outcome == "rerun":
        _RERUN_FAILURES.append((report.nodeid, report.longreprtext[-4000:]))


def pytest_terminal_summary(terminalreporter):
    for nodeid, text in _RERUN_FAILURES:
        terminalreporter.write_sep("-", f"first failure of {nodeid} (it was rerun)")
        terminalreporter.write_line(text)
