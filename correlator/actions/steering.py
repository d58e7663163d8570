"""The controller's pure decision core: which bad elements traffic may be steered off, and which
paths a flow group keeps. Used by the action planner (correlator/actions/planner.py), the host agent's
steering (which source ports to use: `choose`, `stripe`) and the flow-level simulator
(bench/fabric_sim.py: `rebalance`, which needs each subflow's path and rate, known there and not
to an agent), so the lab, the simulator and production decide alike.

A flow group is whatever shares a set of candidate paths (a host pair, a job's rank pair); a path
is the set of element names it crosses (links as `dev:port--dev:port`, NICs, devices).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Limits:
    """Blast-radius limits. `max_drain_fraction`: never take more than this share of a group's
    candidate paths away; `min_paths`: every group keeps at least this many paths."""

    max_drain_fraction: float = 0.5
    min_paths: int = 1


def allowed_avoid(bad: Mapping[str, float], groups: Mapping[str, Sequence[frozenset[str]]],
                  limits: Limits = Limits()) -> tuple[list[str], dict[str, str]]:
    """Elements that may be avoided, worst first (`bad`: element -> badness, higher worse), each
    accepted only if, with it and those accepted before, every group still keeps `min_paths` paths
    and loses at most `max_drain_fraction` of them. Returns (accepted, {refused element: reason}).

    Only the groups whose paths cross an element are checked for it (an index built once), so the
    cost follows the paths that touch bad elements, not all groups x all elements: the simulator
    calls this with ~10k host pairs x 32 candidate paths."""
    accepted: list[str] = []
    refused: dict[str, str] = {}
    if not bad:
        return accepted, refused
    touching: dict[str, dict[str, list[int]]] = {e: {} for e in bad}  # element -> group -> path indices
    bad_set = frozenset(bad)
    for group, paths in groups.items():
        for i, path in enumerate(paths):
            for element in bad_set.intersection(path):
                touching[element].setdefault(group, []).append(i)
    blocked: dict[str, set[int]] = {}  # group -> indices of its paths crossing an accepted element
    for element in sorted(bad, key=lambda e: (-bad[e], e)):
        reason = None
        for group, idx in touching[element].items():
            total = len(groups[group])
            lost = len(blocked.get(group, set()).union(idx))
            left = total - lost
            if left < limits.min_paths:
                reason = f"{group} would keep {left} of {total} paths (min {limits.min_paths})"
                break
            if lost > limits.max_drain_fraction * total:
                reason = (f"{group} would lose {lost} of {total} paths "
                          f"(max {limits.max_drain_fraction:.0%})")
                break
        if reason is None:
            accepted.append(element)
            for group, idx in touching[element].items():
                blocked.setdefault(group, set()).update(idx)
        else:
            refused[element] = reason
    return accepted, refused


def choose(paths: Sequence[frozenset[str]], avoid: set[str], load: Mapping[str, float] | None = None,
           n: int = 1) -> list[int]:
    """Indices of up to `n` paths that cross nothing in `avoid`, least loaded first: by the highest
    load of their elements, then by the sum (of two paths through one hot link, the one whose other
    links are busier loses); ties keep the given order. Empty when none avoids."""
    load = load or {}
    ok = [i for i, p in enumerate(paths) if not (p & avoid)]
    if load:
        def key(i: int) -> tuple[float, float]:
            loads = [load.get(e, 0.0) for e in paths[i]]
            return (max(loads, default=0.0), sum(loads))
        ok.sort(key=key)
    return ok[:n]


def fill_shares(base: Sequence[float], amount: float, slots: int) -> list[int]:
    """Water-filling: `amount` poured onto levels `base` (one per route) raises the lowest to one
    level; each route's part as whole slots of `slots` (largest remainders; together `slots`)."""
    order = sorted(range(len(base)), key=lambda k: base[k])
    level, poured = base[order[0]], 0.0
    for i in range(len(order)):  # raise the i + 1 lowest together until they meet the next
        top = base[order[i + 1]] if i + 1 < len(order) else float("inf")
        if poured + (top - level) * (i + 1) >= amount:
            level += (amount - poured) / (i + 1)
            break
        poured += (top - level) * (i + 1)
        level = top
    part = [max(0.0, level - b) / amount * slots if amount > 0 else slots / len(base) for b in base]
    whole = [int(x) for x in part]
    for k in sorted(range(len(base)), key=lambda k: (whole[k] - part[k], k))[:slots - sum(whole)]:
        whole[k] += 1
    return whole


@functools.lru_cache(maxsize=32)
def _round_robin(weight: tuple[int, ...]) -> np.ndarray:
    """Route indexes in stride-scheduling order: route r's k-th turn at (k + 0.5) / weight[r], ties
    to the lower index; every prefix of the sequence holds each route in proportion to its weight
    (within about one). Cached (int32, read-only: at most 32 x 4 bytes x the slots): a steer's
    destinations behind one switch mostly share their weights."""
    w = np.asarray(weight, dtype=np.int64)
    route = np.repeat(np.arange(w.size), w)
    turn = np.arange(route.size) - np.repeat(np.cumsum(w) - w, w)
    out = route[np.argsort((turn + 0.5) / w[route], kind="stable")].astype(np.int32)
    out.flags.writeable = False
    return out


