"""Every audit check on synthetic snapshots: a clean fabric gives no finding, each planted fault
exactly its finding, missing data "not enough data" with a reason and no finding."""

from __future__ import annotations

import pytest
from test_topology import T0, fabric, lldp_as_cabled

from nms.app.audits import CHECKS
from nms.app.audits.drift import normalized_lines
from nms.app.audits.model import ProbedPath, Snapshot
from nms.config.models import AuditsConfig
from nms.records import ClockSolution, DeviceFacts, LldpNeighbor, PortRates, PortSample
from nms.topology import build_topology, ecmp_paths, parse_end

SPEED = 100_000_000
CFG = AuditsConfig()


def clean_snapshot(hosts_per_leaf: int = 1) -> Snapshot:
    """Two spines, two leaves, cabled and polled as configured: every switch port MTU 9000, 100 Mb/s,
    no errors, idle."""
    f = fabric(hosts_per_leaf=hosts_per_leaf)
    topo = build_topology(f, lldp_as_cabled(f), generated_ns=T0)
    switches = {s.name for s in f.switches}
    ends = [parse_end(e) for link in topo.links for e in (link.a, link.b)]
    ports = [e for e in ends if e[0] in switches]
    samples = {e: PortSample(device=e[0], port=e[1], ts=T0, mtu=9000, speed_bps=SPEED, oper_status="up") for e in ports}
    rates = {e: PortRates(device=e[0], port=e[1], ts=T0, interval_s=10, in_bps=1000.0, out_bps=1000.0,
                          in_errors_ps=0.0, out_errors_ps=0.0) for e in ports}
    facts = {s: DeviceFacts(device=s, ts=T0, sys_descr="Linux 6.1 lab") for s in switches}
    return Snapshot(now_ns=T0, fabric=f, topology=topo, polled=switches, samples=samples, rates=rates, facts=facts)


def run(name: str, snap: Snapshot, **settings):
    return CHECKS[name](snap, CFG.settings(name).model_copy(update=settings))


def brief(res) -> list[tuple[str, str, str]]:
    return sorted((f.element, f.element_kind, f.severity) for f in res.findings)


@pytest.mark.parametrize("name", ["cabling", "mtu", "speed", "errors", "ecmp_balance", "config_drift"])
def test_clean_fabric_gives_no_finding(name):
    res = run(name, clean_snapshot())
    assert res.findings == [] and res.checked > 0 and res.status == "clean"


# --- cabling --------------------------------------------------------------------------------------

def test_cabling_miscabled_missing_unexpected():
    snap = clean_snapshot()
    seen = lldp_as_cabled(snap.fabric)
    # leaf2's uplinks swapped: swp2 goes to spine2, swp3 to spine1
    seen["leaf2"] = [n for n in seen["leaf2"] if n.port not in ("swp2", "swp3")] + [
        LldpNeighbor(device="leaf2", port="swp2", ts=T0, remote_name="spine2", remote_port="swp2"),
        LldpNeighbor(device="leaf2", port="swp3", ts=T0, remote_name="spine1", remote_port="swp2")]
    seen["spine1"] = [n for n in seen["spine1"] if n.port != "swp2"] + [
        LldpNeighbor(device="spine1", port="swp2", ts=T0, remote_name="leaf2", remote_port="swp3")]
    seen["spine2"] = [n for n in seen["spine2"] if n.port != "swp2"] + [
        LldpNeighbor(device="spine2", port="swp2", ts=T0, remote_name="leaf2", remote_port="swp2")]
    # leaf1-spine1 unplugged; a stray cable spine1:swp9 - spine2:swp9
    seen["leaf1"] = [n for n in seen["leaf1"] if n.port != "swp2"]
    seen["spine1"] = [n for n in seen["spine1"] if n.port != "swp1"] + [
        LldpNeighbor(device="spine1", port="swp9", ts=T0, remote_name="spine2", remote_port="swp9")]
    snap.topology = build_topology(snap.fabric, seen)
    res = run("cabling", snap)
    assert res.status == "findings"
    assert brief(res) == [("leaf1:swp2--spine1:swp1", "link", "major"),
                          ("leaf2:swp2--spine2:swp2", "link", "major"),
                          ("leaf2:swp3--spine1:swp2", "link", "major"),
                          ("spine1:swp9--spine2:swp9", "link", "minor")]
    by = {f.element: f for f in res.findings}
    assert by["leaf1:swp2--spine1:swp1"].evidence["check"] == "missing"
    assert "leaf2:swp3 should connect to spine2:swp2" in by["leaf2:swp3--spine1:swp2"].message
    assert by["spine1:swp9--spine2:swp9"].evidence["check"] == "unexpected"


