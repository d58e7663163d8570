"""tests/collector_cases/record.py against the real peers of the contract suite: a case recorded
from a live poll replays (tests/_cases.py, no peer) to the same records and problems as that poll.
The peers: the UFM stand-in (tests/_ufm.py), the lab's gNMI target (tests/_gnmi.py), net-snmp's
snmpd (tests/_snmpd.py; for SNMP the recording is snmpwalk's, and the live poll is the collector's own
right after it). The CLI recorder needs an SSH server (tests/_sshd.py: root and a namespace): not here."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import yaml
from _cases import Case, difference, draft_expected, observed, replay
from _gnmi import PASSWORD as GNMI_PASSWORD
from _gnmi import USER as GNMI_USER
from _gnmi import Target
from _snmpd import Snmpd, available
from _ufm import PASSWORD as UFM_PASSWORD
from _ufm import USERNAME as UFM_USERNAME
from _ufm import UfmStandIn

from collectors.snmp.collector import SnmpCollector
from nms.config.models import SwitchConfig

_spec = importlib.util.spec_from_file_location("record", Path(__file__).parent / "collector_cases" / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)


def recorded(collector: str, case: Path, settings: dict, *overrides: str) -> dict:
    """Record the case; its draft (the live poll's every field) as expected.yaml."""
    case.mkdir(parents=True)
    (case / "settings.yaml").write_text(yaml.safe_dump(settings))
    assert record.main([collector, str(case), "--address", "127.0.0.1", *overrides]) == 0
    draft = yaml.safe_load((case / "expected.draft.yaml").read_text())
    (case / "expected.yaml").write_text(yaml.safe_dump(draft))
    return draft


def unclocked(draft: dict) -> dict:
    """Without DeviceFacts.uptime_ticks, which a gNMI target's boot-time makes relative to now."""
    for facts in draft["records"].get("DeviceFacts", []):
        facts.pop("uptime_ticks", None)
    return draft


def test_a_ufm_recording_replays_to_the_live_poll(tmp_path):
    ufm = UfmStandIn().start()
    ufm.fault("/resources/links", "not json")  # a problem recorded too
    try:
        case = tmp_path / "ufm" / "live"
        live = recorded("ufm", case, {"username": UFM_USERNAME, "password": UFM_PASSWORD, "backoff": 0.05},
                        "--set", f"url={ufm.url}")
    finally:
        ufm.stop()
    assert len(live["records"]["PortSample"]) == 14 and "LldpNeighbor" not in live["records"]
    assert [p["what"] for p in live["problems"]] == ["GET /ufmRest/resources/links"]
    assert UFM_PASSWORD not in (case / "responses.json").read_text()  # the credential is in no answer
    result = replay(Case(case))
    assert not difference(live, observed(result, live))


def test_a_gnmi_recording_replays_to_the_live_poll(tmp_path):
    target = Target(tmp_path, "--insecure", "--interfaces", "lo", "--hostname", "leaf11", "--no-models",
                    "--no-qos").start()
    try:
        case = tmp_path / "gnmi" / "live"
        live = recorded("gnmi", case, {"insecure": True, "username": GNMI_USER, "password": GNMI_PASSWORD,
                                       "mode": "once"}, "--set", f"port={target.port}")
    finally:
        target.stop()
    assert live["records"]["DeviceFacts"][0]["sys_name"] == "leaf11"
    assert [p["what"] for p in live["problems"]] == ["openconfig-qos"]
    result = replay(Case(case))
    expected = unclocked(live)
    assert not difference(expected, observed(result, expected))


@pytest.mark.skipif(not available(), reason="net-snmp snmpd not installed")
def test_an_snmp_walk_replays_to_what_the_collector_reads_live(tmp_path):
    snmpd = Snmpd()
    snmpd.start()
    try:
        case = tmp_path / "snmp" / "live"
        settings = snmpd.settings()
        recorded("snmp", case, {k: v for k, v in settings.items() if k != "port"}, "--set", f"port={snmpd.port}")
        device = SwitchConfig(name="dut", mgmt_address="127.0.0.1", collectors={"snmp": settings})

        async def poll():
            collector = SnmpCollector()
            try:
                return await collector.collect(device)
            finally:
                await collector.close()

        live = draft_expected(asyncio.run(poll()))
    finally:
        snmpd.stop()
    moving = ("octets", "pkts", "uptime_ticks")  # the counters move between the walk and the poll
    for records in live["records"].values():
        for r in records:
            for field in [f for f in r if f.endswith(moving)]:
                del r[field]
    assert {"DeviceFacts", "PortSample", "InterfaceAddress"} <= set(live["records"])
    assert not difference(live, observed(replay(Case(case)), live))
