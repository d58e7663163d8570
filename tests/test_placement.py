"""Route planning (correlator/actions/placement.py) and the planner's planned routes
(correlator/actions/planner.py `plan_routes`): every mover's subflows placed at once."""

from __future__ import annotations

from _act_fabric import addresses, incident, topology, uplink
from hypothesis import given, settings
from hypothesis import strategies as st

from correlator.actions.placement import EPS, peak, place
from correlator.actions.planner import Routing, plan
from correlator.actions.steering import stripe


def test_subflows_of_different_switches_meet_past_their_uplinks_and_are_levelled():
    # two edge switches' movers (one each), two aggregation planes, each plane two cores; their
    # uplinks differ, their core links are shared; the first core of each plane carries other traffic
    groups = {f"{s}>far": [[f"{s}:up{a}", f"agg{a}:core{c}", f"core{a}{c}:down"] for a in (1, 2) for c in (1, 2)]
              for s in ("e1", "e2")}
    load = {"agg1:core1": 0.5, "agg2:core1": 0.5}
    placed = place(groups, 4, load, 0.25)
    assert sorted(map(len, placed.values())) == [4, 4]
    # the optimum: 8 flows of 0.25 level the four core links at 0.75 (3 on each core2, 1 on each core1)
    assert peak(groups, placed, load, 0.25) == 0.75
    # each agent alone (its stripe over its own routes; every path twice: two candidate ports hash
    # there) sees the same loads and puts 2 flows on each core2: 4 of theirs on each, 1.0
    twice = {g: [p for p in ps for _ in range(2)] for g, ps in groups.items()}
    alone = {g: stripe(ps, (), load, 4, 0, 4, 0.25) for g, ps in twice.items()}
    assert peak(twice, alone, load, 0.25) == 1.0


def test_only_allowed_paths_and_groups_without_any_get_none():
    groups = {"a>b": [["x"], ["y"]], "c>d": [["x"]]}
    placed = place(groups, 3, {}, 0.1, allowed={"a>b": [1], "c>d": []})
    assert placed == {"a>b": [1, 1, 1], "c>d": []}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_no_single_move_lowers_the_busiest_element(data):
    # the improvement ends at a placement where no subflow on a busiest element has a path whose
    # busiest element after moving there is lower
    elements = [f"e{i}" for i in range(6)]
    n_groups = data.draw(st.integers(1, 5))
    groups = {f"g{g}": data.draw(st.lists(st.lists(st.sampled_from(elements), min_size=1, max_size=3, unique=True),
                                          min_size=1, max_size=4)) for g in range(n_groups)}
    load = {e: data.draw(st.floats(0, 1)) for e in elements}
    unit, count = data.draw(st.sampled_from([0.1, 0.25, 0.5])), data.draw(st.integers(1, 4))
    placed = place(groups, count, load, unit)
    level = dict(load)
    for g, js in placed.items():
        assert len(js) == count
        for j in js:
            for e in groups[g][j]:
                level[e] += unit
    top = peak(groups, placed, load, unit)
    for g, js in placed.items():
        for j in js:
            if max(level[e] for e in groups[g][j]) < top - EPS:
                continue
            for k, other in enumerate(groups[g]):
                after = [level[e] if e in groups[g][j] else level[e] + unit for e in other]
                assert k == j or max(after) >= top - EPS


def test_a_reroute_carries_planned_routes_that_avoid_the_element():
    # movers h1, h2 (leaf1 -> leaf2 over up1..up4, up1 avoided); spine2 busy with other traffic:
    # the 16 subflows go on spines 3 and 4 and 2 and never spine1
    loads = {("spine2", "leaf1"): 1.5, ("spine1", "leaf1"): 1.0}  # the movers' 1.0 each way spread by the hash
    p = plan(incident("congestion", direction="leaf1:up1->spine1:leaf1"), topology(4), addresses(4),
             port_loads=loads, routing=Routing(ports_per_dst=4, port_load=0.25))
    (reroute,) = p.proposals
    routes = reroute.params["routes"]
    assert sorted(routes) == ["h1", "h2"] and all(sorted(r) == ["h3", "h4"] for r in routes.values())
    by_spine = {}
    for dsts in routes.values():
        for hops in dsts.values():
            assert len(hops) == 4
            for hop in hops:  # a trace shows spine<n>'s leaf1 port and leaf2's up<n>
                spine = hop[0].split(".")[2]
                assert hop == [f"10.1.{spine}.0", f"10.2.{spine}.1"]
                by_spine[spine] = by_spine.get(spine, 0) + 1
    assert "1" not in by_spine and sum(by_spine.values()) == 16
    # spine2 carries 0.5 of other traffic once the movers' own 1.0 is taken off: fewer there
    assert by_spine["2"] < by_spine["3"] and by_spine["3"] == by_spine["4"]
    # without the port loads, or with plan_routes off, the agents place alone
    for kw in ({"routing": Routing()}, {"port_loads": loads}):
        assert "routes" not in plan(incident("congestion"), topology(4), addresses(4), **kw).proposals[0].params
    assert reroute.element == uplink("leaf1", 1)
    # too many subflows for the service to place (here 4 pairs x 5000 > MAX_PLANNED_SUBFLOWS): the agents
    # place theirs, and the plan says why
    big = plan(incident("congestion", direction="leaf1:up1->spine1:leaf1"), topology(4), addresses(4),
               port_loads=loads, routing=Routing(ports_per_dst=5000, port_load=0.001))
    assert "routes" not in big.proposals[0].params and any("routes not planned" in n for n in big.notes)