def test_cabling_missing_on_a_down_or_flapping_link_is_reported_but_left_to_the_link_state():
    snap = clean_snapshot()
    seen = lldp_as_cabled(snap.fabric)
    seen["leaf1"] = [n for n in seen["leaf1"] if n.port != "swp2"]
    seen["spine1"] = [n for n in seen["spine1"] if n.port != "swp1"]
    element = "leaf1:swp2--spine1:swp1"
    for oper, flapping, escalates in (({("leaf1", "swp2"): "down"}, (), False),
                                      ({("leaf1", "swp2"): "up", ("spine1", "swp1"): "up"}, [("leaf1", "swp2")], False),
                                      ({("leaf1", "swp2"): "up", ("spine1", "swp1"): "up"}, (), True),
                                      ({}, (), True)):  # state unknown: a cabling question
        snap.topology = build_topology(snap.fabric, seen, oper=oper, flapping=flapping)
        [finding] = run("cabling", snap).findings
        assert (finding.element, finding.evidence["check"], finding.escalates) == (element, "missing", escalates), \
            (oper, flapping, finding)


def test_cabling_without_polled_switches_is_not_enough_data():
    snap = clean_snapshot()
    snap.polled = set()
    res = run("cabling", snap)
    assert res.status == "no_data" and res.findings == [] and "polled" in res.reason


# --- mtu --------------------------------------------------------------------------------------------

def test_mtu_mismatch_across_a_cable_and_a_consistent_but_low_cable():
    snap = clean_snapshot()
    snap.samples[("spine2", "swp1")] = snap.samples[("spine2", "swp1")].model_copy(update={"mtu": 1500})
    for end in (("leaf2", "swp3"), ("spine2", "swp2")):  # both ends low: consistent, but below the fabric's
        snap.samples[end] = snap.samples[end].model_copy(update={"mtu": 1500})
    res = run("mtu", snap)
    assert brief(res) == [("leaf1:swp3--spine2:swp1", "link", "major"), ("leaf2:swp3--spine2:swp2", "link", "major")]
    by = {f.element: f for f in res.findings}
    assert by["leaf1:swp3--spine2:swp1"].evidence["mtu"] == {"leaf1:swp3": 9000, "spine2:swp1": 1500}
    assert "below the fabric's 9000" in by["leaf2:swp3--spine2:swp2"].message


