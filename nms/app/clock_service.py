"""The service's clock sync: ClockEdges are collected as they are ingested, each finished slot of
fabric time is solved (nms.clock_solve) by a scheduler job, the solutions are stored and kept, and
probe windows ingested afterwards get clock-corrected one-way delays.

Timing: a slot [k W, (k+1) W) is solved once now >= its end + solve_lag (the agents report a
window's edges after it closes plus their probe timeout and report interval: ~2 s). Edges that
arrive for a slot already solved are late: stored, but not solved. Memory holds the edges of the
unsolved slots (at most +-max_age around now) and the newest solution per host.

Corrections use the newest solve only: both hosts of a window must be in it and in the same
connected component (one gauge), and the window must be within max_age of the solved slot
(drift extrapolation); otherwise the window is stored uncorrected.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from nms.clock_solve import SlotSolve, clock_offset, correct_window, slot_of, solve, window_ns
from nms.config.models import ClockConfig
from nms.records import ClockEdge, ClockSolution, ProbeWindow

log = logging.getLogger(__name__)

FORGET_HOST_S = 3600.0  # a host without a solution for this long leaves GET /clock


@dataclass(frozen=True)
class _Current:
    """The newest solve, as applied to probe windows (replaced whole, read without the lock)."""

    slot_start_ns: int
    solutions: dict[str, ClockSolution]
    component: dict[str, int]


class SolveStats(BaseModel):
    """What the last solve did (also the `last_solve` of GET /clock)."""

    slot_start_ns: int
    solved_at_ns: int
    duration_s: float
    method: str
    hosts: int
    components: int
    edges_used: int
    edges_dropped: int = Field(description="outliers: residual above max(5 x bound, 5 us)")
    edges_ignored: int
    hosts_unchecked: int = Field(0, description="hosts not solved: their component's edges form a tree, nothing "
                                                "checks them")
    dropped: list[str] = Field(description="host_a->host_b of the dropped edges (at most 50)")
    converged: bool


class ClockService:
    def __init__(self, config: ClockConfig, store, metrics=None, now: Callable[[], int] = time.time_ns):
        self.config = config
        self.window_s = config.window_s
        self.wns = window_ns(config.window_s)
        self.store = store
        self.metrics = metrics
        self.now = now
        self._horizon = math.ceil(config.max_age / config.window_s)  # slots kept either side of now
        self._lock = threading.Lock()
        self._pending: dict[int, dict[tuple[str, str], ClockEdge]] = {}
        self._solved_through: int | None = None
        self._current: _Current | None = None
        self.latest: dict[str, ClockSolution] = {}
        self.last: SolveStats | None = None
        self.late = 0  # edges for a slot already solved
        # False in a cluster member that does not run `correlate`: the solve runs in another member,
        # whose solutions this one reads from the shared store (stored())
        self.solves_here = True
        self.ignored = 0  # other method, other window length, or too far from now

    # --- ingest side -----------------------------------------------------------------------

    def add_edges(self, edges: list[ClockEdge]) -> None:
        now_slot = self.now() // self.wns
        late = ignored = 0
        with self._lock:
            for e in edges:
                slot = slot_of(e.window_start, self.window_s)
                if (e.method != self.config.method or abs(e.window_s - self.window_s) > 1e-6
                        or abs(slot - now_slot) > self._horizon):
                    ignored += 1
                elif self._solved_through is not None and slot <= self._solved_through:
                    late += 1
                else:  # keyed: a replayed batch replaces, never duplicates
                    self._pending.setdefault(slot, {})[(e.host_a, e.host_b)] = e
            for slot in [s for s in self._pending if s < now_slot - self._horizon]:
                del self._pending[slot]  # only when the solve job is not running
            self.late += late
            self.ignored += ignored
        self._count("late", late)
        self._count("ignored", ignored)

    def correct(self, windows: list[ProbeWindow]) -> list[ProbeWindow]:
        """The windows, corrected where the newest solve covers both hosts (see the module doc)."""
        cur = self._current
        if cur is None:
            return windows
        max_age = self.config.max_age * 1e9
        out, corrected = [], 0
        for w in windows:
            comp = cur.component.get(w.src_host)
            t = w.window_start + int(w.window_s * 5e8)  # the window's middle (src clock ~ fabric time)
            if comp is None or cur.component.get(w.dst_host) != comp or abs(t - cur.slot_start_ns) > max_age:
                out.append(w)
                continue
            out.append(correct_window(w, clock_offset(cur.solutions, w.src_host, w.dst_host, t)))
            corrected += 1
        if self.metrics is not None:
            self.metrics.clock_windows.labels("corrected").inc(corrected)
            self.metrics.clock_windows.labels("uncorrected").inc(len(windows) - corrected)
        return out

    # --- the scheduled solve -----------------------------------------------------------------

    def solve_due(self, now_ns: int | None = None) -> list[SlotSolve]:
        """Solve every pending slot that ended solve_lag ago or earlier, oldest first; keep and store
        the solutions. Runs in a worker thread (a 16k-host slot takes ~0.5 s)."""
        now = self.now() if now_ns is None else now_ns
        lag = round(self.config.solve_lag * 1e9)
        with self._lock:
            due = sorted(s for s in self._pending if (s + 1) * self.wns + lag <= now)
            batches = [(s, list(self._pending.pop(s).values())) for s in due]
            if due:
                self._solved_through = max(due[-1], self._solved_through or due[-1])
        results = []
        for slot, edges in batches:
            started = time.perf_counter()
            result = solve(edges, slot * self.wns, self.window_s, method=self.config.method)
            took = time.perf_counter() - started
            results.append(result)
            self._count("used", result.edges_used)
            self._count("dropped", len(result.dropped))
            if not result.solutions:
                continue
            self._keep(result, took, now)  # kept first: corrections go on while the store is away
            try:
                self.store.write([s.to_point() for s in result.solutions])
            except Exception as e:  # the next slots still get solved
                log.warning("clock slot %d: solutions not stored: %s", slot * self.wns, e)
            log.debug("clock slot %d: %d hosts, %d components, %d edges (%d dropped) in %.3f s", slot * self.wns,
                      len(result.solutions), result.components, result.edges_used, len(result.dropped), took)
        return results

    def _keep(self, result: SlotSolve, took: float, now: int) -> None:
        solutions = {s.host: s for s in result.solutions}
        self._current = _Current(result.slot_start_ns, solutions, dict(result.component))
        with self._lock:
            self.latest.update(solutions)
            forget = now - FORGET_HOST_S * 1e9
            for host in [h for h, s in self.latest.items() if s.window_start < forget]:
                del self.latest[host]
            self.last = SolveStats(
                slot_start_ns=result.slot_start_ns, solved_at_ns=now, duration_s=took, method=result.method,
                hosts=len(solutions), components=result.components, edges_used=result.edges_used,
                edges_dropped=len(result.dropped), edges_ignored=result.ignored, hosts_unchecked=result.unchecked,
                dropped=[f"{a}->{b}" for a, b in result.dropped[:50]], converged=result.converged)
        if self.metrics is not None:
            self.metrics.clock_hosts.set(len(solutions))

    def snapshot(self) -> tuple[list[ClockSolution], SolveStats | None, int]:
        """(newest solution per host, by host; the last solve's stats; edges pending)."""
        with self._lock:
            return (sorted(self.latest.values(), key=lambda s: s.host), self.last,
                    sum(len(v) for v in self._pending.values()))

    def stored(self) -> list[ClockSolution]:
        """The newest stored solution per host no older than `max_age`: what the member solving wrote
        (an API worker's view in a cluster). Raises what the store raises."""
        oldest = self.now() - int(self.config.max_age * 1e9)
        out = []
        for series in self.store.latest(ClockSolution.measurement):
            row = {**series.tags, **dict(zip(series.columns, series.values[-1], strict=False))}
            row["window_start"] = row.pop("time")
            solution = ClockSolution.model_validate({k: v for k, v in row.items() if v is not None}, strict=False)
            if solution.window_start >= oldest:
                out.append(solution)
        return sorted(out, key=lambda s: s.host)

    def _count(self, result: str, n: int) -> None:
        if self.metrics is not None and n:
            self.metrics.clock_edges.labels(result).inc(n)
