"""correlator/actions/steering.py: blast-radius limits and path choice (the controller's decision core)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from correlator.actions.steering import Limits, allowed_avoid, choose, fill_shares, rebalance, stripe


def P(*elements: str) -> frozenset[str]:
    return frozenset(elements)


def reference_allowed_avoid(bad, groups, limits):
    """The first, unindexed implementation: every group re-counted for every element."""
    accepted, refused, avoid = [], {}, set()
    for element in sorted(bad, key=lambda e: (-bad[e], e)):
        trial = avoid | {element}
        reason = None
        for group, paths in groups.items():
            if not paths or not any(element in p for p in paths):
                continue
            left = sum(1 for p in paths if not (p & trial))
            if left < limits.min_paths:
                reason = f"{group} would keep {left} of {len(paths)} paths (min {limits.min_paths})"
                break
            if (len(paths) - left) > limits.max_drain_fraction * len(paths):
                reason = (f"{group} would lose {len(paths) - left} of {len(paths)} paths "
                          f"(max {limits.max_drain_fraction:.0%})")
                break
        if reason is None:
            accepted.append(element)
            avoid = trial
        else:
            refused[element] = reason
    return accepted, refused


def test_never_the_last_path():
    groups = {"a->b": [P("x"), P("y")]}
    accepted, refused = allowed_avoid({"x": 2.0, "y": 1.0}, groups, Limits(max_drain_fraction=1.0, min_paths=1))
    assert accepted == ["x"]  # the worse one first
    assert refused == {"y": "a->b would keep 0 of 2 paths (min 1)"}


def test_drain_fraction_counts_what_was_accepted_before():
    groups = {"g": [P("l1"), P("l2"), P("l3"), P("l4")]}
    accepted, refused = allowed_avoid({"l1": 3, "l2": 2, "l3": 1}, groups, Limits(max_drain_fraction=0.5))
    assert accepted == ["l1", "l2"]
    assert refused == {"l3": "g would lose 3 of 4 paths (max 50%)"}


def test_one_group_over_the_limit_refuses_for_all():
    groups = {"small": [P("hot"), P("hot", "z")], "big": [P("hot")] + [P(f"o{i}") for i in range(9)]}
    accepted, refused = allowed_avoid({"hot": 1.0}, groups, Limits(max_drain_fraction=0.9))
    assert accepted == [] and "small would keep 0 of 2" in refused["hot"]


def test_elements_on_no_path_are_accepted():
    accepted, refused = allowed_avoid({"elsewhere": 1.0}, {"g": [P("a")]}, Limits())
    assert accepted == ["elsewhere"] and refused == {}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_indexed_allowed_avoid_equals_the_reference(data):
    elements = [f"e{i}" for i in range(8)]
    path = st.frozensets(st.sampled_from(elements), max_size=4)
    groups = data.draw(st.dictionaries(st.sampled_from(["g1", "g2", "g3", "g4"]), st.lists(path, max_size=6)))
    bad = data.draw(st.dictionaries(st.sampled_from(elements), st.floats(0, 10), max_size=6))
    limits = Limits(max_drain_fraction=data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
                    min_paths=data.draw(st.integers(0, 3)))
    assert allowed_avoid(bad, groups, limits) == reference_allowed_avoid(bad, groups, limits)


def test_choose_avoids_and_prefers_the_least_loaded():
    paths = [P("hot", "a"), P("b", "c"), P("d", "e"), P("f")]
    load = {"b": 0.9, "c": 0.1, "d": 0.5, "e": 0.5, "f": 0.95}
    assert choose(paths, {"hot"}, load, n=3) == [2, 1, 3]  # by the busiest element
    assert choose(paths, {"hot", "b", "d", "f"}, load) == []


def test_choose_breaks_max_ties_by_the_other_links():
    paths = [P("up", "busy"), P("up", "idle")]
    assert choose(paths, set(), {"up": 0.8, "busy": 0.7, "idle": 0.0}, n=2) == [1, 0]
    assert choose(paths, set(), None, n=2) == [0, 1]  # no load: the given order


def loads_after(paths, assign, load, weight, current):
    """The loads once the subflows moved from `current` to `assign` (weight per subflow)."""
    out = dict(load)
    for _i, (a, b) in enumerate(zip(current, assign)):
        for e in paths[a]:
            out[e] = out.get(e, 0.0) - weight
        for e in paths[b]:
            out[e] = out.get(e, 0.0) + weight
    return out


def _uplinks(ports: int, spines: int) -> list[tuple[str, ...]]:
    """A host's candidate ports to one peer: port i hashed onto spine i % spines (trace order)."""
    return [("leaf1", f"spine{i % spines + 1}", "leaf2") for i in range(ports)]


