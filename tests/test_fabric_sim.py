"""The flow-level fabric simulator (lab/flowsim/): max-min fairness, the fat tree, ECMP,
faults, the optimum and the controller built on correlator/actions/steering.py."""

from __future__ import annotations

import numpy as np
import pytest

from correlator.actions.steering import Limits
from lab.flowsim.control import PORT_BASE, PORT_SPAN, Controller, Job, evaluate
from lab.flowsim.fabric import FatTree, five_tuple_hash
from lab.flowsim.maxmin import completion_time, maxmin_rates
from lab.flowsim.optimum import concurrent_upper_bound, optimum, whole_subflow_upper_bound

# --- max-min fairness: textbook answers ------------------------------------------------------


def test_maxmin_bertsekas_gallager_example():
    # links A (cap 1) and B (cap 1) in a line: flow 0 crosses both, flow 1 only A, flows 2, 3 only B
    paths = np.array([[0, 1], [0, -1], [1, -1], [1, -1]])
    assert np.allclose(maxmin_rates(paths, np.array([1.0, 1.0])), [1 / 3, 2 / 3, 1 / 3, 1 / 3])


def test_maxmin_second_level_takes_the_leftover():
    # link 0 (cap 1) shared by flows 0, 1; link 1 (cap 2) by flows 0 (frozen at 0.5) and 2
    paths = np.array([[0, 1], [0, -1], [1, -1]])
    assert np.allclose(maxmin_rates(paths, np.array([1.0, 2.0])), [0.5, 0.5, 1.5])


def test_maxmin_demands_and_dead_links():
    paths = np.array([[0], [0], [0], [1]])
    rates = maxmin_rates(paths, np.array([10.0, 0.0]), demand=np.array([1.0, 2.0, np.inf, 5.0]))
    assert np.allclose(rates, [1.0, 2.0, 7.0, 0.0])


def test_completion_time_refills_as_flows_finish():
    # two flows share a unit link, one also crosses a 0.25 link: 0.25 and 0.75 until the fast one
    # finishes (t = 4/3), then the slow one stays at 0.25 (its own bottleneck): t = 4
    paths = np.array([[0, 1], [0, -1]])
    t, finish = completion_time(paths, np.array([1.0, 0.25]), size=1.0)
    assert finish[1] == pytest.approx(4 / 3) and t == pytest.approx(4.0)
    t, _ = completion_time(np.array([[0], [0]]), np.array([1.0]), size=1.0)
    assert t == pytest.approx(2.0)


# --- the fat tree and ECMP ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [4, 8, 36])
def test_fat_tree_sizes(k):
    ft = FatTree(k)
    assert ft.hosts == k ** 3 // 4
    assert ft.n_links == 6 * ft.hosts and len(ft.names) == 3 * ft.hosts  # 3 tiers x 2 directions
    assert len(set(ft.names)) == 3 * ft.hosts
    if k == 36:
        assert ft.hosts == 11_664


def test_ecmp_covers_every_equal_cost_path_and_no_other():
    ft = FatTree(8)
    ports = np.arange(PORT_BASE, PORT_BASE + 4000)
    for src, dst, expected in ((0, 1, 1), (0, 5, 4), (0, 100, 16)):
        a, c = ft.route(np.full(ports.size, src), np.full(ports.size, dst), ports)
        assert len(set(zip(a.tolist(), c.tolist()))) == expected == ft.ecmp_path_count(src, dst)
        links = ft.path_links(np.full(ports.size, src), np.full(ports.size, dst), a, c)
        hops = (links >= 0).sum(axis=1)
        assert set(hops.tolist()) == {2 if expected == 1 else 4 if expected == 4 else 6}


def test_ecmp_hash_is_deterministic_salted_and_spread():
    src, dst = np.arange(10_000) % 128, (np.arange(10_000) * 7 + 1) % 128
    sport = PORT_BASE + np.arange(10_000) % PORT_SPAN
    h1 = five_tuple_hash(src, dst, sport, 3)
    assert np.array_equal(h1, five_tuple_hash(src, dst, sport, 3))
    assert not np.array_equal(h1 % 16, five_tuple_hash(src, dst, sport, 4) % 16)  # per-switch salt
    counts = np.bincount((h1 % 16).astype(int), minlength=16)
    assert counts.min() > 0.8 * 10_000 / 16 and counts.max() < 1.2 * 10_000 / 16
    ft = FatTree(8)
    a1, c1 = ft.route(src, dst, sport)
    a2, c2 = FatTree(8).route(src, dst, sport)
    assert np.array_equal(a1, a2) and np.array_equal(c1, c2)


