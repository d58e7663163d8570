"""The switch actuators (nms/app/actuators/switch.py): isolate_port through UFM against the stand-in
UFM server (tests/_ufm.py, real HTTP: GET/PUT /ufmRest/app/unhealthy_ports as the UFM REST API guide's
"Unhealthy Ports REST API" documents them), and the refusals. gNMI Set is exercised on the lab
(tests/lab/test_actions_lab.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from _ufm import GUID, PASSWORD, USERNAME, UfmStandIn, port_name

from collectors.ufm.collector import UfmCollector
from correlator.actions.base import ActuatorError
from nms.app.actuators.switch import SwitchActuator, ports_of
from nms.config.models import SwitchConfig


@pytest.fixture
def ufm():
    server = UfmStandIn().start()
    yield server
    server.stop()


def service(ufm: UfmStandIn, collector: UfmCollector):
    server = SwitchConfig(name="ufm-1", mgmt_address="127.0.0.1",
                          collectors={"ufm": {"url": ufm.url, "username": USERNAME, "password": PASSWORD}})
    plain = SwitchConfig(name="leaf-9", mgmt_address="192.0.2.9")
    config = SimpleNamespace(fabric=SimpleNamespace(switches=[server, plain]))
    # what the poller learnt from the UFM server's polls: the switches it manages
    recent = SimpleNamespace(covered={"ufm-1": {"leaf-1", "leaf-2", "spine-1", "spine-2"}})
    return SimpleNamespace(poller=SimpleNamespace(config=config, collectors={"ufm": collector}, recent=recent))


def action(kind: str, element: str, targets: list[str], before: dict | None = None):
    return SimpleNamespace(kind=kind, element=element, targets=targets, before=before or {}, params={})


def test_isolate_port_through_ufm_reads_applies_and_reverts(ufm):
    collector = UfmCollector()
    act = SwitchActuator(service(ufm, collector).poller)
    a = action("isolate_port", "leaf-1:1/2/1--spine-2:1/1/1", ["leaf-1"])

    async def run():
        try:
            before = await act.read(a)
            after = await act.apply(a)
            listed = await (await collector._client(service(ufm, collector).poller.config.fabric.switches[0])) \
                .get_list("/app/unhealthy_ports")
            a.before = before
            reverted = await act.revert(a)
            return before, after, listed, reverted
        finally:
            await collector.close()

    before, after, listed, reverted = asyncio.run(run())
    assert before == {"ports": {"leaf-1:1/2/1": {"isolated": False}}}
    assert after == {"ports": {"leaf-1:1/2/1": {"isolated": True}}}
    assert [(e["UnhealthyGUID"], e["UnhealthyPortNumber"]) for e in listed] == [(GUID["leaf-1"], 3)]
    assert reverted == before
    puts = [r for r in ufm.requests if r[0] == "PUT"]
    assert [r[1] for r in puts] == ["/ufmRest/app/unhealthy_ports"] * 2
    assert ufm.data["unhealthy"] == {}
    assert port_name("leaf-1", "1/2/1") == f"{GUID['leaf-1']}_3"


def test_a_device_without_a_southbound_and_drain_over_ufm_are_refused(ufm):
    act = SwitchActuator(service(ufm, UfmCollector()).poller)
    with pytest.raises(ActuatorError, match="no southbound.*gNMI or a UFM"):
        asyncio.run(act.apply(action("isolate_port", "leaf-9:swp1", ["leaf-9"])))
    with pytest.raises(ActuatorError, match="needs gNMI"):  # UFM has no ECMP weights
        asyncio.run(act.apply(action("drain_link", "leaf-1:1/2/1--spine-2:1/1/1", ["leaf-1"])))
    with pytest.raises(ActuatorError, match="no recorded state"):
        asyncio.run(act.revert(action("isolate_port", "leaf-1:1/2/1", ["leaf-1"])))


def test_ports_of_names_the_ends_on_the_targets_and_rejects_bad_elements():
    assert ports_of("leaf1:swp1--spine1:swp1", ["leaf1"]) == [("leaf1", "swp1")]
    assert ports_of("leaf1:swp1--spine1:swp1", ["leaf1", "spine1"]) == [("leaf1", "swp1"), ("spine1", "swp1")]
    with pytest.raises(ActuatorError, match="no end on the target"):
        ports_of("leaf1:swp1--spine1:swp1", ["leaf2"])
    with pytest.raises(ActuatorError, match="want dev:port"):
        ports_of("leaf1", ["leaf1"])


def test_the_stand_in_refuses_a_malformed_unhealthy_ports_put(ufm):
    import httpx
    r = httpx.put(f"{ufm.url}/ufmRest/app/unhealthy_ports", auth=(USERNAME, PASSWORD),
                  json={"ports": ["nope_1"], "ports_policy": "UNHEALTHY", "action": "isolate"})
    assert r.status_code == 400 and "unknown ports" in r.text