def test_stripe_senders_taking_their_own_slots_fill_the_routes_to_one_level():
    # 8 senders x 2 ports of 0.1 on 3 routes at 0.6, 0.6 and 0.8 (spine1 avoided): poured together
    # they level at 1.2, so 6 + 6 + 4 of the 16; each choosing the least loaded alone puts 8 + 8 on two
    paths = _uplinks(16, 4)
    load = {"spine2": 0.6, "spine3": 0.6, "spine4": 0.8}
    placed = [paths[i][1] for rank in range(8) for i in stripe(paths, {"spine1"}, load, 2, rank * 2, 16, 0.1)]
    assert {s: placed.count(s) for s in ("spine1", "spine2", "spine3", "spine4")} == \
           {"spine1": 0, "spine2": 6, "spine3": 6, "spine4": 4}
    alone = [paths[i][1] for _ in range(8) for i in choose([frozenset(p) for p in paths], {"spine1"}, load, n=2)]
    assert sorted(alone.count(s) for s in ("spine2", "spine3", "spine4")) == [0, 8, 8]  # the herd
    assert fill_shares([0.6, 0.6, 0.8], 1.6, 16) == [6, 6, 4]
    assert fill_shares([0.2, 1.5], 0.4, 4) == [4, 0]  # a route above the level gets none


