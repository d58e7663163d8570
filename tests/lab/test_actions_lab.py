"""The whole act loop on the real lab (issue #13): a congestion fault on a leaf-spine link with a
job's traffic through it; the correlator opens the incident, the action engine steers the job's
flows off the link through the agents (signed `steer` commands, the agents' port maps), the flows
move and their goodput recovers; with actions in dry run (plain ECMP) nothing moves and the job
stays congested. After the heal the action is rolled back and the flows return to their own
source ports. A flapping link is drained (gNMI Set on its leaf's uplink; the kernel's routes avoid
it both ways) and restored once it has stayed clean. The harness is bench/traffic_control.py
(which also measures the congestion loop over many trials).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from lab_helpers import skip_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import traffic_control as tc  # noqa: E402

from nms.lab.agents import agents_dir  # noqa: E402
from nms.lab import faults, paths  # noqa: E402
from nms.lab.jobtraffic import steered_ports  # noqa: E402

pytestmark = pytest.mark.root
PREFIX, MGMT = "nmsx-", "198.18.240.0/24"


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
    assert tc.settle(mesh, job, flows), "the lab is not quiet"
    ecmp = tc.trial(mesh, job, flows, "ecmp")
    assert ecmp.incident is not None and ecmp.incident["kind"] in ("congestion", "corrupting_link"), ecmp.incident
    proposed = [a for a in ecmp.actions if a["kind"] == "host_reroute"]
    assert proposed and all(a["dry_run"] and a["state"] == "proposed" for a in proposed), ecmp.actions
    assert ecmp.moved_s == {}
    assert not any((agents_dir(mesh.dir) / h / "steering.json").exists() for h in tc.SOURCES)
    assert sum(ecmp.per_flow[i] for i in via) < 0.3 * len(via) * tc.RATE, ecmp.per_flow  # 32 Mbit/s into 6
    assert ecmp.aggregate_bps < 0.7 * offered, ecmp

    # --- actions on (a restart with dry_run off): the flows move and recover ------------------------
    assert tc.settle(mesh, job, flows)
    tc.set_dry_run(mesh, False)
    assert tc.settle(mesh, job, flows), "the lab is not quiet after the restart"
    control = tc.trial(mesh, job, flows, "control")
    assert set(control.moved_s) == via, (control.moved_s, [(a["kind"], a["state"], a.get("result"), a.get("after"))
                                                           for a in control.actions], job.moves()[-12:])
    [reroute] = [a for a in control.actions if a["kind"] == "host_reroute"]
    assert reroute["state"] == "applied" and not reroute["dry_run"], reroute
    assert set(tc.SOURCES) <= set(reroute["targets"])
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
    try:
        drain = tc.wait_for(lambda: next((a for a in mesh.api("GET", "/actions", params={"kind": "drain_link"}).json()
                                          if a["element"] == element and a["created_ns"] > start
                                          and a["state"] in ("applied", "failed")), None), 40, 0.5)
        assert drain and drain["state"] == "applied", drain
        drained_after = (drain["applied_ns"] - start) / 1e9
        inc = mesh.api("GET", f"/incidents/{drain['incident_id']}").json()
        # the kernel forwarding: leaf1 sends nothing up to spine1, and nobody reaches leaf1 through it
        up = tc.wait_for(lambda: _spines(topo, "host1", "host3", sports) == {"spine2"}, 5)
        down = _spines(topo, "host5", "host1", sports)
    finally:
        faults.heal(mesh.dir, fault["id"])
        healed = time.time_ns()
    assert inc["kind"] == "link_flapping", inc
    assert drain["targets"] == ["leaf1"] and drain["before"]["ports"] == {f"leaf1:{topo.find_link(tc.LINK).a.name}":
                                                                          {"weight": 1}}, drain
    assert up and down == {"spine2"}, down
    assert _spines(topo, "host3", "host5", sports) == {"spine1", "spine2"}  # the rest of the fabric untouched
    restored = tc.wait_for(lambda: (a := mesh.api("GET", f"/actions/{drain['id']}").json())["state"] == "rolled_back"
                           and a, 90, 1.0)
    assert restored and "resolved and stayed clean" in restored["result"], restored
    assert _spines(topo, "host1", "host3", sports) == _spines(topo, "host5", "host1", sports) == {"spine1", "spine2"}
    print(f"\nflap: drained {drained_after:.1f} s after the first flap; restored "
          f"{(restored['reverted_ns'] - healed) / 1e9:.1f} s after the heal (flaps counted over 15 s, then "
          f"5 clean windows and the 5 s hold)")
