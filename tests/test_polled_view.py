"""Filing other members' switch records into a member's view (nms/app/polled_view.py): the rules
that make a re-read stretch harmless and a dead member's switches show as not heard from. The
processes' test is tests/test_cluster_poll_process.py (an API worker's /devices and /ports)."""

from __future__ import annotations

import time

import yaml
from prometheus_client import CollectorRegistry

from nms.app.polled_view import PolledView, file_records
from nms.app.polling import Poller
from nms.app.telemetry_bus import encode
from nms.config.loader import parse_config
from nms.config.models import BusConfig
from nms.records import DeviceStatus, LinkEvent, LldpNeighbor, PortSample

NS = 10**9


def poller(tmp_path) -> Poller:
    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": s, "mgmt_address": "127.0.0.1", "collectors": {"snmp": {"community": "c", "interval": 5}}}
        for s in ("sw1", "sw2")]}}))
    return Poller(cfg, store=None, registry=None)


def status(device: str, state: str, polled_ago_s: float, member: str = "poll-b") -> DeviceStatus:
    return DeviceStatus(device=device, collector="snmp", address="127.0.0.1", state=state, interval_s=5.0,
                        deadline_s=4.0, last_poll_ns=time.time_ns() - int(polled_ago_s * NS), member=member)


def test_another_members_statuses_show_until_they_are_overdue(tmp_path):
    p = poller(tmp_path)
    file_records(p, "device_status", [status("sw1", "ok", 1.0), status("sw2", "error", 30.0)], {})
    shown = {d.device: (d.state, d.member) for d in p.devices()}
    # sw2's next poll was due 25 s ago: more than two intervals and a deadline overdue (14 s)
    assert shown == {"sw1": ("ok", "poll-b"), "sw2": ("pending", "poll-b")}
    # the topology (the correlator's too): reachable by the polling member's word, unknown once overdue
    assert {n.name: n.reachable for n in p.topology().nodes} == {"sw1": True, "sw2": None}
    # an older status (a stretch read again) does not replace a newer one
    file_records(p, "device_status", [status("sw1", "error", 3.0, member="poll-a")], {})
    assert next(d for d in p.devices() if d.device == "sw1").member == "poll-b"


def test_events_filed_once_and_counted_as_flaps_samples_newest_wins(tmp_path):
    p = poller(tmp_path)
    t = time.time_ns()
    filed: dict = {}
    events = [LinkEvent(device="sw1", port="swp1", ts=t + i * NS, state=s, previous=prev, transitions=1)
              for i, (s, prev) in enumerate([("down", "up"), ("up", "down"), ("down", "up")])]
    for _ in range(2):  # the same stretch read twice (a consumer started again re-reads OVERLAP_S)
        file_records(p, "link_events", events, filed)
    assert [e.state for e in p.recent.events] == ["down", "up", "down"]
    assert p.links.flaps("sw1", "swp1", t + 3 * NS) == 2  # /ports' flap count for a switch polled elsewhere

    new = PortSample(device="sw1", port="swp1", ts=t + 2 * NS, oper_status="up", in_octets=10, out_octets=10)
    old = new.model_copy(update={"ts": t, "in_octets": 1})
    status_only = PortSample(device="sw1", port="swp1", ts=t + 3 * NS, oper_status="down")
    file_records(p, "port_samples", [new, old], filed)
    assert p.recent.samples[("sw1", "swp1")].in_octets == 10
    file_records(p, "port_samples", [status_only], filed)  # a streamed status change keeps the counters
    kept = p.recent.samples[("sw1", "swp1")]
    assert (kept.oper_status, kept.in_octets) == ("down", 10)


