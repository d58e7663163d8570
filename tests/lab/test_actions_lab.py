"""The whole act loop on the real lab: a congestion fault on a leaf-spine link with a
job's traffic through it; the correlator opens the incident, the action engine steers the job's
flows off the link through the agents (signed `steer` commands, the agents' port maps), the flows
move and their goodput recovers; with actions in dry run (plain ECMP) nothing moves and the job
stays congested. After the heal the action is rolled back and the flows return to their own
source ports. A flapping link is drained (gNMI Set on its leaf's uplink; the kernel's routes avoid
it both ways) and restored once it has stayed clean. The harness is lab/control_trials.py
(bench/traffic_control.py measures the congestion loop over many trials with it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lab_helpers import skip_reason

from lab import control_trials as tc
from lab import faults, paths
from lab.agent_procs import agents_dir
from lab.jobtraffic import steered_ports

pytestmark = pytest.mark.root
PREFIX, MGMT = "nmsx-", "198.18.240.0/24"
PROBE_DPORT = 34567  # paths.udp_probe's port (the agents hold 33434)


@pytest.fixture(scope="module")
def loop():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    mesh = tc.new_lab(PREFIX, MGMT, gnmi_interval="2s")  # gNMI: the drain's southbound
    try:
        mesh.up()
        mesh.wait_traced(120)
        tc.wait_mapped(mesh)
        flows = tc.job_flows(mesh.topo)
        job = tc.start_job(mesh, flows, duration=900)
        try:
            yield mesh, job, flows
        finally:
            job.stop()
    finally:
        mesh.down()


def test_with_actions_the_job_leaves_the_congested_link_and_recovers_without_it_stays(loop):
    mesh, job, flows = loop
    via = tc.via_cut(mesh.topo, flows)
    assert len(via) == 4  # host1 and host2 each send two of their four flows over leaf1 -> spine1
    offered = sum(f.rate_bps for f in flows)

    # --- dry run: the planner proposes, nothing is sent: plain ECMP ----------------------------------
    tc.set_dry_run(mesh, True)  # (a rerun finds the first attempt's service acting)
    assert tc.settle(mesh, job, flows), "the lab is not quiet"
    ecmp = tc.trial(mesh, job, flows, "ecmp")
    assert ecmp.incident is not None and ecmp.incident["kind"] in ("congestion", "corrupting_link"), ecmp.incident
    element = tc.link_element(mesh.topo.find_link(tc.LINK))
    # (a proposal of a short-lived second incident, e.g. the cut's downstream link in the fault's
    # first window, is withdrawn when it resolves: dry run and rejected; nothing is ever sent)
    proposed = [a for a in ecmp.actions if a["kind"] == "host_reroute" and a["element"] == element]
    assert proposed and all(a["state"] == "proposed" for a in proposed), ecmp.actions
    assert all(a["dry_run"] and a["state"] in ("proposed", "rejected") for a in ecmp.actions), ecmp.actions
    assert ecmp.moved_s == {}
    assert all(steered_ports(agents_dir(mesh.dir) / h / "steering.json") == {} for h in tc.SOURCES)
    assert sum(ecmp.per_flow[i] for i in via) < 0.3 * len(via) * tc.RATE, ecmp.per_flow  # 32 Mbit/s into 6
    assert ecmp.aggregate_bps < 0.7 * offered, ecmp

    # --- actions on (a restart with dry_run off): the flows move and recover ------------------------
    assert tc.settle(mesh, job, flows)
    tc.set_dry_run(mesh, False)
    assert tc.settle(mesh, job, flows), "the lab is not quiet after the restart"
    control = tc.trial(mesh, job, flows, "control")
    assert set(control.moved_s) == via, (control.moved_s, [(a["kind"], a["state"], a.get("result"), a.get("after"))
                                                           for a in control.actions], job.moves()[-12:])
    [reroute] = [a for a in control.actions if a["kind"] == "host_reroute" and a["element"] == element]
    assert reroute["state"] == "applied" and not reroute["dry_run"], reroute
    assert set(tc.SOURCES) <= set(reroute["targets"])
    topo = mesh.topo
    addr_of = {topo.host_port(h).ip: h for h in ("host3", "host4")}
    for src in tc.SOURCES:  # what the agents kept, and the kernel agrees: every kept port avoids spine1
        steered = steered_ports(agents_dir(mesh.dir) / src / "steering.json")
        result = reroute["after"]["hosts"][src]["result"]["dsts"]
        for addr, dst in addr_of.items():
            assert steered[addr] and result[dst]["candidates"] == 16 and 0 < result[dst]["kept"] < 16, result
            assert _spines(topo, src, dst, steered[addr]) == {"spine2"}, (src, dst, steered[addr])
            # the service placed the movers' flows itself (planned routes, the poller's port loads) and
            # the agent kept a traced port on each route
            planned = reroute["params"]["routes"][src][dst]
            assert 0 < result[dst]["planned"] == len(planned) == len(steered[addr]), (planned, result[dst])
    assert all(control.per_flow[f.id] > 0.85 * f.rate_bps for f in flows), control.per_flow
    assert control.aggregate_bps > 1.3 * ecmp.aggregate_bps
    events = [e["event"] for e in mesh.api("GET", f"/actions/{reroute['id']}/events").json()]
    assert events == ["proposed", "approved", "applied"], events
    print(f"\nact loop: incident after {control.detected_s:.2f} s; flows moved after "
          f"{sorted(round(s, 2) for s in control.moved_s.values())} s; aggregate goodput "
          f"{ecmp.aggregate_bps / 1e6:.1f} (dry run) -> {control.aggregate_bps / 1e6:.1f} Mbit/s (acting) "
          f"of {offered / 1e6:.0f} offered")

    # --- healed: the action is rolled back after the hold, the flows go home --------------------------
    assert tc.settle(mesh, job, flows), "not rolled back"
    done = mesh.api("GET", f"/actions/{reroute['id']}").json()
    assert done["state"] == "rolled_back" and "resolved and stayed clean" in done["result"], done
    assert all(steered_ports(agents_dir(mesh.dir) / h / "steering.json") == {} for h in tc.SOURCES)


def _spines(topo, src: str, dst: str, sports) -> set[str]:
    return {paths.predict(topo, src, dst, "udp", sp, 4791)["spine"] for sp in sports}


def test_a_flapping_link_is_drained_both_ways_and_restored_once_clean(loop):
    mesh, job, flows = loop
    topo = mesh.topo
    sports = range(45000, 45032)
    assert _spines(topo, "host1", "host3", sports) == _spines(topo, "host5", "host1", sports) == {"spine1", "spine2"}
    # drains on their own; flaps counted over 15 s, so the link is clean 15 s after its last flap
    tc.reconfigure(mesh, {"actions": {"dry_run": False, "policies": {"drain_link": {"policy": "auto"}}},
                          "thresholds": {"flap_window": "15s"}})
    assert tc.settle(mesh, job, flows), "the lab is not quiet after the restart"
    element = tc.link_element(topo.find_link(tc.LINK))
    start = time.time_ns()
    fault = faults.inject(mesh.dir, "flap", tc.LINK, period=3.0, down_for=1.5, count=0)
    drain = None
    try:
        try:
            drain = tc.wait_for(lambda: next((a for a in mesh.api("GET", "/actions", params={"kind": "drain_link"})
                                              .json() if a["element"] == element and a["created_ns"] > start
                                              and a["state"] in ("applied", "failed")), None), 40, 0.5)
            assert drain and drain["state"] == "applied", drain
            drained_after = (drain["applied_ns"] - start) / 1e9
            # the incident opens as link_down at the first down and is called flapping from the second episode
            # on (a drain answers only flapping or corrupting links); at a given moment it may read either
            events = mesh.api("GET", f"/incidents/{drain['incident_id']}/events").json()
            # the kernel forwarding: leaf1 sends nothing up to spine1, and nobody reaches leaf1 through it
            up = tc.wait_for(lambda: _spines(topo, "host1", "host3", sports) == {"spine2"}, 5)
            down = _spines(topo, "host5", "host1", sports)
        finally:
            faults.heal(mesh.dir, fault["id"])
            healed = time.time_ns()
        assert "link_flapping" in [e["incident"]["kind"] for e in events], events
        assert drain["targets"] == ["leaf1"] and drain["before"]["ports"] == {
            f"leaf1:{topo.find_link(tc.LINK).a.name}": {"weight": 1}}, drain
        assert up and down == {"spine2"}, down
        assert _spines(topo, "host3", "host5", sports) == {"spine1", "spine2"}  # the rest of the fabric untouched
        restored = tc.wait_for(lambda: (a := mesh.api("GET", f"/actions/{drain['id']}").json())["state"] ==
                               "rolled_back" and a, 90, 1.0)
        assert restored and "resolved and stayed clean" in restored["result"], restored
        both = {"spine1", "spine2"}
        assert _spines(topo, "host1", "host3", sports) == _spines(topo, "host5", "host1", sports) == both
    finally:  # a failure must not leave the uplink drained for the module's next tests
        if drain and mesh.api("GET", f"/actions/{drain['id']}").json()["state"] == "applied":
            mesh.api("POST", f"/actions/{drain['id']}/rollback")
    print(f"\nflap: drained {drained_after:.1f} s after the first flap; restored "
          f"{(restored['reverted_ns'] - healed) / 1e9:.1f} s after the heal (flaps counted over 15 s, then "
          f"5 clean windows and the 5 s hold)")


# -- switch side: gNMI Set through the collector's session, against the lab's targets -------------
def _setter_and_switches(mesh):
    from collectors.gnmi.collector import GnmiCollector
    from collectors.gnmi.setter import GnmiSetter
    from nms.config import load_config
    config = load_config(mesh.dir.config)
    return GnmiSetter(GnmiCollector()), {s.name: s for s in config.fabric.switches}


def test_gnmi_set_drains_an_uplink_and_the_kernel_forwarding_follows(loop):
    import asyncio
    mesh = loop[0]
    topo = mesh.topo
    setter, switches = _setter_and_switches(mesh)
    leaf1 = switches["leaf1"]
    link = topo.find_link("leaf1-spine1")
    uplink = link.a.name
    spine_rx = Path(f"/sys/class/net/{link.b.name}/statistics/rx_packets")
    # above the kernel's ephemeral range (32768-60999): no agent or iperf3 socket holds them
    sports = range(61000, 61064)
    assert _spines(topo, "host1", "host3", sports) == {"spine1", "spine2"}

    async def run():
        try:
            return await drain_and_check()
        finally:  # a failure midway leaves no drained uplink behind for the rerun or the next test
            await setter.set_weight(leaf1, uplink, 1)

    async def drain_and_check():
        assert await setter.weight(leaf1, uplink) == 1
        await setter.set_weight(leaf1, uplink, 0)
        drained = await setter.weight(leaf1, uplink)
        used = _spines(topo, "host1", "host3", sports)
        # the kernel's own routes: no flow hashes onto the drained uplink, and it really carries none
        # (spine1's counter of the port facing leaf1 stays put while 8 x 100 datagrams arrive)
        before = _ns_read(topo, "spine1", spine_rx)
        got = paths.udp_probe(topo, "host1", "host3", list(sports)[:8], dport=PROBE_DPORT, count=100)
        crossed = int(_ns_read(topo, "spine1", spine_rx)) - int(before)
        # a failover elsewhere and its heal recompute the routes: the drain must survive them
        fault = faults.inject(mesh.dir, "link-down", "leaf2-spine2", mode="failover")
        faults.heal(mesh.dir, fault["id"])
        survived = _spines(topo, "host1", "host3", sports)
        await setter.set_weight(leaf1, uplink, 1)  # revert
        restored = _spines(topo, "host1", "host3", sports)
        with pytest.raises(Exception, match="FAILED_PRECONDITION"):  # never drain the last uplink
            await setter.set_weight(leaf1, uplink, 0)
            await setter.set_weight(leaf1, topo.find_link("leaf1-spine2").a.name, 0)
        await setter.set_weight(leaf1, uplink, 1)
        with pytest.raises(Exception, match="INVALID_ARGUMENT"):
            await setter.set_weight(leaf1, uplink, 999)
        with pytest.raises(Exception, match="NOT_FOUND"):
            await setter.set_weight(leaf1, "swp99", 0)
        return drained, used, got, crossed, survived, restored

    drained, used, got, crossed, survived, restored = asyncio.run(run())
    assert drained == 0
    assert used == {"spine2"}
    assert sum(got.values()) >= 0.95 * 800, got
    assert crossed < 40, crossed  # LLDP and the like only, not the 800 datagrams
    assert survived == {"spine2"}
    assert restored == {"spine1", "spine2"}


def test_gnmi_set_isolates_a_port_and_brings_it_back(loop):
    import asyncio
    mesh = loop[0]
    topo = mesh.topo
    setter, switches = _setter_and_switches(mesh)
    spine2 = switches["spine2"]
    port = topo.find_link("leaf2-spine2").end("spine2").name
    oper = Path(f"/sys/class/net/{port}/operstate")
    sports = range(62000, 62064)

    async def run():
        assert await setter.enabled(spine2, port) is True
        await setter.set_enabled(spine2, port, False)
        down = await setter.enabled(spine2, port)
        state = _ns_read(topo, "spine2", oper)
        await setter.set_enabled(spine2, port, True)
        time.sleep(0.5)
        return down, state, await setter.enabled(spine2, port), _ns_read(topo, "spine2", oper)

    down, state, up, state_after = asyncio.run(run())
    assert (down, state) == (False, "down")
    assert (up, state_after) == (True, "up")
    # the spine's route to leaf2 came back with the port: traffic through spine2 flows again
    assert "spine2" in _spines(topo, "host1", "host3", sports)
    got = paths.udp_probe(topo, "host1", "host3", [paths.sport_via(topo, "host1", "host3", "spine2", "udp", PROBE_DPORT,
                                                                   63000)], dport=PROBE_DPORT, count=20)
    assert all(n > 0 for n in got.values()), got


def _ns_read(topo, node: str, path: Path) -> str:
    import subprocess
    return subprocess.run(["ip", "netns", "exec", topo.netns(node), "cat", str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()