def test_failed_links_carry_nothing_and_routing_goes_around():
    ft = FatTree(8)
    rng = np.random.default_rng(0)
    dead = rng.choice(np.arange(ft.hosts, 3 * ft.hosts), 20, replace=False)
    ft.fail(dead)
    src = rng.integers(0, ft.hosts, 20_000)
    dst = (src + rng.integers(1, ft.hosts, src.size)) % ft.hosts
    job = Job(src, dst, PORT_BASE + rng.integers(0, PORT_SPAN, src.size))
    out = evaluate(ft, job, ft.available())
    up, down = ft.directions(dead)
    assert not np.isin(out.paths, np.concatenate([up, down])).any()
    carried = np.bincount(out.paths[out.paths >= 0], weights=np.repeat(out.rates, 6)[out.paths.ravel() >= 0],
                          minlength=ft.n_links)
    assert carried[up].sum() == 0 and carried[down].sum() == 0 and (out.rates > 0).all()


def test_an_edge_cut_off_from_every_plane_has_no_path():
    ft = FatTree(4)
    ft.fail([ft.hosts + int(ft.edge_agg(0, a)) for a in range(2)])  # edge 0 loses both uplinks
    a, _ = ft.route(np.array([0]), np.array([10]), np.array([PORT_BASE]))
    assert a[0] == -2
    with pytest.raises(ValueError, match="no path left"):
        evaluate(ft, Job(np.array([0]), np.array([10]), np.array([PORT_BASE])), ft.available())


# --- the optimum ---------------------------------------------------------------------------------


def _ring(ft, rng, qps=1):
    order = rng.permutation(ft.hosts)
    src, dst = np.repeat(order, qps), np.repeat(np.roll(order, -1), qps)
    return src, dst