@given(st.integers(2, 6), st.integers(1, 12), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_stripe_with_equal_room_spreads_any_number_of_senders_evenly(routes, senders, per_sender):
    paths = _uplinks(8 * routes, routes)
    total = senders * per_sender
    placed = [paths[i][1] for rank in range(senders)
              for i in stripe(paths, set(), {}, per_sender, rank * per_sender, total, 0.05)]
    counts = [placed.count(f"spine{r + 1}") for r in range(routes)]
    assert sum(counts) == total and max(counts) - min(counts) <= 1


@given(st.lists(st.floats(0, 2), min_size=1, max_size=8), st.integers(1, 200), st.floats(0.01, 0.5))
@settings(max_examples=100, deadline=None)
def test_fill_shares_levels_the_routes_it_fills(base, slots, unit):
    shares = fill_shares(base, slots * unit, slots)
    assert sum(shares) == slots and min(shares) >= 0
    ends = [b + n * unit for b, n in zip(base, shares) if n]
    # the filled routes end level, within a slot's rounding; a route left empty was above that level
    assert max(ends) - min(ends) <= 2 * unit + 1e-9
    assert all(b >= min(ends) - 2 * unit - 1e-9 for b, n in zip(base, shares) if not n)


def test_stripe_keeps_distinct_paths_avoids_and_falls_back_when_routes_run_out():
    paths = _uplinks(6, 3)  # two ports per spine
    assert stripe(paths, {"spine1", "spine2", "spine3"}, {}, 2, 0, 2, 0.1) == []
    got = stripe(paths, {"spine1"}, {"spine2": 1.0, "spine3": 1.0}, 4, 0, 4, 0.1)  # full alike: even
    assert sorted(got) == [1, 2, 4, 5]
    got = stripe(paths, set(), {"spine1": 0.95, "spine2": 0.5}, 6, 0, 6, 0.1)  # spine1 above the level
    assert len(set(got)) == 6 and [paths[i][1] for i in got[-2:]] == ["spine1", "spine1"]  # only once all else is taken
    # the routes' order is their hops', not the candidates' order: two hosts whose ports hash
    # differently still take the same route for the same slot
    other = list(reversed(paths))
    assert [paths[i][1] for i in stripe(paths, set(), {}, 3, 5, 9, 0.1)] == \
           [other[i][1] for i in stripe(other, set(), {}, 3, 5, 9, 0.1)]


def test_rebalance_relieves_an_overloaded_link_with_as_few_moves_as_it_takes():
    # five subflows of weight 0.25 on "hot" (load 1.25); the others: "a" (0.5) and "b" (0.75)
    paths = [P("hot", "x"), P("a", "x"), P("b", "x")]
    load = {"hot": 1.25, "a": 0.5, "b": 0.75, "x": 0.5}
    assign = rebalance(paths, [0] * 5, load, 0.25)
    assert sorted(assign) == [0, 0, 0, 0, 1]  # one moves, to the least loaded; "hot" is at 1.0
    assert load["hot"] == 1.25  # the caller's map is not changed


def test_rebalance_counts_each_move_at_once():
    # eight subflows on "hot" (2.0): four must leave; "a" and "b" take two each, not four on one
    paths = [P("hot"), P("a"), P("b")]
    assign = rebalance(paths, [0] * 8, {"hot": 2.0, "a": 0.5, "b": 0.5}, 0.25)
    assert assign.count(0) == 4 and assign.count(1) == 2 and assign.count(2) == 2


def test_rebalance_never_moves_onto_avoid_and_leaves_subflows_under_the_limit():
    paths = [P("hot"), P("idle", "bad"), P("busy")]
    assert rebalance(paths, [0, 0], {"hot": 1.5, "busy": 0.5}, 0.5, avoid={"bad"}) == [2, 0]  # the first moves
    assert rebalance(paths, [0, 0], {"hot": 1.0}, 0.5) == [0, 0]  # at the limit: nobody moves
    assert rebalance(paths, [0, 0], {"hot": 1.5, "busy": 1.5}, 0.5, avoid={"bad"}) == [0, 0]  # no better path


def test_rebalance_with_shared_elements_counts_them_once():
    # both paths share "x" (over the limit): moving does not lower it, so nobody moves
    paths = [P("hot", "x"), P("a", "x")]
    assert rebalance(paths, [0, 0], {"hot": 1.5, "x": 2.0, "a": 0.0}, 0.5) == [0, 0]


def test_rebalance_moves_a_subflow_a_move_put_over_the_limit():
    # three subflows on e0 (1.5) must spread; whichever of e2 / e4 takes one goes to 1.25, over the limit,
    # and the fourth subflow (e1, e4, e2: 0.75 at the start) is on both: it moves to e4 alone, and every
    # element ends at or under the limit (found by the property test below)
    paths = [P("e0"), P("e2"), P("e4"), P("e1", "e4", "e2")]
    load = {"e0": 1.5, "e1": 0.5, "e2": 0.75, "e4": 0.75}
    assign = rebalance(paths, [0, 0, 0, 3], load, 0.5)
    after = loads_after(paths, assign, load, 0.5, [0, 0, 0, 3])
    assert assign == [1, 0, 0, 2] and max(after.values()) <= 1.0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_rebalance_only_lowers_the_bottleneck_and_ends_where_no_single_move_helps(data):
    elements = [f"e{i}" for i in range(6)]
    paths = data.draw(st.lists(st.frozensets(st.sampled_from(elements), min_size=1, max_size=3),
                               min_size=1, max_size=6))
    current = data.draw(st.lists(st.integers(0, len(paths) - 1), max_size=6))
    weight = data.draw(st.sampled_from([0.25, 0.5]))
    base = {e: data.draw(st.sampled_from([0.0, 0.25, 0.5, 0.75])) for e in elements}
    load = dict(base)
    for a in current:  # the group's own subflows are part of the load
        for e in paths[a]:
            load[e] += weight
    avoid = data.draw(st.frozensets(st.sampled_from(elements), max_size=2))
    assign = rebalance(paths, current, load, weight, avoid)
    assert len(assign) == len(current) and all(0 <= j < len(paths) for j in assign)
    after = loads_after(paths, assign, load, weight, current)
    used = {e for p in paths for e in p}
    limit = 1.0
    top = max((load[e] for e in used), default=0.0)
    for _i, (a, b) in enumerate(zip(current, assign)):
        if a != b:
            assert not (paths[b] & avoid)  # never onto avoid
            # nothing moves unless something is over the limit (a subflow under it at the start may move
            # when an earlier move put its path over: test_rebalance_moves_a_subflow_a_move_put_over_the_limit)
            assert top > limit
    assert max((after[e] for e in used), default=0.0) <= top + 1e-9  # the bottleneck never rises
    # no subflow still over the limit has a single move that strictly lowers its highest load
    for _i, a in enumerate(assign):
        peak = max(after[e] for e in paths[a])
        if peak <= limit + 1e-9:
            continue
        for j, p in enumerate(paths):
            if j != a and not (p & avoid):
                assert max(after[e] + (0 if e in paths[a] else weight) for e in p) >= peak - 1e-9