def stripe(paths: Sequence[Sequence[Hashable]], avoid: Collection[Hashable], load: Mapping[Hashable, float],
           n: int, slot: int, slots: int, unit: float) -> list[int]:
    """Indices of up to `n` distinct paths that cross nothing in `avoid`: slots `slot` ..
    `slot + n - 1` of one stripe of `slots` over their distinct routes.

    For many senders placing at once on the same `load` with no word between them (the movers of
    an action): each takes its own slots of the same stripe (sender i of m with k flows each:
    slots i * k .. of m * k), so together they fill the routes as one would, where each placing
    alone on the least loaded route would herd onto it. The stripe gives each route the slots that
    water-filling gives it: the `slots` flows of `unit` (one flow's load) poured onto the routes'
    busiest elements, so the routes end level; a route already above that level gets none. The
    slots are in stride-scheduling order, so any run of them is spread over the routes in
    proportion, not bunched. Routes are ordered by their elements in the given order (the hops of
    a trace, nearest first), which orders them alike on every sender behind the same switch. A
    route with no unused path left passes its slot to the next one; when the routes with slots are
    used up, the least loaded of the rest. Empty when none avoids."""
    routes: dict[tuple, list[int]] = {}
    avoid = avoid if isinstance(avoid, (set, frozenset)) else set(avoid)
    for i, p in enumerate(paths):
        if not any(e in avoid for e in p):
            routes.setdefault(tuple(p), []).append(i)
    if not routes:
        return []
    order = sorted(routes, key=lambda r: tuple(map(str, r)))
    slots = max(slots, slot + n, 1)
    base = [max((float(load.get(e, 0.0)) for e in r), default=0.0) for r in order]
    sequence = _round_robin(tuple(fill_shares(base, slots * unit, slots)))
    free = [list(routes[r]) for r in order]
    out: list[int] = []
    for k in range(n):
        at = next((int(sequence[(slot + k + s) % slots]) for s in range(slots)
                   if free[sequence[(slot + k + s) % slots]]), None)
        if at is None:  # the routes with slots used up: the least loaded of the rest
            at = min((i for i in range(len(order)) if free[i]), key=lambda i: base[i], default=None)
            if at is None:
                break  # every avoiding path is taken
        out.append(free[at].pop(0))
    return out


def rebalance(paths: Sequence[Collection[Hashable]], current: Sequence[int], load: Mapping[Hashable, float],
              weight: float | Sequence[float] = 1.0, avoid: Collection[Hashable] = frozenset(),
              limit: float = 1.0) -> list[int]:
    """New path index for each of one flow group's subflows (`current[i]`: the index in `paths` of
    subflow i's path now): the ones on an element loaded over `limit` move where that lowers it.

    `load`: element -> load now, the group's own subflows included (a host agent: per-port
    utilization from its counters or from the planner; the simulator: offered load / capacity per
    directed link); elements missing count 0. `weight`: what one subflow adds to each element of
    its path, in the load's units (its rate / the link speed), one number or one per subflow.

    The subflow on the highest load moves first, to the path whose highest load after the move is
    lowest (then the lowest sum after it; ties keep the given order), and only if that is strictly
    below the highest load it leaves; each move is counted at once (its old path's elements lose
    its weight, the new one's gain it), so the next decision sees it; it stops when no subflow over
    `limit` can lower its load. Only as many subflows move as it takes: a link over the limit is
    relieved, not emptied. No move goes onto an element of `avoid` (the bad elements being
    drained: their subflows move by load like the others; to empty them, `choose`).
    Every move lowers the sorted vector of loads lexicographically, so this ends (a cap of 8
    moves per subflow guards it); `load` itself is not changed."""
    n = len(current)
    w = [float(weight)] * n if isinstance(weight, (int, float)) else [float(x) for x in weight]
    avoid = avoid if isinstance(avoid, (set, frozenset)) else set(avoid)
    cur = {e: float(load.get(e, 0.0)) for p in paths for e in p}  # the loads as moves change them
    allowed = [j for j, p in enumerate(paths) if not any(e in avoid for e in p)]
    assign = list(current)
    peak = [max((cur[e] for e in paths[j]), default=0.0) for j in assign]
    eps = 1e-9
    for _ in range(8 * n + 8):
        moved = False
        for i in sorted(range(n), key=lambda i: (-peak[i], i)):
            here, top = assign[i], peak[i]
            if top <= limit + eps:
                break  # sorted: nobody after this one is over the limit
            old = paths[here]
            best, best_key = None, (top - eps, float("inf"))
            for j in allowed:
                if j == here:
                    continue
                after = [cur[e] if e in old else cur[e] + w[i] for e in paths[j]]
                key = (max(after, default=0.0), sum(after))
                if key < best_key:
                    best, best_key = j, key
            if best is None:
                continue
            new = paths[best]
            for e in old:
                if e not in new:
                    cur[e] -= w[i]
            for e in new:
                if e not in old:
                    cur[e] += w[i]
            assign[i], moved = best, True
            peak = [max((cur[e] for e in paths[j]), default=0.0) for j in assign]
            break
        if not moved:
            break
    return assign
