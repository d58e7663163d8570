"""Replayed collector cases: every tests/collector_cases/<collector>/<case>/ (README there) polled
through the real collector, its transport answering from the case's recorded `responses.*`
(tests/_replay_<collector>.py), and the poll's records and problems compared with `expected.yaml`.
No daemon, no socket, no root.

Where each case's responses come from is in its responses file's header and in
tests/collector_cases/README.md: CLI, napalm's public captures of real EOS / NX-OS devices
(napalm-automation/napalm@ee70e634555f6d1f9d32369f2151dde526ad6dfd, Apache-2.0, the files
tests/test_cli_napalm_cases.py compares with napalm's own results); SNMP, a walk of the real
net-snmp snmpd of tests/_snmpd.py; gNMI, the lab's gNMI target (tests/_gnmi.py); UFM, the stand-in
UFM server (tests/_ufm.py, whose shapes follow the public sources cited in tests/test_ufm_collector.py).
"""

from __future__ import annotations

import pytest
import yaml
from _cases import Case, all_cases, difference, observed, replay

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_poll_yields_the_expected_records_and_problems(case: Case):
    expected = case.expected()
    result = replay(case)
    assert result.collector == case.collector and result.device == case.device().name
    diff = difference(expected, observed(result, expected))
    assert not diff, f"{case.id}: the poll differs from expected.yaml (- expected, + this poll):\n{diff}"


def test_every_collector_has_two_cases_or_more_one_with_a_problem():
    by: dict[str, list[bool]] = {}
    for case in CASES:
        by.setdefault(case.collector, []).append(bool(case.expected().get("problems")))
    assert set(by) == {"cli", "snmp", "gnmi", "ufm"}
    assert all(len(flags) >= 2 and any(flags) for flags in by.values()), by


def test_a_difference_is_shown_as_a_diff_naming_the_field(tmp_path):
    case = next(c for c in CASES if c.id == "snmp/linux_snmpd_v2c")
    expected = case.expected()
    expected["records"]["DeviceFacts"][0]["sys_name"] = "not-this-one"
    expected["problems"] = [{"what": "something", "reason": "left out"}]
    diff = difference(expected, observed(replay(case), expected))
    assert "-  - sys_name: not-this-one\n+  - sys_name: nms-test-snmpd" in diff
    assert "-- what: something\n-  reason: left out\n+problems: []" in diff


def test_settings_are_validated_by_the_collectors_own_model(tmp_path):
    case_dir = tmp_path / "snmp" / "bad"
    case_dir.mkdir(parents=True)
    (case_dir / "settings.yaml").write_text(yaml.safe_dump({"version": "2c", "comunity": "typo"}))
    with pytest.raises(ValueError, match="comunity"):
        Case(case_dir).device()


def test_a_walk_line_that_cannot_be_replayed_is_named():
    from _replay_snmp import parse_walk

    walk = parse_walk('.1.3.6.1.2.1.1.5.0 = Hex-STRING: 6C 65 61 \n66 31 \n'  # a hex string goes on
                      '.1.3.6.1.2.1.1.3.0 = Timeticks: (7) 0:00:00.07\n'
                      '.1.3.6.1.2.1.1.6.0 = STRING: "rack \\"4\\""\n.1.0.8802 = No Such Object available\n')
    values = [bytes(v.asOctets()) if hasattr(v, "asOctets") else int(v) for v in walk.values()]
    assert values == [b"leaf1", 7, b'rack "4"']
    with pytest.raises(ValueError, match=r"w:2: SNMP type 'Opaque' is not replayed"):
        parse_walk(".1.3.6.1.2.1.1.5.0 = INTEGER: 1\n.1.3.6.1.2.1.1.6.0 = Opaque: 01\n", "w")


def test_a_request_the_recording_does_not_have_fails_naming_it(tmp_path):
    """Here: the same target's recording, polled without the queues (another subscription)."""
    case = next(c for c in CASES if c.id == "gnmi/lab_target_lo")
    copy = Case(tmp_path / "gnmi" / "without_queues")
    copy.dir.mkdir(parents=True)
    for name in ("settings.yaml", "responses.json", "expected.yaml"):
        (copy.dir / name).write_text((case.dir / name).read_text())
    with (copy.dir / "settings.yaml").open("a") as f:
        f.write("queues: false\n")
    with pytest.raises(AssertionError, match="Subscribe request not in this recording"):
        replay(copy)
