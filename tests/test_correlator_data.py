"""Correlator: precision on a clean noisy fabric, ambiguity, job impact, bad or partial data,
concurrency, and the shape of its findings."""

from __future__ import annotations

import json
import threading

import pytest
from _fabric_synth import NS, T0, Synth, undirected
from test_correlator_faults import Run, kinds, link_of

from correlator.engine import Correlator
from nms.config.models import CorrelatorConfig, Thresholds
from nms.records import InterfaceAddress, Job, LinkEvent, PathEvent, ProbePath, ProbeWindow


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_fabric_with_background_noise_gives_no_findings(seed):
    # stray losses at 5x the usual background, 15 us jitter, ms clock offsets drifting 50 ppm
    run = Run(seed=seed, switch_every=5, background_loss=1e-3, jitter_us=15, drift_ppm=50)
    assert all(s == [] for s in run.steps(150))


def test_clean_busier_fabric_gives_no_findings():
    run = Run(leaves=4, hosts_per_leaf=6, switch_every=5, background_loss=5e-4, warm=5)
    assert all(s == [] for s in run.steps(40))


def test_two_leaves_link_or_spine_is_ambiguous_without_switch_data():
    # with two leaves every path through spine1 crosses both of its links: spine1, leaf1-spine1 and
    # leaf2-spine1 explain the same paths
    run = Run(leaves=2, hosts_per_leaf=2)
    link = link_of(run.s.up_link(1, 1))
    run.s.down.add(link)
    last = run.steps(3)[-1]
    assert len(last) == 1
    f = last[0]
    assert f.kind == "device_down" and f.element == "spine1" and f.confidence < 0.5
    assert set(f.evidence["alternatives"]) == {link, link_of(run.s.up_link(2, 1))}


def test_two_leaves_switch_evidence_breaks_the_tie():
    run = Run(leaves=2, hosts_per_leaf=2, switch_every=1)
    link = link_of(run.s.up_link(1, 1))
    run.s.down.add(link)
    last = run.steps(3)[-1]
    assert kinds(last) == {("link_down", link)}
    assert last[0].confidence >= 0.95 and last[0].evidence["switch_confirms"]


def _job(id_, hosts, start=T0 * NS, end=None):
    return Job(id=id_, hosts=hosts, start=start, end=end)