def test_optimum_on_a_healthy_fat_tree_is_line_rate():
    ft = FatTree(4)
    src, dst = _ring(ft, np.random.default_rng(1), qps=2)
    opt = optimum(ft, src, dst, ft.available())
    assert opt.max_concurrent == pytest.approx(200.0)  # two subflows share a 400G NIC
    assert opt.max_throughput == pytest.approx(400.0 * ft.hosts)
    assert concurrent_upper_bound(ft, src, dst, ft.available()) == pytest.approx(200.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cut_bound_bounds_the_lp_and_is_tight_for_one_fault(seed):
    rng = np.random.default_rng(seed)
    ft = FatTree(6)
    src, dst = _ring(ft, rng)
    ft.fail(rng.choice(np.arange(ft.hosts, 3 * ft.hosts), 1))
    background = np.zeros(ft.n_links)
    background[rng.choice(np.arange(2 * ft.hosts, 6 * ft.hosts), 3)] = 300.0
    avail = ft.available(background)
    lp = optimum(ft, src, dst, avail).max_concurrent
    assert concurrent_upper_bound(ft, src, dst, avail) >= lp - 1e-6
    ft2 = FatTree(6)
    ft2.fail(rng.choice(np.arange(ft2.hosts, 3 * ft2.hosts), 1))
    assert concurrent_upper_bound(ft2, src, dst, ft2.available()) == pytest.approx(
        optimum(ft2, src, dst, ft2.available()).max_concurrent)


def test_ecmp_and_controller_never_beat_the_optimum():
    rng = np.random.default_rng(4)
    ft = FatTree(6)
    src, dst = _ring(ft, rng, qps=2)
    job = Job(src, dst, PORT_BASE + rng.integers(0, PORT_SPAN, src.size))
    avail = ft.available()
    lp = optimum(ft, src, dst, avail)
    ecmp = evaluate(ft, job, avail)
    ctl = Controller(ft, job, avail).run(job).outcome
    for out in (ecmp, ctl):
        assert out.min_rate <= lp.max_concurrent + 1e-6 and out.aggregate <= lp.max_throughput + 1e-6


# --- the controller --------------------------------------------------------------------------------


def _hotspot_case(k=8, seed=3):
    rng = np.random.default_rng(seed)
    ft = FatTree(k)
    active = rng.choice(ft.hosts, ft.hosts // 2, replace=False)
    src, dst = np.repeat(active, 4), np.repeat(np.roll(active, -1), 4)
    job = Job(src, dst, PORT_BASE + rng.integers(0, PORT_SPAN, src.size))
    background = np.zeros(ft.n_links)
    hot = rng.choice(np.arange(2 * ft.hosts, 6 * ft.hosts), ft.hosts // 25, replace=False)
    background[hot] = 0.75 * ft.capacity[hot]
    return ft, job, background, ft.available(background)


def test_controller_beats_ecmp_on_a_hot_spot():
    ft, job, background, avail = _hotspot_case()
    ecmp = evaluate(ft, job, avail)
    res = Controller(ft, job, avail, background=background).run(job)
    assert res.rounds and res.rounds[0].hot > 0
    assert res.outcome.min_rate >= 2 * ecmp.min_rate
    assert res.outcome.aggregate > ecmp.aggregate
    # the job was only re-steered: same subflows, ports from the candidates, still ECMP-routable
    assert np.array_equal(res.job.src, job.src) and (res.job.port >= PORT_BASE).all()


@pytest.mark.parametrize("fraction,min_paths", [(0.5, 1), (0.25, 1), (1.0, 8)])
def test_controller_respects_the_blast_radius(fraction, min_paths):
    ft, job, background, avail = _hotspot_case()
    ctl = Controller(ft, job, avail, background=background, limits=Limits(fraction, min_paths), max_rounds=1)
    bad = ctl.detect(evaluate(ft, job, avail))
    from correlator.actions.steering import allowed_avoid
    accepted, refused = allowed_avoid(bad, ctl.groups, Limits(fraction, min_paths))
    assert accepted and refused  # the limits bite in this case
    avoid = set(accepted)
    for paths in ctl.groups.values():
        left = sum(1 for p in paths if not (p & avoid))
        assert left >= min_paths and len(paths) - left <= fraction * len(paths)
    # and every subflow moved in the round took a path that avoids all of them
    res = ctl.run(job)
    moved = res.job.port != job.port
    assert moved.any()
    after = evaluate(ft, res.job, avail) if not res.rounds[0].rolled_back else None
    if after is not None:
        names = ft.names
        for f in np.flatnonzero(moved):
            hops = after.paths[f][after.paths[f] >= 0]
            assert not {names[u] for u in ft.undirected(hops).tolist()} & avoid


def test_controller_on_a_clean_fabric_at_low_load_does_nothing():
    ft = FatTree(8)
    src, dst = np.arange(0, 128, 8), np.arange(4, 128, 8)  # one flow per edge: nothing collides
    job = Job(src, dst, np.full(src.size, PORT_BASE))
    res = Controller(ft, job, ft.available()).run(job)
    assert res.rounds == [] and np.array_equal(res.job.port, job.port)


@pytest.mark.parametrize("kind,seed", [("hotspots", 1), ("hotspots", 2), ("hotspots", 3), ("failures", 1),
                                       ("failures", 3)])
def test_controller_reaches_the_lp_optimum_on_a_small_tree(kind, seed):
    # half the GPUs of a k=8 tree in a ring, 4 QPs per pair: ECMP gets 20-57 % of lambda*; the
    # load-aware rebalance reaches it (not always: with failures, seed 2 stops at 2/3 of it)
    if kind == "hotspots":
        ft, job, background, avail = _hotspot_case(8, seed)
    else:
        rng = np.random.default_rng(seed)
        ft, background = FatTree(8), None
        active = rng.choice(ft.hosts, ft.hosts // 2, replace=False)
        src, dst = np.repeat(active, 4), np.repeat(np.roll(active, -1), 4)
        job = Job(src, dst, PORT_BASE + rng.integers(0, PORT_SPAN, src.size))
        ft.fail(rng.choice(np.arange(ft.hosts, 3 * ft.hosts), 3, replace=False))
        avail = ft.available()
    lam = optimum(ft, job.src, job.dst, avail).max_concurrent
    assert evaluate(ft, job, avail).min_rate < 0.6 * lam
    res = Controller(ft, job, avail, background=background).run(job)
    assert res.outcome.min_rate == pytest.approx(lam)
    assert not any(r.rolled_back for r in res.rounds)


def test_rebalanced_subflows_only_leave_links_over_capacity():
    ft, job, background, avail = _hotspot_case()
    ctl = Controller(ft, job, avail, background=background, max_rounds=1)
    before = evaluate(ft, job, avail)
    pressure = ctl._pressure(before)
    res = ctl.run(job)
    moved = np.flatnonzero(res.job.port != job.port)
    assert moved.size
    for f in moved:  # every moved subflow was on a directed link offered more than it carries
        hops = before.paths[f][before.paths[f] >= 0]
        assert pressure[hops].max() > 1.0
    # and far fewer move than cross the hot links: a hot link is relieved, not emptied
    hot = np.flatnonzero(pressure[2 * ft.hosts:] > 1.0) + 2 * ft.hosts
    crossing = np.isin(before.paths, hot).any(axis=1).sum()
    assert moved.size < crossing



# --- full load: every GPU of the tree in the ring (issue #26) -----------------------------------


def test_whole_subflows_cannot_reach_the_fluid_bound_where_a_cut_does_not_divide():
    # k=6: an edge's 3 hosts each send one subflow out; with one of its 3 uplinks down the fluid
    # optimum splits 3 x 266.7 over 2 links, but whole subflows put 2 on one link: 200 each
    ft = FatTree(6)
    src, dst = np.arange(3), np.arange(3) + 30  # edge 0 -> other pods
    ft.fail([ft.hosts + int(ft.edge_agg(0, 0))])
    avail = ft.available()
    assert concurrent_upper_bound(ft, src, dst, avail) == pytest.approx(800 / 3)
    assert whole_subflow_upper_bound(ft, src, dst, avail) == pytest.approx(200.0)
    # and it is a bound: no choice of ports does better (every port to every pair, 3 subflows)
    best = 0.0
    ports = PORT_BASE + np.arange(64)
    for p0 in ports[:8]:
        for p1 in ports[:8]:
            for p2 in ports[:8]:
                job = Job(src, dst, np.array([p0, p1, p2]))
                best = max(best, evaluate(ft, job, avail).min_rate)
    assert best == pytest.approx(200.0)


def test_whole_subflow_bound_equals_the_fluid_bound_on_a_healthy_tree():
    ft = FatTree(8)
    src, dst = _ring(ft, np.random.default_rng(1), qps=4)
    assert whole_subflow_upper_bound(ft, src, dst, ft.available()) == pytest.approx(100.0)


def _full_load(kind, seed, k=8):
    from bench.fabric_sim import fault, ring_job
    rng = np.random.default_rng(seed)
    ft = FatTree(k, seed=seed)
    job = ring_job(ft, 1.0, 4, rng)
    background = fault(ft, kind, rng)
    avail = ft.available(background)
    return ft, job, background, avail


@pytest.mark.parametrize("seed", [1, 2])
def test_full_load_ratios_the_controller_reaches(seed):
    # k=8, every GPU in the ring, 4 QPs per pair (bench/fabric_sim.py --k 8 --load 1.0): ECMP gets
    # 0.18-0.53 of the bound; the controller 0.8 clean (one link with 5 subflows of 4 left: only a
    # perfect packing reaches 1.0), the whole-subflow bound with failures, 0.6 with hot spots
    floor = {"none": 0.8, "failures": 0.88, "hotspots": 0.6}
    for kind in ("none", "failures", "hotspots"):
        ft, job, background, avail = _full_load(kind, seed)
        bound = concurrent_upper_bound(ft, job.src, job.dst, avail)
        whole = whole_subflow_upper_bound(ft, job.src, job.dst, avail)
        ecmp = evaluate(ft, job, avail).min_rate
        res = Controller(ft, job, avail, background=background).run(job)
        assert res.outcome.min_rate >= floor[kind] * bound - 1e-6, kind
        assert res.outcome.min_rate >= 1.6 * ecmp, kind
        assert res.outcome.min_rate <= whole + 1e-6  # the whole-subflow bound holds
        if kind == "failures":
            assert res.outcome.min_rate == pytest.approx(whole)


def test_at_full_load_the_limits_cost_nothing_draining_every_hot_link_does():
    # without the blast-radius limits every hot link is avoided: at full load that takes most paths
    # away and the controller ends lower (0.57 vs 0.80 of the bound, k=8 seed 1)
    ft, job, background, avail = _full_load("none", 1)
    with_limits = Controller(ft, job, avail).run(job)
    without = Controller(ft, job, avail, limits=None).run(job)
    assert without.refusals == {} and with_limits.refusals
    assert with_limits.outcome.min_rate > without.outcome.min_rate


def test_load_aware_moves_relieve_links_the_limits_refused():
    # a subflow on a link over capacity may move whether or not the limits let the link be avoided
    # (relieving takes no path away); no move lands on an avoided link
    ft, job, background, avail = _full_load("none", 1)
    ctl = Controller(ft, job, avail, max_rounds=1)
    before = evaluate(ft, job, avail)
    bad = ctl.detect(before)
    from correlator.actions.steering import allowed_avoid
    accepted, refused = allowed_avoid(bad, ctl._groups_touching(bad), Limits())
    res = ctl.run(job)
    moved = np.flatnonzero(res.job.port != job.port)
    names = ft.names
    left = [{names[u] for u in ft.undirected(before.paths[f][2:][before.paths[f][2:] >= 0]).tolist()} for f in moved]
    assert any(not (links & set(accepted)) and links & set(refused) for links in left)


def test_the_agents_stripe_moves_whole_pairs_off_the_avoided_links():
    # what the host agents do with hop_loads: every pair with a subflow on an avoided link gets all
    # its subflows re-placed (a steer replaces a pair's ports), none onto an avoided link, and the
    # pairs' subflows spread: no pair keeps all of its 4 on one path where it has several
    ft, job, background, avail = _hotspot_case()
    ctl = Controller(ft, job, avail, background=background, load_aware=False, stripe=True, max_rounds=1)
    before = evaluate(ft, job, avail)
    bad = ctl.detect(before)
    from correlator.actions.steering import allowed_avoid
    accepted, _ = allowed_avoid(bad, ctl._groups_touching(bad), Limits())
    ports, moved = ctl._steer(job, before, set(accepted))
    after = evaluate(ft, Job(job.src, job.dst, ports), avail)
    names, avoid = ft.names, set(accepted)

    def links(out, f):
        return {names[u] for u in ft.undirected(out.paths[f][out.paths[f] >= 0]).tolist()}
    crossing = {int(ctl.group_of[f]) for f in range(job.size) if links(before, f) & avoid}
    assert crossing and moved == sum(int((ctl.group_of == g).sum()) for g in crossing)
    assert all(not links(after, f) & avoid for f in range(job.size) if int(ctl.group_of[f]) in crossing)
    assert all(ports[f] == job.port[f] for f in range(job.size) if int(ctl.group_of[f]) not in crossing)
    spread = [len({tuple(after.paths[f]) for f in np.flatnonzero(ctl.group_of == g)}) for g in crossing]
    assert sum(1 for n in spread if n > 1) >= 0.9 * len(spread)


# --- the global planner (issue #26): whole-subflow paths for the whole job at once ---------------


def test_capacitated_colouring_is_exact_on_a_regular_multigraph_and_keeps_capacities_when_it_is_not():
    from lab.flowsim.colouring import colour
    rng = np.random.default_rng(0)
    n, colours, cap = 24, 6, 4  # every node of degree colours x cap: Konig says it always fits
    left = np.repeat(np.arange(n), colours * cap)
    right = rng.permutation(left)
    col = colour(left, right, np.full((n, colours), cap), np.full((n, colours), cap), rng.permutation(left.size))
    assert (col >= 0).all()
    for ends in (left, right):
        assert np.bincount(ends * colours + col, minlength=n * colours).max() == cap
    # node 0 may use colour 0 once, node 1 colour 1 once: two edges 0 -> 1 cannot both be coloured
    caps = np.zeros((2, 2), int)
    caps[0, 0], caps[1, 1] = 1, 1
    col = colour(np.array([0, 0]), np.array([1, 1]), caps, caps)
    assert (col == -1).all()


def _plan_case(kind, seed, k=8):
    ft, job, background, avail = _full_load(kind, seed, k)
    return ft, job, background, avail, Controller(ft, job, avail, background=background, planner=True).run(job)


@pytest.mark.parametrize("seed", [1, 2])
def test_planner_reaches_the_lp_optimum_on_a_clean_full_load_tree(seed):
    # per-pair moves stop at 0.8 (a link with 5 subflows of 4 left); the planner packs every uplink with 4
    ft, job, background, avail, res = _plan_case("none", seed)
    lam = optimum(ft, job.src, job.dst, avail).max_concurrent
    assert res.split == 1 and res.throughput == pytest.approx(lam)
    assert Controller(ft, job, avail).run(job).outcome.min_rate < 0.9 * lam


@pytest.mark.parametrize("kind,seed", [("failures", 1), ("failures", 3), ("hotspots", 1), ("hotspots", 2)])
def test_planned_paths_keep_to_alive_links_and_their_slots_and_the_ports_reach_them(kind, seed):
    from lab.flowsim.planner import plan, ports_for, slots
    ft, job, background, avail = _full_load(kind, seed)
    p = plan(ft, job.src, job.dst, avail)
    paths = ft.path_links(job.src, job.dst, p.plane, p.core)
    usage = np.bincount(paths[paths >= 0], minlength=ft.n_links)
    assert (usage[2 * ft.hosts:] <= slots(avail, p.rate)[2 * ft.hosts:]).all()
    up, down = ft.directions(np.flatnonzero(~ft.alive))
    assert usage[up].sum() == usage[down].sum() == 0
    ports, _ = ports_for(ft, job.src, job.dst, p.plane, p.core)
    a, c = ft.route(job.src, job.dst, ports)
    assert np.array_equal(a, p.plane) and np.array_equal(c, p.core)
    assert evaluate(ft, Job(job.src, job.dst, ports), avail).min_rate >= p.rate - 1e-9
    # and the planner ends at the whole-subflow bound: no whole-subflow routing does better
    assert p.rate == pytest.approx(whole_subflow_upper_bound(ft, job.src, job.dst, avail))


def test_planner_splits_qps_where_whole_subflows_cannot_reach_the_optimum():
    # k=8 seed 1 with failures: an edge's 16 subflows over 3 uplinks put 6 on one (whole-subflow bound
    # 66.7 of lambda* 75); as 32 QPs of half the bytes, 11 on one: 72.7 each pair's worth (0.97)
    ft, job, background, avail, res = _plan_case("failures", 1)
    lam = optimum(ft, job.src, job.dst, avail).max_concurrent
    whole = whole_subflow_upper_bound(ft, job.src, job.dst, avail)
    assert whole < 0.9 * lam
    assert res.split == 2 and res.job.size == 2 * job.size
    assert res.throughput >= 0.95 * lam and res.throughput > whole
    # a clean fabric is not split: whole subflows already reach the optimum there
    assert _plan_case("none", 1)[4].split == 1


def test_planner_drains_a_link_only_where_the_limits_accept_it():
    # one edge uplink keeps 50 of 400 G: at the planned rate (66.7) it takes no subflow, it is drained
    ft, job, _, _ = _full_load("none", 1)
    background = np.zeros(ft.n_links)
    link = int(ft.link(1, 0, ft.edge_agg(3, 1)))
    background[link] = 350.0
    avail = ft.available(background)
    res = Controller(ft, job, avail, background=background, planner=True, max_split=1).run(job)
    assert res.drained == 1 and not np.isin(res.outcome.paths, [link]).any()
    assert res.throughput == pytest.approx(whole_subflow_upper_bound(ft, job.src, job.dst, avail))
    strict = Controller(ft, job, avail, background=background, planner=True, max_split=1,
                        limits=Limits(0.1, 1)).run(job)
    assert strict.drained == 0 and ft.names[int(ft.undirected(link))] in strict.refusals


def test_planner_kept_to_the_traced_ports_uses_no_other():
    # the honest variant: the agent keeps to its 32 traced candidate ports; every planned path is one of them
    ft, job, background, avail = _full_load("hotspots", 1)
    res = Controller(ft, job, avail, background=background, planner=True, traced_only=True).run(job)
    assert res.rounds and not res.rounds[0].rolled_back and res.traced == 1.0
    ctl = Controller(ft, job, avail, background=background, planner=True)
    cand = {(int(g), int(p)) for g in range(ctl.cand_port.shape[0]) for p in ctl.cand_port[g]}
    group = np.repeat(ctl.group_of, res.split)
    assert all((int(g), int(p)) in cand for g, p in zip(group, res.job.port))
    assert res.throughput > evaluate(ft, job, avail).min_rate
