"""Correlator: each fault kind on a synthetic 2-spine / 3-leaf / 6-host fabric (tests/_fabric_synth.py)
gives the right kind on the right element (and direction), from real records."""

from __future__ import annotations

from _fabric_synth import NS, T0, Synth, undirected

from correlator.engine import Correlator
from nms.config.models import CorrelatorConfig, Thresholds
from nms.records import FabricTopology, PortSample, TopologyLink, TopologyNode


class Run:
    """A synthetic fabric feeding a correlator, one window per step."""

    def __init__(self, switch_every: int | None = None, warm: int = 15, **synth):
        self.s = Synth(**synth)
        self.c = Correlator(self.s.fabric, Thresholds(), CorrelatorConfig())
        self.c.add(self.s.inventory_records())
        self.t = T0
        self.switch_every = switch_every
        self.history: list[list] = []
        assert self.steps(warm) == [[] for _ in range(warm)], "warm-up must be clean"

    def steps(self, n: int) -> list[list]:
        out = []
        for _ in range(n):
            records = self.s.windows(self.t)
            if self.switch_every and (self.t - T0) % self.switch_every == 0:
                records += self.s.switch_records(self.t)
            self.c.add(records)
            findings = self.c.step((self.t + 1) * NS + NS // 10)
            keys = [(f.kind, f.element) for f in findings]
            assert len(keys) == len(set(keys)), "at most one finding per (kind, element)"
            out.append(findings)
            self.t += 1
        self.history += out
        return out


def kinds(findings) -> set[tuple[str, str]]:
    return {(f.kind, f.element) for f in findings}


def link_of(directed: str) -> str:
    return undirected(*directed.split("->"))


def test_link_down_localized_by_probes_within_2s():
    run = Run()  # no switch data at all: probes alone
    link = link_of(run.s.up_link(1, 1))
    run.s.down.add(link)  # lands mid-window (t + 0.5 s)
    # the agents hold the onset window back until they report its paths down (down_after after the
    # last reply: t + 1.4 s), so the first step that sees the window sees the events too
    steps = run.steps(1)
    assert kinds(steps[0]) == {("link_down", link)}
    f = steps[0][0]
    assert f.severity == "critical" and f.element_kind == "link" and f.confidence >= 0.9
    through = set(run.s.paths_through(run.s.up_link(1, 1)).tolist()) | set(
        run.s.paths_through(run.s.down_link(1, 1)).tolist())
    assert f.evidence["paths_down"] == f.evidence["paths_through"] == len(through)
    assert set(f.paths) == {"{}:{}>{}:{}/{}".format(*run.s.keys[i]) for i in through}
    assert all(kinds(s) == {("link_down", link)} for s in run.steps(5))


def test_link_down_confirmed_by_switch_ports():
    run = Run(switch_every=1)
    link = link_of(run.s.down_link(2, 3))
    run.s.down.add(link)
    last = run.steps(4)[-1]
    assert kinds(last) == {("link_down", link)}
    assert last[0].evidence["switch_confirms"] and last[0].confidence >= 0.95
    assert set(last[0].evidence["oper"].values()) == {"down"}


def test_failover_link_down_seen_by_switches_only():
    run = Run()
    link = link_of(run.s.up_link(2, 2))
    # failover: routes withdrawn, no probe path is lost; only the ports say the link is down
    run.c.add([PortSample(device=d, port=p, ts=run.t * NS, oper_status="down", mtu=9000)
               for d, p in (("leaf2", "swp4"), ("spine2", "swp2"))])
    last = run.steps(1)[-1]
    assert kinds(last) == {("link_down", link)}
    assert last[0].evidence["oper"] == {"leaf2:swp4": "down", "spine2:swp2": "down"}


def test_flapping_link():
    run = Run()
    link = link_of(run.s.up_link(2, 1))
    for _cycle in range(3):  # period 4 s, down 2 s
        run.s.down.add(link)
        run.steps(2)
        run.s.down.discard(link)
        run.steps(2)
    found = [kinds(s) for s in run.history[-12:]]
    assert ("link_flapping", link) in found[-1]
    assert all(k <= {("link_flapping", link), ("link_down", link)} for k in found)
    assert all(("link_down", link) not in k for k in found[-4:])


def test_nic_down():
    run = Run(switch_every=1)
    run.s.nic_down.add("host3")
    last = run.steps(3)[-1]
    assert kinds(last) == {("nic_down", "host3:eth0")}  # not also its access link
    f = last[0]
    assert f.element_kind == "nic" and f.evidence["switch_confirms"] and f.confidence >= 0.95
    # 1 path to its leaf mate + 2 paths (spines) to each of 4 others, both ways
    assert f.evidence["paths_down"] == f.evidence["paths_through"] == 18


def test_nic_down_from_probes_only():
    run = Run()
    run.s.nic_down.add("host5")
    last = run.steps(3)[-1]
    assert kinds(last) == {("nic_down", "host5:eth0")}
    assert last[0].confidence >= 0.9


def test_an_access_port_down_seen_by_the_switch_first_is_the_nic_down():
    """SNMP may see the leaf's host port go down before the probes time out (or after they recover):
    that evidence names the same element as the probes, the NIC, so both meet in one incident."""
    run = Run()
    run.c.add([PortSample(device="leaf3", port="swp1", ts=run.t * NS, oper_status="down", mtu=9000)])
    last = run.steps(1)[-1]
    assert kinds(last) == {("nic_down", "host5:eth0")}
    assert last[0].evidence["access_link"] == "host5:eth0--leaf3:swp1"


def test_switch_down():
    run = Run()
    for lf in (1, 2, 3):
        run.s.down.add(link_of(run.s.up_link(lf, 2)))
    last = run.steps(3)[-1]
    assert kinds(last) == {("device_down", "spine2")}
    assert last[0].element_kind == "device"


def test_leaf_down_is_the_leaf_not_its_nics():
    run = Run()
    for h in ("host3", "host4"):
        run.s.nic_down.add(h)
    for s in (1, 2):
        run.s.down.add(link_of(run.s.up_link(2, s)))
    last = run.steps(3)[-1]
    assert kinds(last) == {("device_down", "leaf2")}


def test_silent_loss_one_direction_within_5s():
    run = Run(switch_every=5)
    directed = run.s.up_link(2, 1)
    run.s.loss[directed] = 0.05
    found = [s for s in run.steps(5) if s]
    assert found, "5 % loss must be localized within 5 s"
    f = found[-1]
    assert kinds(f) == {("corrupting_link", link_of(directed))}
    assert f[0].direction == directed and f[0].severity == "major"
    assert f[0].evidence["loss"]["p_value"] < 1e-6 and f[0].evidence["rates"]["utilization"] < 0.5


def test_one_percent_loss_on_a_busier_fabric():
    run = Run(leaves=4, hosts_per_leaf=6, switch_every=5, warm=12)
    directed = run.s.down_link(1, 3)
    run.s.loss[directed] = 0.01
    steps = run.steps(5)
    assert any(("corrupting_link", link_of(directed)) in kinds(s) for s in steps)
    assert all(kinds(s) <= {("corrupting_link", link_of(directed))} for s in steps)
    assert [f.direction for f in steps[-1]] == [directed]


def test_new_loss_is_not_diluted_by_a_clean_past():
    """After a long clean run (a context full of clean windows), 1 % loss is found from the latest
    windows alone within 3 steps (a window shorter than the context); pooled over the whole context it
    would still read ~0.3 %."""
    run = Run(leaves=4, hosts_per_leaf=6, switch_every=5, warm=30)
    directed = run.s.down_link(2, 3)
    run.s.loss[directed] = 0.01
    found = [f for s in run.steps(3) for f in s if (f.kind, f.element) == ("corrupting_link", link_of(directed))]
    assert found and found[0].evidence["loss"]["over_s"] <= 5


def test_loss_that_stopped_is_not_reported_from_the_context():
    run = Run(switch_every=5)
    directed = run.s.up_link(2, 1)
    run.s.loss[directed] = 0.05
    assert any(kinds(s) == {("corrupting_link", link_of(directed))} for s in run.steps(6))
    run.s.loss.clear()  # repaired: its lossy windows stay in the 10 s context
    assert run.steps(4)[-1] == []


def test_a_nic_blip_is_not_a_lossy_link():
    """host2's NIC is down for half a second: its own agent reports its paths down and up at once
    (netlink), its peers only lose a few probes (too few for down_after): no corrupting link."""
    from nms.records import HostNicSample, PathEvent, ProbeWindow

    run = Run()
    t = run.t
    out = [HostNicSample(host="host2", nic="eth0", ts=t * NS + at, oper_status=state)  # netlink, pushed
           for state, at in (("down", 300_000_000), ("up", 800_000_000))]
    for r in run.s.windows(t):
        if isinstance(r, ProbeWindow) and "host2" in (r.src_host, r.dst_host):
            r = r.model_copy(update={"received": r.sent // 2})
            if r.src_host == "host2":
                for state, at in (("down", 300_000_000), ("up", 800_000_000)):
                    out.append(PathEvent(src_host="host2", src_nic=r.src_nic, dst_host=r.dst_host, dst_nic=r.dst_nic,
                                         path_id=r.path_id, ts=t * NS + at, state=state))
        out.append(r)
    run.c.add(out)
    findings = run.c.step((t + 1) * NS + NS // 10)
    run.t += 1
    findings += [f for s in run.steps(8) for f in s]
    assert not [f for f in findings if f.kind in ("corrupting_link", "congestion")]


def test_access_link_loss_is_the_access_link():
    run = Run()
    directed = run.s.access("host2")[1]  # leaf1 -> host2
    run.s.loss[directed] = 0.05
    last = run.steps(5)[-1]
    assert kinds(last) == {("corrupting_link", link_of(directed))}
    # every path of host2 crosses both directions of its access link: an exchange's loss cannot
    # tell them apart, so the link is certain and the direction is left open
    f = last[0]
    assert f.direction is None and set(f.evidence["directions"]) == {directed, run.s.access("host2")[0]}
    assert f.confidence >= 0.9


def test_an_access_link_and_a_fabric_link_lossy_in_one_window():
    # the access link's both-directions branch once overwrote the imbalance map and every later
    # element of the window crashed the step (seen in the lab under heavy congestion loss)
    run = Run(switch_every=1)
    access = run.s.access("host2")[1]
    fabric = run.s.up_link(3, 1)
    run.s.loss.update({access: 0.05, fabric: 0.04})
    run.s.util.update({fabric: 0.98, run.s.up_link(3, 2): 0.9})
    last = run.steps(5)[-1]
    assert kinds(last) == {("corrupting_link", link_of(access)), ("congestion", link_of(fabric))}


def test_host_nic_errors_give_an_access_link_its_direction():
    run = Run(switch_every=1)
    directed = run.s.access("host2")[1]  # leaf1 -> host2: the host's NIC counts the bad frames
    run.s.loss[directed] = 0.05
    run.s.errors_ps["host2:eth0"] = 12.0
    last = run.steps(5)[-1]
    assert kinds(last) == {("corrupting_link", link_of(directed))}
    f = last[0]
    assert f.direction == directed and f.evidence["direction_by"] == "error counters"
    assert f.evidence["rates"]["errors_ps"] == 12.0 and "corruption" in f.summary


def test_utilization_gives_a_congested_access_link_its_direction():
    run = Run(switch_every=1)
    directed = run.s.access("host2")[1]  # leaf1 -> host2: the switch port towards the host is busy
    run.s.queue_us[directed] = 400
    run.s.util[directed] = 0.97
    last = run.steps(4)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    f = last[0]
    assert f.direction == directed and f.evidence["direction_by"] == "utilization", f.evidence
    assert f.evidence["rates"]["utilization"] >= 0.9 and directed in f.summary


def test_corrupting_link_with_error_counters():
    run = Run(switch_every=1)
    directed = run.s.down_link(1, 2)  # spine1 -> leaf2, errors counted at leaf2's input
    run.s.loss[directed] = 0.03
    run.s.errors_ps[directed.split("->")[1]] = 12.0
    last = run.steps(5)[-1]
    assert kinds(last) == {("corrupting_link", link_of(directed))}
    assert last[0].evidence["rates"]["errors_ps"] > 0 and last[0].direction == directed


def test_congestion_delay_in_one_direction():
    run = Run(switch_every=2)
    directed = run.s.down_link(2, 1)
    run.s.queue_us[directed] = 400
    run.s.util[directed] = 0.97
    last = run.steps(4)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    f = last[0]
    assert f.direction == directed and f.severity == "minor"
    assert f.evidence["delay"]["inflation_us"] > 300 and f.evidence["rates"]["utilization"] >= 0.9


def test_congestion_under_clock_drift_without_switch_data():
    # 40 ppm drift and ms offsets: raw one-way delays move 40 us/s; the round trip does not
    run = Run(warm=30, drift_ppm=40, clock_offset_us=20_000)
    directed = run.s.up_link(3, 2)
    run.s.queue_us[directed] = 150
    last = run.steps(4)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    assert last[0].direction == directed


def test_loss_with_high_utilization_is_congestion():
    run = Run(switch_every=1)
    directed = run.s.up_link(3, 1)
    run.s.loss[directed] = 0.04
    run.s.util.update({directed: 0.98, run.s.up_link(3, 2): 0.9})  # both uplinks busy: not an imbalance
    last = run.steps(5)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    assert last[0].direction == directed and "loss" in last[0].evidence


def test_path_imbalance():
    run = Run(switch_every=1)
    hot, cold = run.s.up_link(2, 1), run.s.up_link(2, 2)
    run.s.util.update({hot: 0.96, cold: 0.15})
    run.s.queue_us[hot] = 200
    last = run.steps(4)[-1]
    assert kinds(last) == {("path_imbalance", link_of(hot))}
    f = last[0]
    assert f.direction == hot and f.evidence["imbalance"]["ratio"] >= 2
    assert f.evidence["imbalance"]["uplinks"] == {hot: 0.96, cold: 0.15}


def test_a_busy_uplink_that_does_not_inflate_is_no_imbalance_and_a_slow_one_is_congestion():
    """The lab's congestion shape: load pinned onto one spine (its leaf uplink ~96 % busy, the other
    idle) feeding a rate-cut link further on. The busy uplink delays nothing: no path_imbalance; the
    slow link, whose utilization vs ifSpeed is low, is congestion."""
    run = Run(switch_every=1)
    busy, idle = run.s.up_link(2, 1), run.s.up_link(2, 2)
    slow = run.s.up_link(1, 1)  # leaf1 <-> spine1
    run.s.util.update({busy: 0.96, idle: 0.005})
    slow_down = next(d for d in (slow, "->".join(reversed(slow.split("->")))) if d.startswith("spine1"))
    run.s.util[slow_down] = 0.1
    run.s.queue_us[slow_down] = 20000
    last = run.steps(4)[-1]
    assert kinds(last) == {("congestion", link_of(slow))}


def test_mtu_mismatch():
    run = Run(switch_every=1)
    run.s.mtu["spine1:swp2"] = 1500  # big frames leaf2 -> spine1 dropped; probes are small
    last = run.steps(2)[-1]
    link = link_of(run.s.up_link(2, 1))
    assert kinds(last) == {("mtu_mismatch", link)}
    assert last[0].direction == "leaf2:swp3->spine1:swp2" and last[0].severity == "warning"
    assert last[0].evidence["mtu"] == {"leaf2:swp3": 9000, "spine1:swp2": 1500}


def test_miscabling_from_topology():
    run = Run()
    links = [TopologyLink(a=a, b=b, check="ok", state="up") for a, b in
             (link.split("--") for link in run.s.links)]
    links.append(TopologyLink(a="leaf3:swp9", b="spine1:swp9", check="miscabled", state="up",
                              expected="leaf3:swp9 should connect to spine2:swp9"))
    nodes = [TopologyNode(name=n, kind="switch", configured=True) for n in ("spine1", "spine2", "leaf1", "leaf2",
                                                                              "leaf3")]
    run.c.set_topology(FabricTopology(nodes=nodes, links=links, generated_ns=run.t * NS))
    last = run.steps(1)[-1]
    assert kinds(last) == {("miscabling", "leaf3:swp9--spine1:swp9")}
    assert "spine2:swp9" in last[0].summary
    assert run.steps(5)[-1] and all(f.kind == "miscabling" for f in run.history[-1])


def test_loss_one_way_and_delay_the_other_on_one_link_is_congestion_only():
    """A congested queue in the lab: the loss cover puts the drops on one direction, the round-trip
    inflation cover the delay on the other. One link, one kind: congestion, never also a
    corrupting_link (the incident of the link would flip between the two every window)."""
    run = Run()
    lossy = run.s.down_link(2, 1)
    run.s.loss[lossy] = 0.04
    run.s.queue_us[run.s.up_link(1, 2)] = 400
    steps = run.steps(5)
    assert all(kind == "congestion" for s in steps[2:] for kind, _ in kinds(s)), [kinds(s) for s in steps]
    assert kinds(steps[-1]) == {("congestion", link_of(lossy))}
    assert steps[-1][0].direction == lossy  # drops say which way; the round trip cannot


def test_the_windows_a_link_dies_in_are_no_loss_before_their_down_events_arrive():
    """The service may step between an agent's windows (half lost: the cut landed mid-window) and
    the down events of the same report: that step opens nothing; the next one finds link_down."""
    from nms.records import PathEvent
    run = Run()
    directed = run.s.down_link(1, 2)
    run.s.down.add(link_of(directed))
    records = run.s.windows(run.t)
    run.c.add([r for r in records if not isinstance(r, PathEvent)])
    assert run.c.step((run.t + 1) * NS + NS // 10) == []
    run.c.add([r for r in records if isinstance(r, PathEvent)])
    run.t += 1
    assert ("link_down", link_of(directed)) in kinds(run.steps(1)[0])


def test_heavy_loss_that_lasts_is_found():
    """Nine in ten exchanges through a link lost, second after second: loss (the guard against the
    window a link died in holds one step only)."""
    run = Run()
    directed = run.s.up_link(1, 1)
    run.s.loss[directed] = 0.9
    steps = run.steps(3)
    assert link_of(directed) in {element for _, element in kinds(steps[-1])}, [kinds(s) for s in steps]
