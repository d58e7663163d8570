"""Every fault kind takes measurable effect on the real 2x2x2 lab, and heal restores the baseline."""

from __future__ import annotations

import time

import pytest
from lab_helpers import RATE

from lab import faults, traffic
from tests.helpers import wait_until

IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"
IF_OPER_STATUS = "1.3.6.1.2.1.2.2.1.8"
CROSS = [("host1", "host3"), ("host3", "host1"), ("host2", "host4"), ("host4", "host2")]

pytestmark = pytest.mark.root  # needs root: network namespaces (skips without it, see conftest)


def flows_per_spine(lab, pairs=CROSS, dport=33434):
    """For each host pair, one source port per spine: {(src, dst, sport): spine}."""
    out = {}
    for src, dst in pairs:
        for spine in ("spine1", "spine2"):
            out[(src, dst, lab.sport_via(src, dst, spine, dport=dport))] = spine
    return out


def delivered(lab, flows, count=50, **kw) -> dict:
    """{(src, dst, sport): fraction delivered} for one-way UDP probes."""
    out = {}
    for src, dst in {(s, d) for s, d, _ in flows}:
        sports = [sp for s, d, sp in flows if (s, d) == (src, dst)]
        for sp, got in lab.probe(src, dst, sports, count=count, **kw).items():
            out[(src, dst, sp)] = got / count
    return out


def assert_ended(lab, fault_id):
    f = next(f for f in lab.status()["faults"] if f["id"] == fault_id)
    assert not f["active"] and f["end_ns"] >= f["start_ns"] and f["end_iso"] >= f["start_iso"]
    return f


def test_link_down_blackhole_breaks_only_paths_through_it(lab):
    flows = flows_per_spine(lab)
    flows[("host1", "host2", 41000)] = None  # same leaf: never crosses a spine
    assert set(delivered(lab, flows).values()) == {1.0}
    f = lab.fault("link-down", "leaf2-spine1")
    assert f["params"]["mode"] == "blackhole"
    got = delivered(lab, flows)
    for flow, spine in flows.items():
        # host pairs 1<->3 and 2<->4 all cross leaf2; via spine1 they use the dead link
        assert got[flow] == (0.0 if spine == "spine1" else 1.0), (flow, spine, got[flow])
    assert lab.status()["links"][[ln["name"] for ln in lab.status()["links"]].index("leaf2-spine1")]["oper"] == \
        {"a": "down", "b": "down"}
    lab.heal(f["id"])
    # carrier is back at once; the routers' neighbour entries for the healed link may take a moment
    assert wait_until(lambda: set(delivered(lab, flows).values()) == {1.0}, timeout=10)
    assert_ended(lab, f["id"])


def test_link_down_failover_reroutes_everything(lab):
    flows = flows_per_spine(lab)
    f = lab.fault("link-down", "leaf2-spine1", "--mode", "failover")
    assert set(delivered(lab, flows).values()) == {1.0}
    route = lab.cli("exec", "leaf1", "--", "ip", "route", "show", "198.19.2.0/24").stdout
    assert "nexthop" not in route and "via 198.19.1.130 dev swp4" in route  # spine2 only
    assert lab.state()["withdrawn"] == ["leaf2-spine1"]
    lab.heal(f["id"])
    route = lab.cli("exec", "leaf1", "--", "ip", "route", "show", "198.19.2.0/24").stdout
    assert route.count("nexthop") == 2 and lab.state()["withdrawn"] == []
    assert set(delivered(lab, flows).values()) == {1.0}


def test_flap_toggles_carrier_and_records_every_transition(lab):
    before = int(lab.sysfs("leaf1", "swp4", "carrier_changes"))
    f = lab.fault("flap", "leaf1-spine2", "--period", "1", "--down-for", "0.5", "--count", "2")
    assert wait_until(lambda: not next(x for x in lab.status()["faults"] if x["id"] == f["id"])["active"], timeout=8)
    done = assert_ended(lab, f["id"])
    assert [e["state"] for e in done["events"]] == ["down", "up", "down", "up"]
    downs = [e["ns"] for e in done["events"] if e["state"] == "down"]
    assert 0.8e9 < downs[1] - downs[0] < 1.5e9
    assert int(lab.sysfs("leaf1", "swp4", "carrier_changes")) - before == 4
    assert "already ended" in lab.cli("heal", f["id"], check=False).stderr
    # an endless flap runs in the background until healed
    g = lab.fault("flap", "leaf1-spine2", "--period", "0.4", "--count", "0")
    assert wait_until(lambda: len(next(x for x in lab.state()["faults"] if x["id"] == g["id"])["events"]) >= 3, 15)
    lab.heal(g["id"])
    assert not (lab.dir.run_dir / f"flap-{g['id']}.pid").exists()
    n = len(assert_ended(lab, g["id"])["events"])
    time.sleep(0.6)
    assert len(next(x for x in lab.state()["faults"] if x["id"] == g["id"])["events"]) == n  # really stopped
    assert lab.sysfs("leaf1", "swp4", "operstate") == "up"


def _throughput(lab, flows, duration=2.0):
    return [r["received_bps"] for r in traffic.run_flows(lab.topo, flows, duration)]