def test_an_in_process_correlator_gets_the_recent_records_of_switches_polled_elsewhere(tmp_path):
    """An `api,correlate` process joins no correlate feed: the other poll members' records reach its
    correlator through the view (not the views' own kinds, not what is older than the replay)."""
    p = poller(tmp_path)
    handed: list = []
    view = PolledView(None, BusConfig(servers=["nats://127.0.0.1:1"], prefix="t"), p, CollectorRegistry(),  # type: ignore[arg-type]
                      to_correlator=handed.extend, correlator_since_s=150)
    t = time.time_ns()
    fresh = PortSample(device="sw1", port="swp1", ts=t, oper_status="up", in_octets=1, out_octets=1)
    stale = fresh.model_copy(update={"port": "swp2", "ts": t - 200 * NS})
    for kind, records in [("port_samples", [fresh, stale]), ("device_status", [status("sw1", "ok", 1.0)])]:
        for body in encode(kind, records, 1 << 20):
            view._file(f"t.tel.polled.{kind}.sw1", body)
    assert handed == [fresh]
    assert set(p.recent.samples) == {("sw1", "swp1"), ("sw1", "swp2")}  # the view files both


def ufm_poller(tmp_path) -> Poller:
    """A fabric manager (UFM: one configured device reporting the switches it manages) and no switch."""
    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "ufm-1", "mgmt_address": "127.0.0.1", "collectors": {"ufm": {
            "url": "https://127.0.0.1:1", "username": "admin", "password": "p", "interval": 5}}}]}}))
    return Poller(cfg, store=None, registry=None)


def test_a_fabric_managers_switches_count_as_reachable_by_its_status_from_another_member(tmp_path):
    """The set a UFM's poll covers goes out with its status (DeviceStatus.covers): a member that does not
    poll it shows its switches reachable while the polling member's status is ok, unknown once overdue."""
    p = ufm_poller(tmp_path)
    t = time.time_ns()
    ufm = DeviceStatus(device="ufm-1", collector="ufm", address="127.0.0.1", state="ok", interval_s=5.0,
                       deadline_s=4.0, last_poll_ns=t - NS, member="poll-b", covers=["leaf-1", "spine-1"])
    file_records(p, "lldp_neighbors", [LldpNeighbor(device="leaf-1", port="1/1/1", ts=t, remote_name="spine-1",
                                                    remote_port="1/1/1"),
                                       LldpNeighbor(device="spine-1", port="1/1/1", ts=t, remote_name="leaf-1",
                                                    remote_port="1/1/1")], {})
    file_records(p, "device_status", [ufm], {})
    assert p.recent.covered == {"ufm-1": {"leaf-1", "spine-1"}}
    topology = p.topology()
    assert {n.name: n.reachable for n in topology.nodes if n.name != "ufm-1"} == {"leaf-1": True, "spine-1": True}
    assert [(link.a, link.b) for link in topology.links] == [("leaf-1:1/1/1", "spine-1:1/1/1")]
    # the polling member died: its status overdue, the switches unknown (not unreachable: their links left
    # out, not down)
    file_records(p, "device_status", [ufm.model_copy(update={"last_poll_ns": t - 20 * NS})], {})  # older: kept
    assert p.topology().links
    p.remote[("ufm", "ufm-1")] = ufm.model_copy(update={"last_poll_ns": t - 20 * NS})
    topology = p.topology()
    assert not topology.links and all(n.reachable is not False for n in topology.nodes)


def test_a_member_polling_a_fabric_manager_does_not_file_its_switches_records_back(tmp_path):
    """Its own records come back on the bus with the others' (api,poll): a UFM's switches are polled here
    too, so their link events are not filed (and their flaps counted) a second time."""
    p = ufm_poller(tmp_path)
    p._scheduler, p.owned = object(), {"ufm-1"}  # this member polls ufm-1 ...
    p.recent.covered["ufm-1"] = {"leaf-1"}  # ... and its polls report leaf-1
    assert p.polls_here("leaf-1") and not p.polls_here("spine-1")
    view = PolledView(None, BusConfig(servers=["nats://127.0.0.1:1"], prefix="t"), p, CollectorRegistry())  # type: ignore[arg-type]
    t = time.time_ns()
    events = [LinkEvent(device=d, port="1/1/1", ts=t, state="down", previous="up", transitions=1)
              for d in ("leaf-1", "spine-1")]
    for body in encode("link_events", events, 1 << 20):
        view._file("t.tel.polled.link_events.ufm-1", body)
    assert [e.device for e in p.recent.events] == ["spine-1"]  # another member's UFM reports spine-1
    assert p.links.flaps("leaf-1", "1/1/1", t) == 0
