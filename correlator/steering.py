"""The controller's pure decision core: which bad elements traffic may be steered off, and which
paths a flow group keeps. Used by the action planner (correlator/actions.py), the host agent's
steering (which source ports to use) and the flow-level simulator (bench/fabric_sim.py), so the
lab, the simulator and production decide alike.

A flow group is whatever shares a set of candidate paths (a host pair, a job's rank pair); a path
is the set of element names it crosses (links as `dev:port--dev:port`, NICs, devices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
    for group, paths in groups.items():
        for i, path in enumerate(paths):
            for element in path:
                hit = touching.get(element)
                if hit is not None:
                    hit.setdefault(group, []).append(i)
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