def test_host_nic_mtu_and_speed_from_the_agents_judge_host_links_end_to_end():
    snap = clean_snapshot()
    res = run("mtu", snap)
    assert res.findings == [] and len(res.notes) == 1 and "host NIC" in res.notes[0]  # no agent data: said so
    hosts = [parse_end(e) for link in snap.topology.links for e in (link.a, link.b) if parse_end(e)[0].startswith("h")]
    assert hosts
    snap.host_nics = {e: {"mtu": 9000, "speed_bps": SPEED} for e in hosts}
    snap.host_nics[hosts[0]] = {"mtu": 1500, "speed_bps": SPEED // 4}
    res = run("mtu", snap)
    [f] = res.findings
    assert f.element_kind == "link" and f"{hosts[0][0]}:{hosts[0][1]}" in f.element and res.notes == []
    assert f.evidence["mtu"][f"{hosts[0][0]}:{hosts[0][1]}"] == 1500
    res = run("speed", snap)
    assert [g.element for g in res.findings] == [f.element] and res.checked == 4 + len(hosts)


def test_mtu_expected_value_overrides_the_common_one():
    res = run("mtu", clean_snapshot(), expected_mtu=9216)
    assert len(res.findings) == 6 and {f.evidence["fabric_mtu"] for f in res.findings} == {9216}


def test_mtu_without_samples_is_not_enough_data():
    snap = clean_snapshot()
    snap.samples = {}
    res = run("mtu", snap)
    assert res.status == "no_data" and res.findings == []


# --- speed ------------------------------------------------------------------------------------------

def test_speed_mismatch_and_duplex_noted():
    snap = clean_snapshot()
    snap.samples[("spine1", "swp2")] = snap.samples[("spine1", "swp2")].model_copy(update={"speed_bps": 10 * SPEED})
    res = run("speed", snap)
    assert brief(res) == [("leaf2:swp2--spine1:swp2", "link", "major")]
    assert res.checked == 4  # host links have one polled end
    assert any("duplex" in n for n in res.notes)


# --- errors -----------------------------------------------------------------------------------------

def test_errors_above_ber_threshold_name_the_link_and_receiving_port():
    snap = clean_snapshot()
    end = ("spine1", "swp1")
    snap.rates[end] = snap.rates[end].model_copy(update={"in_errors_ps": 0.5})  # 0.5 / 1e8 = 5e-9
    snap.rates[("leaf2", "swp1")] = snap.rates[("leaf2", "swp1")].model_copy(update={"in_errors_ps": 1e-5})  # 1e-13
    res = run("errors", snap)
    assert brief(res) == [("leaf1:swp2--spine1:swp1", "link", "major")]
    assert res.findings[0].evidence["port"] == "spine1:swp1"
    assert res.findings[0].evidence["ber"] == pytest.approx(5e-9)
    assert res.notes == ["probe loss per link unknown (correlator disabled)"]
    assert run("errors", snap, ber_threshold=1e-8).findings == []


def test_errors_probe_loss_with_clean_counters_is_silent_corruption():
    snap = clean_snapshot()
    snap.lossy_links = {"leaf1:swp2--spine1:swp1": {"loss_pct": 4.8, "sent": 1000, "lost": 48}}
    res = run("errors", snap)
    assert brief(res) == [("leaf1:swp2--spine1:swp1", "link", "major")]
    assert "4.8% across this link" in res.findings[0].message
    assert res.notes == []


def test_errors_without_rates_is_not_enough_data():
    snap = clean_snapshot()
    snap.rates = {}
    res = run("errors", snap)
    assert res.status == "no_data" and "two polls" in res.reason


# --- ECMP balance -----------------------------------------------------------------------------------

def _uplink_load(snap: Snapshot, leaf: str, utils: dict[str, float]) -> None:
    for port, u in utils.items():
        snap.rates[(leaf, port)] = snap.rates[(leaf, port)].model_copy(
            update={"out_bps": u * SPEED, "out_utilization": u})


def test_ecmp_skew_above_threshold_names_the_switch():
    snap = clean_snapshot()
    _uplink_load(snap, "leaf1", {"swp2": 0.6, "swp3": 0.2})  # skew 3
    _uplink_load(snap, "leaf2", {"swp2": 0.5, "swp3": 0.4})  # skew 1.25
    res = run("ecmp_balance", snap)
    assert brief(res) == [("leaf1", "device", "minor")]
    assert res.findings[0].evidence["out_utilization"] == {"swp2": 0.6, "swp3": 0.2}
    assert res.findings[0].evidence["skew"] == 3.0
    assert run("ecmp_balance", snap, skew_threshold=4).findings == []


def test_ecmp_idle_uplinks_are_not_judged():
    snap = clean_snapshot()
    _uplink_load(snap, "leaf1", {"swp2": 0.05, "swp3": 0.0})
    res = run("ecmp_balance", snap)
    assert res.findings == [] and res.status == "clean" and res.checked == 2
    assert res.notes == ["2 switch(es) below 10% utilization: balance not judged"]


# --- clock ------------------------------------------------------------------------------------------

def _solution(host, **kw) -> ClockSolution:
    return ClockSolution(host=host, window_start=kw.pop("window_start", T0 - 4 * 10**9),
                         **{"offset_ns": 1000.0, "drift_ppb": 5000.0, "bound_ns": 500.0, **kw})


def test_clock_health_bound_offset_drift_and_staleness():
    snap = clean_snapshot(hosts_per_leaf=2)
    snap.clock = [_solution("host1"), _solution("host2", bound_ns=50_000.0),
                  _solution("host3", offset_ns=-2_000_000.0, drift_ppb=150_000.0),
                  _solution("host4", window_start=T0 - 120 * 10**9)]
    res = run("clock", snap)
    assert brief(res) == [("host2", "host", "major"), ("host3", "host", "minor"), ("host4", "host", "minor")]
    by = {f.element: f.message for f in res.findings}
    assert by["host2"] == "error bound 50.0 us above 25 us"
    assert by["host3"] == "offset -2000 us from fabric time; drift 150.0 ppm"
    assert by["host4"] == "newest solution is 120 s old (sync stopped)"


def test_clock_disabled_or_without_solutions_is_not_enough_data():
    snap = clean_snapshot()
    assert run("clock", snap).status == "no_data"  # disabled (None)
    snap.clock = []
    res = run("clock", snap)
    assert res.status == "no_data" and "no host agent" in res.reason and res.findings == []


# --- config drift -----------------------------------------------------------------------------------

LEAF_CONFIG = """hostname {name}
interface swp1
 mtu 9000
 ip address {addr}/31
router bgp 65000
 bgp bestpath as-path multipath-relax
"""


def test_config_drift_against_the_role_majority():
    snap = clean_snapshot()
    snap.fabric = fabric(leaves=3)
    snap.configs = {f"leaf{i}": LEAF_CONFIG.format(name=f"leaf{i}", addr=f"10.0.0.{i}") for i in (1, 2, 3)}
    snap.configs["leaf3"] = snap.configs["leaf3"].replace("mtu 9000", "mtu 1500") + "ip route 0.0.0.0/0 10.9.9.9\n"
    snap.facts["leaf3"] = DeviceFacts(device="leaf3", ts=T0, sys_descr="Linux 6.1 lab")
    res = run("config_drift", snap)
    assert brief(res) == [("leaf3", "device", "minor")]
    ev = res.findings[0].evidence
    assert ev["missing"] == ["mtu 9000"] and ev["extra"] == ["ip route <addr> <addr>", "mtu 1500"]


def test_firmware_drift_from_device_facts():
    snap = clean_snapshot()
    snap.fabric = fabric(spines=3)
    for s in ("spine1", "spine2", "spine3"):
        snap.facts[s] = DeviceFacts(device=s, ts=T0, sys_descr="NOS 4.2")
    snap.facts["spine3"] = DeviceFacts(device="spine3", ts=T0, sys_descr="NOS 4.1")
    res = run("config_drift", snap)
    assert brief(res) == [("spine3", "device", "minor")]
    assert res.findings[0].evidence["role_majority"] == "NOS 4.2"
    for s in ("spine1", "spine2", "spine3"):  # a description naming the switch itself (net-snmp's default)
        snap.facts[s] = DeviceFacts(device=s, ts=T0, sys_descr=f"Linux {s} 6.1.0 #1 SMP x86_64")
    assert run("config_drift", snap).status == "clean"


def test_normalized_lines_mask_name_and_addresses():
    lines = normalized_lines("leaf1", "! comment\nhostname leaf1\n ip address 10.1.2.3/31\nmac aa:bb:cc:dd:ee:ff\n\n",
                             [])
    assert lines == {"hostname <self>", "ip address <addr>", "mac <addr>"}


def test_config_drift_without_facts_or_snapshots_is_not_enough_data():
    snap = clean_snapshot()
    snap.facts = {}
    res = run("config_drift", snap)
    assert res.status == "no_data" and res.findings == []


# --- probe coverage ---------------------------------------------------------------------------------

def test_probe_coverage_hosts_pairs_and_ecmp_paths():
    snap = clean_snapshot(hosts_per_leaf=2)  # host1, host2 on leaf1; host3, host4 on leaf2
    assert len(ecmp_paths(snap.topology, "host1", "host3")) == 2
    snap.probed = [ProbedPath("host1", "host3", "p1"), ProbedPath("host1", "host3", "p2"),  # both paths
                   ProbedPath("host3", "host2", "p3"),  # one of two
                   ProbedPath("host1", "host2", "p4")]  # same leaf: one path
    res = run("probe_coverage", snap)
    assert brief(res) == [("host2<>host3", "host_pair", "warning"), ("host4", "host", "minor")]
    assert {f.element: f.evidence for f in res.findings}["host2<>host3"] == {"paths_probed": 1, "ecmp_paths": 2}
    snap.probed.append(ProbedPath("host4", "host1", "p5"))  # host4 probes: its unprobed pairs show
    res = run("probe_coverage", snap)
    # unprobed pairs are counted per host: host2-host4 and host3-host4 are probed neither way
    assert brief(res) == [("host1<>host4", "host_pair", "warning"), ("host2", "host", "warning"),
                          ("host2<>host3", "host_pair", "warning"), ("host3", "host", "warning"),
                          ("host4", "host", "warning")]
    by = {f.element: f for f in res.findings}
    assert by["host4"].evidence == {"unprobed_peers": ["host2", "host3"], "unprobed_count": 2, "hosts": 4}
    assert by["host4"].message == "not probed with 2 of 3 other probing hosts (either way)"
    assert res.checked == 6


def test_probe_coverage_without_windows_is_not_enough_data():
    snap = clean_snapshot()
    snap.probed = []
    res = run("probe_coverage", snap)
    assert res.status == "no_data" and "no host agent" in res.reason and res.findings == []
