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
    and loses at most `max_drain_fraction` of them. Returns (accepted, {refused element: reason})."""
    accepted: list[str] = []
    refused: dict[str, str] = {}
    avoid: set[str] = set()
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


def choose(paths: Sequence[frozenset[str]], avoid: set[str], load: Mapping[str, float] | None = None,
           n: int = 1) -> list[int]:
    """Indices of up to `n` paths that cross nothing in `avoid`, least loaded first (a path's load
    is the highest load of its elements; ties keep the given order). Empty when none avoids."""
    load = load or {}
    ok = [i for i, p in enumerate(paths) if not (p & avoid)]
    ok.sort(key=lambda i: max((load.get(e, 0.0) for e in paths[i]), default=0.0))
    return ok[:n]
