"""correlator/steering.py: blast-radius limits and path choice (the controller's decision core)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from correlator.steering import Limits, allowed_avoid, choose


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
