"""Correlator: partial blackholes (correlator/partial.py) on the synthetic fabric of tests/_fabric_synth.py,
through the real correlator: some flows through a link die entirely while the others pass; found
on the right element and direction with the dying and living flows as evidence, and never claimed
for uniform loss, a link that dies, or a healthy fabric."""

from __future__ import annotations

from _fabric_synth import NS, T0, Synth
from test_correlator_faults import Run, kinds, link_of

from nms.records import ProbePath


def dead_paths(run: Run, directed: str) -> set[str]:
    dead = run.s.blackholed()
    return {"{}:{}>{}:{}/{}".format(*run.s.keys[i]) for i in run.s.paths_through(directed) if dead[i]}


def first_step(history, want) -> int | None:
    return next((n for n, s in enumerate(history) if want in kinds(s)), None)


def test_half_the_flows_through_a_spine_downlink_die():
    run = Run(switch_every=5)
    directed = run.s.down_link(1, 2)  # spine1 -> leaf2
    link = link_of(directed)
    run.s.blackhole[directed] = 0.5
    steps = run.steps(8)
    found = first_step(steps, ("partial_blackhole", link))
    # the deaths land mid-window n, are declared down in n+1; flows through the link answer in n+2
    # (after the deaths, with a second of margin): that window's step, 3 s after the onset
    assert found is not None and found <= 3, [kinds(s) for s in steps]
    assert all(kinds(s) <= {("partial_blackhole", link)} for s in steps), [kinds(s) for s in steps]
    assert all(kinds(s) == {("partial_blackhole", link)} for s in steps[found:])
    f = steps[-1][0]
    assert f.direction == directed and f.element_kind == "link" and f.severity == "major"
    ev = f.evidence
    want = dead_paths(run, directed)
    assert len(want) >= 2 and set(f.paths) == want
    assert ev["flows_dead"] == len(want) and {d["path"] for d in ev["dead"]} == want
    assert ev["flows_live"] >= 1 and not want & {d["path"] for d in ev["live"]}
    assert all(d["sport"] in ev["sports_dead"][d["path"].split(">")[0]] for d in ev["dead"])
    # which leg dies through the link: the probe (its source and port hash under the fraction) or the reply
    assert {d["leg"] for d in ev["dead"]} <= {"fwd", "rev"} and "alternatives" not in ev
    assert 0 < ev["dead_pct"] < 100 and ev["dead_for_s"] >= 2 and f.confidence >= 0.7


def test_a_leaf_uplink_blackhole_has_its_direction():
    run = Run()
    directed = run.s.up_link(3, 2)  # leaf3 -> spine2
    run.s.blackhole[directed] = 0.5
    last = run.steps(6)[-1]
    assert kinds(last) == {("partial_blackhole", link_of(directed))}
    assert last[0].direction == directed


def test_a_switch_dropping_flows_on_every_port_is_the_switch():
    run = Run(leaves=4)
    for leaf in range(1, 5):
        run.s.blackhole[run.s.down_link(2, leaf)] = 0.5
    last = run.steps(6)[-1]
    assert kinds(last) == {("partial_blackhole", "spine2")}
    f = last[0]
    assert f.element_kind == "device" and len(f.evidence["links"]) >= 2
    assert all("spine2:" in d for d in f.evidence["links"])


def test_heal_ends_it_and_nothing_else_is_claimed():
    run = Run()
    directed = run.s.down_link(2, 1)
    run.s.blackhole[directed] = 0.5
    assert ("partial_blackhole", link_of(directed)) in kinds(run.steps(6)[-1])
    run.s.blackhole.clear()
    after = run.steps(4)
    assert all(s == [] for s in after[1:]), [kinds(s) for s in after]


def test_retraced_dying_flows_keep_their_place():
    """A retrace of a dying flow goes silent after the drop (`leaf,spine,*,*...`, no reverse trace)
    and so gets a new path id that never answers: it is placed by the whole trace its source port
    had before, and the finding stays on the link."""
    run = Run()
    directed = run.s.down_link(1, 3)
    link = link_of(directed)
    run.s.blackhole[directed] = 0.5
    assert kinds(run.steps(6)[-1]) == {("partial_blackhole", link)}
    dead = run.s.blackholed()
    spine_port = run.s.addr["spine1:swp1"]
    moved = []
    for i in run.s.paths_through(directed):
        hops = run.s.hops[i][0].split(",")
        if dead[i] and run.s.did[directed] in run.s.fwd[i] and spine_port in hops:
            src, sn, dst, dn, pid = run.s.keys[i]
            run.s.keys[i] = key = (src, sn, dst, dn, f"retraced{i}")
            cut = ",".join(hops[:hops.index(spine_port) + 1] + ["*"] * 6)
            run.c.add([ProbePath(src_host=src, src_nic=sn, dst_host=dst, dst_nic=dn, path_id=key[4], ts=run.t * NS,
                                 src_addr="192.0.2.10", dst_addr="192.0.2.11", dport=7000, sports=str(run.s.sport[i]),
                                 probed_sport=run.s.sport[i], fwd_hops=cut, rev_hops="", fwd_complete=False,
                                 rev_complete=False)])
            moved.append("{}:{}>{}:{}/{}".format(*key))
    assert len(moved) >= 2
    steps = run.steps(4)
    assert all(kinds(s) == {("partial_blackhole", link)} for s in steps), [kinds(s) for s in steps]
    assert set(moved) <= set(steps[-1][0].paths)


