"""Route planning (pure): every mover's subflows of a host_reroute placed on paths at once, by the
service, which sees all of them and the links' loads (docs/steering.md "Planned routes").

The agents' own placement (`steering.stripe`) levels the routes of one switch's movers; past the
first hop where their paths differ (a 3-tier fabric's aggregation and core links, the far leaf's
downlinks) their flows meet other switches' movers, which only a view of all the flows can level.

`place` solves that min-max problem greedily, then improves it: each subflow (every group's first, then
every group's second..., most constrained groups first) goes on the allowed path whose busiest
element after adding it is lowest (then the lowest sum); then, while a subflow on some element can
move to a path whose elements all stay below that element's level, the best such move off the
busiest such element is made (single moves: a local optimum, measured against the LP optimum in
bench/route_planning.py).
Levels are `load` (what other traffic leaves on each element) plus `unit` per subflow.

A path is a sequence of element names (directed links: the planner uses the ingress `dev:port`
of each hop, whose inbound utilization is the poller's load of it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

EPS = 1e-9
MAX_MOVES = 64  # improvement moves per subflow (each lowers the levels' sorted vector: it ends anyway)


def place(groups: Mapping[str, Sequence[Sequence[str]]], count: int, load: Mapping[str, float], unit: float,
          allowed: Mapping[str, Collection[int]] | None = None) -> dict[str, list[int]]:
    """Group -> the path index of each of its `count` subflows (a group with no allowed path: []).
    `allowed`: group -> the indices of its paths it may use (default: all)."""
    options = {g: sorted(set(range(len(p))) if allowed is None or g not in allowed else set(allowed[g]))
               for g, p in groups.items()}
    # what every allowed path of a group crosses (its hosts' access links) is loaded wherever its
    # subflows go: it decides nothing for the group (`paths`), the levels count it (`full`). Tuples
    # in the given order, not sets: the sums, and so the ties, come out alike on every run
    full = {g: [tuple(dict.fromkeys(p)) for p in ps] for g, ps in groups.items()}
    paths: dict[str, list[tuple[str, ...]]] = {}
    for g, ps in full.items():
        common = set.intersection(*(set(ps[j]) for j in options[g])) if options[g] else set()
        paths[g] = [tuple(e for e in p if e not in common) for p in ps]
    level: dict[str, float] = {}
    on: dict[str, set[tuple[str, int]]] = {}  # element -> the subflows (group, i) a move could take off it
    out: dict[str, list[int]] = {g: [] for g in groups}

    def peak_after(g: str, j: int, leaving: tuple[str, ...] = ()) -> tuple[float, float]:
        after = [level.get(e, float(load.get(e, 0.0))) + (0.0 if e in leaving else unit) for e in paths[g][j]]
        return max(after, default=0.0), sum(after)

    def put(g: str, i: int, j: int, sign: float) -> None:
        for e in full[g][j]:
            level[e] = level.get(e, float(load.get(e, 0.0))) + sign * unit
        for e in paths[g][j]:
            (on.setdefault(e, set()).add if sign > 0 else on[e].discard)((g, i))

    order = sorted((g for g in groups if options[g]), key=lambda g: (len(options[g]), g))
    for i in range(count):  # each group's first subflow, then each one's second...: none takes the best alone
        for g in order:
            j = min(options[g], key=lambda j: (*peak_after(g, j), j))
            out[g].append(j)
            put(g, i, j, 1.0)
    # improvement: the busiest element that a move can relieve, relieved by the move whose new path ends
    # lowest (below that element's level: the sorted levels fall, so this ends)
    for _ in range(MAX_MOVES * max(1, count * len(order))):
        best = None
        for top in sorted((e for e in level if on.get(e)), key=lambda e: (-level[e], e)):
            for g, i in sorted(on[top]):
                here = out[g][i]
                for j in options[g]:
                    if j == here or top in paths[g][j]:
                        continue
                    key = peak_after(g, j, paths[g][here])
                    if key[0] < level[top] - EPS and (best is None or key < best[0]):
                        best = (key, g, i, j)
            if best is not None:
                break
        if best is None:
            break
        _, g, i, j = best
        put(g, i, out[g][i], -1.0)
        out[g][i] = j
        put(g, i, j, 1.0)
    return out


def peak(groups: Mapping[str, Sequence[Sequence[str]]], placed: Mapping[str, Sequence[int]],
         load: Mapping[str, float], unit: float) -> float:
    """The busiest element's level with the subflows where `placed` puts them."""
    level: dict[str, float] = {}
    for g, js in placed.items():
        for j in js:
            for e in groups[g][j]:
                level[e] = level.get(e, float(load.get(e, 0.0))) + unit
    return max(level.values(), default=0.0)