def test_congestion_cuts_throughput_to_the_rate(lab):
    sp1 = lab.sport_via("host1", "host3", "spine1", dport=5301, proto="tcp")
    sp2 = lab.sport_via("host2", "host4", "spine2", dport=5302, proto="tcp")
    flows = [traffic.Flow("host1", "host3", "tcp", sp1, 5301, 0, "spine1"),
             traffic.Flow("host2", "host4", "tcp", sp2, 5302, 0, "spine2")]
    base = _throughput(lab, flows)
    assert all(b > 0.85 * RATE for b in base), base
    f = lab.fault("congestion", "leaf1-spine1", "--rate", "20M")
    cut, other = _throughput(lab, flows)
    assert 0.75 * 20e6 < cut < 1.05 * 20e6, cut
    assert other > 0.85 * RATE, other  # the path over spine2 keeps its rate
    lab.heal(f["id"])
    assert all(b > 0.85 * RATE for b in _throughput(lab, flows))


def test_loss_drops_n_percent_in_one_direction(lab):
    fwd = lab.sport_via("host1", "host3", "spine1")
    rev = lab.sport_via("host3", "host1", "spine1")  # crosses the link spine1 -> leaf1: not lossy
    f = lab.fault("loss", "leaf1-spine1", "--percent", "10")
    assert f["params"]["direction"] == "leaf1->spine1"
    n = 3000
    lost = 1 - lab.probe("host1", "host3", [fwd], count=n)[fwd] / n
    assert 0.075 < lost < 0.125, lost  # 10% +- 2.5 (binomial sd 0.55%)
    assert lab.probe("host3", "host1", [rev], count=500)[rev] == 500
    lab.heal(f["id"])
    done = assert_ended(lab, f["id"])
    assert done["result"]["dropped_packets"] >= round(lost * n)  # the nftables counter agrees (+ LLDP/ARP)
    assert lab.probe("host1", "host3", [fwd], count=500)[fwd] == 500


def test_mtu_mismatch_drops_large_frames_only(lab):
    via1 = lab.sport_via("host1", "host3", "spine1")
    via2 = lab.sport_via("host1", "host3", "spine2")
    f = lab.fault("mtu", "leaf1-spine1")  # spine1's end drops to 1500, the lab runs 9000
    assert f["params"]["port"] == "spine1:swp1" and f["params"]["mtu"] == 1500
    drops = lab.counters("spine1", "swp1")["rx"]["dropped"]
    big = lab.probe("host1", "host3", [via1, via2], count=50, size=8000)
    assert big == {via1: 0, via2: 50}
    assert lab.counters("spine1", "swp1")["rx"]["dropped"] - drops >= 50  # seen as the port's discards
    assert lab.probe("host1", "host3", [via1], count=50, size=1000)[via1] == 50
    lab.heal(f["id"])
    assert lab.probe("host1", "host3", [via1], count=50, size=8000)[via1] == 50


def test_nic_down_isolates_one_host(lab):
    flows = flows_per_spine(lab)
    f = lab.fault("nic-down", "host1")
    got = delivered(lab, flows)
    for (src, dst, sport), frac in got.items():
        assert frac == (0.0 if "host1" in (src, dst) else 1.0), (src, dst, sport)
    index = {v: k for k, v in lab.snmpwalk("leaf1", IF_NAME).items()}["swp1"]
    # snmpd caches the interface table for a few seconds
    assert wait_until(lambda: lab.snmpwalk("leaf1", IF_OPER_STATUS)[index] in ("2", "down(2)"), timeout=10)
    lab.heal(f["id"])
    assert set(delivered(lab, flows).values()) == {1.0}


def test_clock_offset_and_drift_are_recorded_for_the_agent(lab):
    f = lab.fault("clock", "host2", "--offset-us", "250", "--drift-ppm", "12.5")
    state = lab.status()
    c = state["clocks"]["host2"]
    assert c == {"offset_ns": 250_000, "drift_ppm": 12.5, "ref_ns": f["start_ns"], "fault": f["id"]}
    assert faults.clock_error_ns(state, "host2", f["start_ns"] + 10**9) == 250_000 + 12_500
    assert faults.clock_error_ns(state, "host1", f["start_ns"]) == 0
    lab.heal(f["id"])
    assert lab.status()["clocks"] == {}


def test_conflicting_and_bad_faults_are_refused(lab):
    f = lab.fault("congestion", "leaf2-spine2", "--rate", "50M")
    again = lab.cli("fault", "congestion", "spine2-leaf2", check=False)
    assert again.returncode == 1 and f"fault {f['id']}" in again.stderr and "heal it first" in again.stderr
    bad = lab.cli("fault", "melt", "leaf1-spine1", check=False)
    assert bad.returncode == 1 and "choose one of link-down" in bad.stderr
    nolink = lab.cli("fault", "loss", "leaf1-leaf2", check=False)
    assert nolink.returncode == 1 and "no link 'leaf1-leaf2'" in nolink.stderr
    lab.cli("heal", "--all")
    assert not any(x["active"] for x in lab.status()["faults"])


@pytest.fixture(autouse=True)
def _no_fault_left_behind(lab):
    """A failing test must not leave its fault in place for the next one."""
    yield
    lab.cli("heal", "--all")