def test_jobs_crossing_the_element_are_attached():
    run = Run()
    link = link_of(run.s.up_link(1, 1))  # host1, host2 on leaf1
    jobs = [_job("across", ["host1", "host5"]),  # leaf1 <-> leaf3: some of its paths use spine1
            _job("same-leaf", ["host1", "host2"]),  # never leaves leaf1
            _job("elsewhere", ["host3", "host6"]),  # leaf2 <-> leaf3
            _job("ended", ["host2", "host4"], end=T0 * NS + 1),
            _job("later", ["host2", "host4"], start=(T0 + 10_000) * NS)]
    run.s.down.add(link)
    run.steps(1)
    run.c.add(run.s.windows(run.t))
    (f,) = run.c.step((run.t + 1) * NS + NS // 10, jobs)
    assert f.kind == "link_down" and f.jobs == ["across"]


def test_nic_down_attaches_every_job_of_the_host():
    run = Run()
    run.s.nic_down.add("host2")
    run.steps(2)
    run.c.add(run.s.windows(run.t))
    jobs = [_job("a", ["host2", "host1"]), _job("b", ["host2"]), _job("c", ["host3", "host4"])]
    (f,) = run.c.step((run.t + 1) * NS + NS // 10, jobs)
    assert f.kind == "nic_down" and f.jobs == ["a", "b"]


def test_paths_without_probe_paths_use_access_links_only():
    s = Synth()
    c = Correlator(s.fabric, Thresholds(), CorrelatorConfig())
    c.add(s.inventory_records(with_paths=False))  # addresses, but no ProbePath at all
    for t in range(T0, T0 + 15):
        c.add(s.windows(t))
        assert c.step((t + 1) * NS) == []
    s.down.add(link_of(s.up_link(1, 1)))  # a spine link: invisible without hops
    out = []
    for t in range(T0 + 15, T0 + 20):
        c.add(s.windows(t))
        out += c.step((t + 1) * NS)
    assert out == []  # access links and NICs are cleared by their paths on spine2; nothing invented
    s.down.clear()
    s.nic_down.add("host4")  # ... but what the inventory knows is still localized
    for t in range(T0 + 20, T0 + 23):
        c.add(s.windows(t))
        last = c.step((t + 1) * NS)
    assert kinds(last) == {("nic_down", "host4:eth0")}


def test_unknown_hosts_addresses_and_garbage_do_not_crash_or_invent():
    run = Run()
    known = {e for link in run.s.links for e in link.split("--")} | set(run.s.hosts)
    bogus = []
    for i in range(4):  # a host that is not in the inventory, and paths through unknown routers
        key = dict(src_host="ghost", src_nic="eth9", dst_host="host1", dst_nic="eth0", path_id=f"g{i}")
        bogus.append(ProbePath(**key, ts=run.t * NS, src_addr="192.0.2.99", dst_addr="192.0.2.1", dport=1,
                               sports="1", fwd_hops="*,203.0.113.7,not-an-ip", rev_hops="", fwd_complete=False,
                               rev_complete=False))
        bogus.append(PathEvent(**key, ts=run.t * NS, state="down"))
    bogus.append(InterfaceAddress(device="stranger", port="x1", ts=run.t * NS, address="203.0.113.7"))
    bogus += [object(), None, "text", 42]
    run.c.add(bogus)
    for t in range(run.t, run.t + 8):
        run.c.add([ProbeWindow(src_host="ghost", src_nic="eth9", dst_host="host1", dst_nic="eth0",
                               path_id=f"g{i}", window_start=t * NS, sent=10, received=0) for i in range(4)])
        run.c.add([ProbeWindow(src_host="host1", src_nic="eth0", dst_host="host2", dst_nic="eth0",
                               path_id="late", window_start=(t - 30) * NS, sent=10, received=3)])
        run.steps(1)
    for f in (f for s in run.history for f in s):
        ends = f.element.split("--") if f.element_kind == "link" else [f.element]
        assert all(e in known or e.split(":")[0] in known for e in ends), f
        assert "stranger" not in f.element and "ghost" not in f.element
    assert all(s == [] for s in run.history[-8:])  # ghost's paths: only host1's NIC, cleared by its up paths


def test_add_is_safe_while_step_runs():
    run = Run(warm=3)
    errors = []

    def feeder():
        try:
            for t in range(run.t, run.t + 30):
                run.c.add(run.s.windows(t))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=feeder)
    thread.start()
    while thread.is_alive():
        run.c.step(run.t * NS)
    thread.join()
    assert not errors
    run.c.step((run.t + 31) * NS)


def test_findings_are_json_and_well_formed():
    run = Run(switch_every=1)
    run.s.loss[run.s.up_link(3, 2)] = 0.05
    run.s.down.add(link_of(run.s.up_link(1, 1)))
    run.s.mtu["leaf2:swp3"] = 1500
    last = run.steps(5)[-1]
    assert {f.kind for f in last} == {"corrupting_link", "link_down", "mtu_mismatch"}
    for f in last:
        json.dumps(f.model_dump())
        assert f.ts == run.t * NS + NS // 10 and 0 < f.confidence <= 1 and f.summary
        if f.element_kind == "link":
            a, b = f.element.split("--")
            assert a < b and f.element == undirected(a, b)


def test_flapping_reported_by_switches():
    from nms.records import LinkEvent

    run = Run()
    link = link_of(run.s.up_link(3, 1))
    run.c.add([LinkEvent(device="leaf3", port="swp3", ts=run.t * NS, state="up", previous="down", transitions=2,
                         flaps_in_window=9, flapping=True)])
    last = run.steps(1)[-1]
    assert kinds(last) == {("link_flapping", link)}
    assert last[0].evidence["switch_flaps"] == 9 and last[0].severity == "major"


def test_host_nic_counter_rates_survive_a_driver_reload():
    from correlator.evidence import SwitchView
    from nms.records import HostNicSample

    s = Synth()
    c = Correlator(s.fabric, Thresholds(), CorrelatorConfig())
    sample = lambda ts, errors: HostNicSample(host="host1", nic="eth0", ts=ts, rx_errors=errors)  # noqa: E731
    c.add([sample(T0 * NS, 500), sample((T0 + 2) * NS, 520)])
    c.step((T0 + 3) * NS)
    view = SwitchView(c.ctx, c.index, Thresholds())
    assert view.nic_rates(("host1", "eth0"), "rx") == {"errors_ps": 10.0}
    c.add([sample((T0 + 4) * NS, 3)])  # the counters restarted from zero: no rate, not a huge one
    c.step((T0 + 5) * NS)
    assert view.nic_rates(("host1", "eth0"), "rx") == {}
    c.add([sample((T0 + 3) * NS, 999)])  # an older sample arriving late changes nothing
    c.step((T0 + 5) * NS)
    assert c.ctx.nic_samples[("host1", "eth0")].rx_errors == 3


def test_records_that_come_late_are_kept_in_time_order_and_pruned_by_their_age():
    """A correlate member that takes a partition re-reads the streams (docs/cluster.md) and hands
    older records after newer ones. A path's down event of 50 s ago behind one of now counted as a
    second down episode in the context (the cluster lab's takeover named a link down `link_flapping`);
    a link event of 60 s ago behind a new one was the end's latest and never pruned."""
    from correlator.context import Context

    ctx = Context(CorrelatorConfig(), Thresholds(flap_window="60s"))
    key = dict(src_host="host1", src_nic="eth0", dst_host="host2", dst_nic="eth0", path_id="p0")
    now = 1_000 * NS
    event = LinkEvent(device="leaf1", port="swp3", ts=now, state="down", previous="up", transitions=1)
    ctx.add([PathEvent(**key, ts=now, state="down"), event])
    ctx.ingest(ctx.take())
    ctx.add([PathEvent(**key, ts=now - 50 * NS, state="down"),  # re-read, older
             event.model_copy(update={"ts": now - 70 * NS, "flapping": True})])
    ctx.ingest(ctx.take())
    assert [e.ts for e in ctx.link_events[("leaf1", "swp3")]] == [now - 70 * NS, now]
    ctx.prune(now + NS)
    assert [ts for ts, _ in ctx.down_events] == [now]
    assert [e.ts for e in ctx.link_events[("leaf1", "swp3")]] == [now]
