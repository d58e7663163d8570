"""The SNMP collector against the fabric lab: real snmpd + lldpd in every switch namespace.

Builds its own 2x2x2 lab with its own prefix, management subnet and directory (so it never clashes
with a lab a user has up, nor with tests/lab), and removes it afterwards. Root only.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from lab_helpers import skip_reason

pytestmark = [pytest.mark.root]
PREFIX = "nmss-"
MGMT = "198.18.252.0/24"
UNUSED_MGMT_ADDRESS = "198.18.252.250"  # in the lab's management subnet, no node: ARP fails, a timeout
SNMPD_CACHE_S = 3.5


@pytest.fixture(scope="module")
def lab():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from lab import cleanup
    from lab import lab as lab_mod
    from lab.state import LabDir
    from lab.topology import Spec

    d = LabDir(Path(tempfile.mkdtemp(prefix="nms-snmp-lab-")))  # under /tmp: lldpd must reach its socket
    cleanup.remove(PREFIX, d)
    lab_mod.up(d, Spec(mgmt_subnet=MGMT, prefix=PREFIX, southbound="snmp"))  # SNMP alone sets link state
    try:
        yield d
    finally:
        lab_mod.down(d, PREFIX)


def lab_config(lab, interval: float = 10.0, extra_switches: list[dict] | None = None, v3: bool = False):
    """The NMS config `nms lab up` wrote, with a shorter poll interval (and optionally v3)."""
    import yaml

    from nms.config import load_config, parse_config

    cfg = load_config(lab.config)
    doc = yaml.safe_load(lab.config.read_text())
    doc["api"]["tokens"] = []
    doc["data_dir"] = str(lab.root / "snmp-test-data")
    state = json.loads(lab.state.read_text())
    for s in doc["fabric"]["switches"]:
        s["collectors"]["snmp"]["interval"] = interval
        if v3:
            s["collectors"]["snmp"] = {"version": "3", **state["snmp"]["v3"], "interval": interval}
    doc["fabric"]["switches"] += extra_switches or []
    assert cfg.fabric.switches  # the lab config loads as it is
    return parse_config(yaml.safe_dump(doc))


class _ListStore:
    name = "list"

    def __init__(self):
        self.points = []

    def write(self, points):
        from nms.store import WriteResult

        self.points.extend(points)
        return WriteResult(accepted=len(points))

    def stats(self):
        return {}

    def close(self):
        pass


def netns_counters(ns: str) -> dict[str, dict]:
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return {i["ifname"]: {f"{d}_{k}": v for d in ("rx", "tx") for k, v in i["stats64"][d].items()}
            for i in json.loads(out.stdout)}


def traffic(lab, src: str = "host1", dst_ip: str | None = None) -> None:
    """Real packets across the fabric (UDP from host1 to a host on the other leaf)."""
    state = json.loads(lab.state.read_text())
    if dst_ip is None:
        link = next(link for link in state["links"] if link["b"] == "host3:eth0")
        dst_ip = link["b_address"].split("/")[0]
    send = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range(300): s.sendto(b'x' * 1200, ({dst_ip!r}, 33434))\n")
    subprocess.run(["ip", "netns", "exec", PREFIX + src, sys.executable, "-c", send], capture_output=True,
                   check=True, timeout=30)


def poll_until(poller, predicate, timeout: float):
    async def run():
        deadline = time.monotonic() + timeout
        while True:
            await poller.poll_all()
            if predicate() or time.monotonic() > deadline:
                return predicate()
            await asyncio.sleep(1)

    return run


def test_polled_counters_match_the_kernel_in_every_switch(lab):
    from nms.app.polling import Poller

    traffic(lab)
    config = lab_config(lab)
    switches = [s.name for s in config.fabric.switches]
    before = {s: netns_counters(PREFIX + s) for s in switches}
    time.sleep(SNMPD_CACHE_S)

    async def run():
        poller = Poller(config, _ListStore(), registry=None)
        try:
            await poller.poll_all()
        finally:
            await poller.close()
        return poller

    poller = asyncio.run(run())
    after = {s: netns_counters(PREFIX + s) for s in switches}
    assert {d.device: d.state for d in poller.devices()} == {s: "ok" for s in switches}
    checked = 0
    for (device, port), sample in poller.recent.samples.items():
        if not port.startswith("swp"):
            continue
        lo, hi = before[device][port], after[device][port]
        for ours, kernel in (("in_octets", "rx_bytes"), ("out_octets", "tx_bytes"), ("in_pkts", "rx_packets"),
                             ("out_pkts", "tx_packets"), ("in_errors", "rx_errors"), ("out_errors", "tx_errors"),
                             ("in_discards", "rx_dropped")):
            assert lo[kernel] <= getattr(sample, ours) <= hi[kernel], (device, port, ours)
        assert sample.oper_status == "up" and sample.mtu == 9000 and sample.speed_bps == 100_000_000
        checked += 1
    assert checked == 8 + 4  # leaves: 2 host ports + 2 uplinks each; spines: 2 ports each
    # the UDP stream went up from leaf1 (the bracket above would hold for idle counters too)
    assert sum(after["leaf1"][p]["tx_bytes"] - before["leaf1"][p]["tx_bytes"] for p in ("swp3", "swp4")) >= 0
    assert sum(poller.recent.samples[("leaf1", p)].out_octets for p in ("swp3", "swp4")) >= 300 * 1200


def test_lldp_topology_equals_the_lab_and_an_unreachable_switch_does_not_delay_the_others(lab):
    from nms.app.polling import Poller

    dead = {"name": "ghost", "mgmt_address": UNUSED_MGMT_ADDRESS, "role": "leaf",
            "collectors": {"snmp": {"community": "x", "timeout": 1.0, "retries": 1}}}
    config = lab_config(lab, extra_switches=[dead])
    poller = Poller(config, _ListStore(), registry=None)

    def complete():
        topo = poller.topology()
        return all(link.check == "ok" for link in topo.links)

    async def run():
        try:
            started = time.time_ns()
            await poller.poll_all()
            first = {d.device: d for d in poller.devices()}
            ok = await poll_until(poller, complete, timeout=20)()  # lldpd announces every 5 s
            return started, first, ok
        finally:
            await poller.close()

    started, first, ok = asyncio.run(run())
    assert ok, [(link.a, link.b, link.check) for link in poller.topology().links if link.check != "ok"]
    topo = poller.topology()
    state = json.loads(lab.state.read_text())
    lab_links = {tuple(sorted((link["a"], link["b"]))) for link in state["links"]}
    assert {(link.a, link.b) for link in topo.links} == lab_links
    assert all(link.state == "up" for link in topo.links if not link.a.startswith("host"))
    assert set(link.seen_by[0] for link in topo.links) <= {"leaf1", "leaf2", "spine1", "spine2"}
    assert first["ghost"].last_error_kind == "timeout"
    for name in ("spine1", "spine2", "leaf1", "leaf2"):
        # polled beside the unreachable switch, not after its 2 tries of 1 s (when its own poll took on a loaded
        # machine is its own business: 1.49 s was seen)
        assert (first[name].last_poll_ns - started) / 1e9 < 1.0, f"{name} waited for the unreachable switch"
        assert first[name].last_success_ns > first[name].last_poll_ns
    # the equal-cost paths between hosts on different leaves go through each spine
    from nms.topology import ecmp_paths

    paths = ecmp_paths(topo, "host1", "host3")
    assert sorted(p.devices[2] for p in paths) == ["spine1", "spine2"]


def test_v3_authpriv_on_the_lab_switches(lab):
    from nms.app.polling import Poller

    config = lab_config(lab, v3=True)
    assert config.fabric.switches[0].collectors.snmp.version == "3"

    async def run():
        poller = Poller(config, _ListStore(), registry=None)
        try:
            return await poller.poll_all()
        finally:
            await poller.close()

    assert {d.state for d in asyncio.run(run())} == {"ok"}


def test_a_link_taken_down_shows_within_one_interval_plus_the_snmpd_cache(lab):
    from lab import faults
    from lab.state import LabDir
    from nms.app.service import Service

    interval = 2.0
    config = lab_config(lab, interval=interval)
    events: list = []

    async def run():
        service = Service(config, store=_ListStore())
        await service.start()
        try:
            # wait until every switch has been polled twice (a baseline status for each port)
            for _ in range(100):
                if all(d.polls >= 2 and d.state == "ok" for d in service.poller.devices()):
                    break
                await asyncio.sleep(0.1)
            fault = await asyncio.to_thread(faults.inject, LabDir(lab.root), "link-down", "leaf1-spine1")
            t_down = time.monotonic()
            seen_at = None
            while time.monotonic() - t_down < interval + SNMPD_CACHE_S + 4:
                recent = [e for e in service.poller.recent.events if e.device == "leaf1" and e.port == "swp3"]
                if recent and recent[-1].state != "up":
                    seen_at = time.monotonic() - t_down
                    break
                await asyncio.sleep(0.1)
            topo_state = {(link.a, link.b): link.state for link in service.poller.topology().links}
            await asyncio.to_thread(faults.heal, LabDir(lab.root), fault["id"])
            events.extend(service.poller.recent.events)
            return seen_at, topo_state
        finally:
            await service.stop()

    seen_at, topo_state = asyncio.run(run())
    assert seen_at is not None, f"link down never seen; events: {events}"
    print(f"link down seen by SNMP after {seen_at:.2f} s (poll interval {interval:g} s)")
    assert seen_at <= interval + SNMPD_CACHE_S + 0.5, f"seen after {seen_at:.1f} s"
    assert topo_state[("leaf1:swp3", "spine1:swp1")] == "down"
    assert topo_state[("leaf1:swp4", "spine2:swp1")] == "up"
    down = next(e for e in events if e.device == "leaf1" and e.port == "swp3")
    assert down.previous == "up" and down.flaps_in_window == 1 and not down.flapping


def test_a_flapping_link_is_counted_and_flagged(lab):
    """The lab flaps leaf2-spine2 twice (4 s down, 4 s up); polling every second sees each flap
    (snmpd's cache is ~3 s) and, with a threshold of 1 flap per minute, flags the link."""
    from lab import faults
    from lab.state import LabDir
    from nms.app.service import Service

    config = lab_config(lab, interval=1.0)
    config = config.model_copy(update={"thresholds": config.thresholds.model_copy(
        update={"flap_count": 1, "flap_window": 60.0})})

    async def run():
        service = Service(config, store=_ListStore())
        await service.start()
        try:
            await asyncio.sleep(2.5)  # a baseline poll of every switch
            fault = await asyncio.to_thread(faults.inject, LabDir(lab.root), "flap", "leaf2-spine2", period=8.0,
                                            down_for=4.0, count=2)
            await asyncio.sleep(2 * 8.0 + 3.0)
            topo = service.poller.topology()
            return fault, list(service.poller.recent.events), topo, service.store.points
        finally:
            await service.stop()

    fault, events, topo, points = asyncio.run(run())
    state = json.loads(lab.state.read_text())
    truth = next(f for f in state["faults"] if f["id"] == fault["id"])["events"]
    assert [e["state"] for e in truth] == ["down", "up", "down", "up"]
    mine = [e for e in events if (e.device, e.port) == ("leaf2", "swp4")]
    assert [e.state == "up" for e in mine] == [False, True, False, True], mine
    assert [e.flaps_in_window for e in mine] == [1, 1, 2, 2] and mine[-1].flapping and not mine[0].flapping
    far_end = [e for e in events if (e.device, e.port) == ("spine2", "swp2")]
    assert len(far_end) == 4  # the other end saw the same carrier changes
    link = next(link for link in topo.links if link.a == "leaf2:swp4")
    assert link.flapping and link.state == "degraded"
    stored = [p for p in points if p.measurement == "link_event"
              and (p.tags["device"], p.tags["port"]) in (("leaf2", "swp4"), ("spine2", "swp2"))]
    assert len(stored) == 8 and stored[-1].fields["flaps_in_window"] == 2