def test_dead_flows_with_no_whole_trace_blame_nothing():
    """Without traces (only the access links known) a flow that dies says nothing of where."""
    from correlator.engine import Correlator
    from nms.config.models import CorrelatorConfig, Thresholds

    s = Synth()
    c = Correlator(s.fabric, Thresholds(), CorrelatorConfig())
    c.add(s.inventory_records(with_paths=False))
    for t in range(T0, T0 + 25):
        if t == T0 + 15:
            s.blackhole[s.down_link(1, 2)] = 0.5
        c.add(s.windows(t))
        assert c.step((t + 1) * NS) == []


def test_uniform_loss_is_still_a_corrupting_link():
    run = Run()
    directed = run.s.down_link(1, 2)
    run.s.loss[directed] = 0.3  # every flow loses 30 %: whole windows go silent now and then
    steps = run.steps(20)
    assert all(("partial_blackhole", link_of(directed)) not in kinds(s) for s in steps)
    assert all(f.kind != "partial_blackhole" for s in steps for f in s)
    assert ("corrupting_link", link_of(directed)) in kinds(steps[-1])


def test_a_link_down_is_still_link_down_while_one_agent_reports_late():
    """One agent's reports arrive 2 s late: meanwhile its paths through the dead link still look up,
    so no down element explains the others' dead paths, and flows from other leaves keep passing
    through the spine downlink those dead paths also cross. That is not a partial blackhole: the
    dead link itself passes nothing after the deaths."""
    run = Run()
    link = link_of(run.s.down_link(2, 3))  # leaf3 -- spine2
    late: list[list] = [[], []]
    steps = []
    for n in range(8):
        if n == 1:
            run.s.down.add(link)
        records = run.s.windows(run.t)
        late.append([r for r in records if r.src_host == "host1"])
        run.c.add([r for r in records if r.src_host != "host1"] + late.pop(0))
        steps.append(run.c.step((run.t + 1) * NS + NS // 10))
        run.t += 1
    assert all(f.kind != "partial_blackhole" for s in steps for f in s), [kinds(s) for s in steps]
    assert kinds(steps[-1]) == {("link_down", link)}


def test_a_healthy_noisy_fabric_has_no_partial_blackhole():
    """Background loss of 0.02 % on every link and jitter: nothing. (0.2 % everywhere is no longer
    healthy: the sequential loss test finds a link losing 2x the 0.1 % baseline cap within a minute.)"""
    run = Run(seed=4, switch_every=5, background_loss=2e-4, jitter_us=15)
    assert all(s == [] for s in run.steps(60))


def test_data_reaching_the_service_late_changes_nothing():
    """The service's clock runs 6 s ahead of the windows it has (a loaded host, a slow ingest):
    freshness is judged against the newest data, so the live flows still clear every element and the
    dead ones are still a partial blackhole, not a switch down."""
    run = Run()
    directed = run.s.down_link(1, 2)
    run.s.blackhole[directed] = 0.5
    steps = []
    for _ in range(6):
        run.c.add(run.s.windows(run.t))
        steps.append(run.c.step((run.t + 7) * NS + NS // 10))
        run.t += 1
    assert all(kinds(s) <= {("partial_blackhole", link_of(directed))} for s in steps), [kinds(s) for s in steps]
    assert kinds(steps[-1]) == {("partial_blackhole", link_of(directed))}


def test_links_the_same_dead_flows_cross_wait_then_are_alternatives():
    """With two leaves every flow through spine1 -> leaf2 also crosses leaf1 -- spine1: the dead
    flows cannot tell the two links apart. No finding until SETTLE_S after the deaths (more flows
    could still separate them, and the live counts behind the share settle), then one finding that
    lists the other link as its alternative, at a lower confidence."""
    from correlator.partial import SETTLE_S

    run = Run(leaves=2)
    directed = run.s.down_link(1, 2)  # spine1 -> leaf2
    run.s.blackhole[directed] = 0.5
    steps = run.steps(8)
    found = first_step(steps, ("partial_blackhole", link_of(directed))) or first_step(
        steps, ("partial_blackhole", link_of(run.s.up_link(1, 1))))
    # onset mid-window 0: a lone link is found by window 3 (the first test); these wait till SETTLE_S
    assert found is not None and found >= SETTLE_S > 3, [kinds(s) for s in steps]
    assert all(s == [] for s in steps[:found]), [kinds(s) for s in steps]
    f = steps[-1][0]
    links = {link_of(directed), link_of(run.s.up_link(1, 1))}
    assert f.kind == "partial_blackhole" and f.element in links
    other = (links - {f.element}).pop()
    assert {"--".join(sorted(a.split("->"))) for a in f.evidence["alternatives"]} == {other}
    assert f.confidence < 0.5


def _spine_ports_down(records: list, spine: str) -> list:
    """The switch poll with every port of `spine`, and the leaf port facing it, reporting down."""
    out = []
    for r in records:
        if r.__class__.__name__ == "PortSample" and (r.device == spine or r.port == f"swp{4 + int(spine[-1])}"):
            r = r.model_copy(update={"oper_status": "down"})
        out.append(r)
    return out


def test_a_dead_switch_whose_flows_fail_over_is_one_device_down():
    """The lab's dead spine with routing failing over: every port of it says down, yet half the flows
    whose traces cross it answer (they were rehashed through the other spine and are not traced
    again yet). Not a partial blackhole in the switch, nor four link_downs: one device_down."""
    run = Run(leaves=4)
    for leaf in range(1, 5):
        run.s.blackhole[run.s.down_link(2, leaf)] = 0.5
    steps = []
    for _ in range(6):
        records = run.s.windows(run.t) + _spine_ports_down(run.s.switch_records(run.t), "spine2")
        run.c.add(records)
        steps.append(run.c.step((run.t + 1) * NS + NS // 10))
        run.t += 1
    assert all(kinds(s) == {("device_down", "spine2")} for s in steps), [kinds(s) for s in steps]
    f = steps[-1][0]
    assert f.evidence["links_down"] == 4 and f.evidence["switch_confirms"] is True
    assert {f"link:{link_of(run.s.down_link(2, leaf))}" for leaf in range(1, 5)} <= set(f.explains)


def test_a_healed_link_the_topology_has_not_seen_yet_is_not_down():
    """LLDP sees a healed link seconds after its ports: both ends up is up, whatever the topology says."""
    from correlator.evidence import SwitchView
    from nms.config.models import Thresholds
    from nms.records import FabricTopology, TopologyLink

    run = Run(switch_every=1)
    link = link_of(run.s.down_link(1, 2))
    a, b = link.split("--")
    run.c.set_topology(FabricTopology(generated_ns=run.t * NS, nodes=[],
                                      links=[TopologyLink(a=a, b=b, check="ok", state="down")]))
    steps = run.steps(3)
    assert all(s == [] for s in steps), [kinds(s) for s in steps]
    view = SwitchView(run.c.ctx, run.c.index, Thresholds())
    assert not view.link_down(run.c.index.by_end[tuple(a.split(":"))])


def test_a_dead_switch_coming_back_keeps_its_still_down_links():
    """Its links' far ends are polled one switch at a time: while some still say down after others
    came back, they are the switch's (one incident), not new link_downs, and flows dying through it
    as routes return are not a partial blackhole; a link still down RECOVERY_S later is its own."""
    from correlator.classify import RECOVERY_S

    run = Run(leaves=4)
    spine_links = {link_of(run.s.down_link(2, leaf)) for leaf in range(1, 5)}
    late = link_of(run.s.down_link(2, 4))
    steps = []
    for n in range(3 + RECOVERY_S + 4):
        if n == 0:
            run.s.down |= spine_links
        if n == 3:  # back: the probes pass, but leaf4's poll still says its spine2 port is down
            run.s.down -= spine_links
            for leaf in range(1, 5):  # and for a few seconds some flows rehashed onto it die (routes return)
                run.s.blackhole[run.s.down_link(2, leaf)] = 0.5
        if n == 8:
            run.s.blackhole.clear()
        records = run.s.windows(run.t) + run.s.switch_records(run.t)
        if n >= 3:
            records = [r.model_copy(update={"oper_status": "down"}) if r.__class__.__name__ == "PortSample"
                       and f"{r.device}:{r.port}" in late.split("--") and r.device == "leaf4" else r
                       for r in records]
        run.c.add(records)
        steps.append(run.c.step((run.t + 1) * NS + NS // 10))
        run.t += 1
    assert kinds(steps[2]) == {("device_down", "spine2")}, [kinds(s) for s in steps]
    assert all(("device_down", "spine2") in kinds(s) for s in steps[3:3 + RECOVERY_S]), [kinds(s) for s in steps]
    assert all(("link_down", late) not in kinds(s) for s in steps[:3 + RECOVERY_S]), [kinds(s) for s in steps]
    assert all(f.kind != "partial_blackhole" for s in steps for f in s), [kinds(s) for s in steps]
    assert ("link_down", late) in kinds(steps[-1]), [kinds(s) for s in steps]
