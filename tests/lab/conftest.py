"""Lab fixtures (root only). `lab`: a real 2x2x2 fabric lab per test module, with its own prefix,
management subnet and lab directory so it cannot clash with a lab a user has up (default prefix
nmsl-, 198.18.0.0/24). `shared_mesh`: one 3-leaf mesh lab with the service and agents
(the correlator trials' shape), kept up across the modules that use it, which run one after another."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_helpers import PREFIX, build_lab, new_lab_dir, skip_reason

from lab import lab as lab_mod
from lab.correlator_trials import SERVICE, incidents, wait_quiet
from lab.mesh import MeshLab

LAB_DIR = Path(__file__).resolve().parent
SHARED = "shared_mesh"
_shared: list[MeshLab] = []  # the shared mesh while it is up


def pytest_collection_modifyitems(config, items):
    """One rerun for a failed lab test: these run real daemons, kernels' routing and timers in
    network namespaces on a shared 2-core machine, where a scheduling stall can cost a trial its
    deadline. A failure that repeats fails the suite; every rerun shows as R in the summary (and
    `-rR` lists them), so a test that starts to need it is visible.

    The tests on the shared mesh move next to each other (where the first of them is, in their
    order), so the mesh comes up once for all of them."""
    for item in items:
        if LAB_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=2))
    shared = [item for item in items if SHARED in getattr(item, "fixturenames", ())]
    if shared:
        first = items.index(shared[0])
        rest = [item for item in items if SHARED not in getattr(item, "fixturenames", ())]
        items[:] = rest[:first] + shared + rest[first:]


@pytest.fixture(scope="module")
def lab():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    handle = build_lab(new_lab_dir())
    yield handle
    lab_mod.down(handle.dir, PREFIX)


@pytest.fixture(scope="module")
def shared_mesh() -> MeshLab:
    """The shared mesh, brought up by the first module that needs it; each module starts on a
    service that sees the whole lab (a module before may have restarted it) with no incident open."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    if not _shared:
        # the correlator trials' service; audits run when a test asks (tests/lab/test_audit_lab.py)
        config = {**SERVICE, "audits": {"start_delay": "1h"}}
        m = MeshLab("nmsr-", "198.18.243.0/24", snmp_interval="1s", service_config=config, leaves=3, hosts_per_leaf=2)
        try:
            m.up()
            m.wait_traced(60)
        except BaseException:
            m.down()
            raise
        _shared.append(m)
    m = _shared[0]
    m.wait_service_ready(m.service_started_ns)  # paths, windows and polls reached it: it sees what a test does
    assert wait_quiet(m, 60), [f"{i['kind']} {i['element']}: {i['summary']}" for i in incidents(m, state="open")]
    return m


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Down with the shared mesh before the first test after those that use it (not in the last
    one's teardown: a failed test is rerun, on the same mesh)."""
    if _shared and SHARED not in item.fixturenames:
        _shared.pop().down()


def pytest_sessionfinish(session):
    if _shared:
        _shared.pop().down()
