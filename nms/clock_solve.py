"""Network-effect clock sync (Huygens style): pairwise ClockEdges -> one clock per host.

Pure functions over records (no I/O). Each ClockEdge says theta(t) = clock_b - clock_a at host_a's
clock time t, for one window. For one slot of fabric time, every edge is one observation of
x_b - x_a (x_h: host h's offset from fabric time at the slot's middle) and of d_b - d_a (d_h: its
drift, ppb); a weighted least-squares fit over the whole probe graph gives every x_h and d_h, and
the loops of the graph average the pairwise errors out (the "network effect").

The gauge: per connected component, mean offset and mean drift are 0, so fabric time is the mean
of the component's host clocks; offsets of hosts in different components are not comparable.

The normal equations are a weighted graph Laplacian, solved by conjugate gradients with a Jacobi
preconditioner (a probe graph with random peers is an expander: a few dozen iterations, and no
fill-in, which would make a sparse direct factorisation close to dense at 16k hosts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import cg

from nms.records import ClockEdge, ClockSolution, ProbeWindow

log = logging.getLogger(__name__)

MIN_BOUND_NS = 20.0  # edge weight 1/max(bound, 20 ns)^2: no edge claims better than software stamps allow
OUTLIER_SIGMAS = 5.0  # an edge is dropped when its residual exceeds max(5 x bound, 5 us)
OUTLIER_FLOOR_NS = 5_000.0
WEIGHT_SPAN = 4.0  # no edge weighs more than 16 x a median edge: one edge cannot silence the others
SPREAD = 3.0  # standard errors in a host's bound
# edges beyond these are not clock estimates (a corrupt record): ignored, not solved
MAX_ABS_OFFSET_NS = 1e12
MAX_ABS_DRIFT_PPB = 1e7
_COLUMNS = ("host_a", "host_b", "method", "window_start", "offset_ns", "drift_ppb", "bound_ns")


def window_ns(window_s: float) -> int:
    return round(window_s * 1e9)


def slot_of(window_start_ns: int, window_s: float) -> int:
    """The fabric slot of a window that starts at window_start_ns in its host's clock: host clocks
    differ by ms, not by a window, so the nearest slot boundary is the right one."""
    w = window_ns(window_s)
    return (window_start_ns + w // 2) // w


@dataclass
class SlotSolve:
    """One slot's solve: the solutions and what went into them."""

    slot_start_ns: int
    window_s: float
    method: str
    solutions: list[ClockSolution] = field(default_factory=list)
    component: dict[str, int] = field(default_factory=dict)  # host -> component label (one gauge each)
    components: int = 0
    edges_used: int = 0
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (host_a, host_b) of outlier edges
    ignored: int = 0  # other method or slot, self edges, insane values
    unchecked: int = 0  # hosts not solved: their component's edges form a tree (no loop, no return edge)
    converged: bool = True


def solve_window(edges: list[ClockEdge], slot_start_ns: int, window_s: float,
                 method: str = "svm") -> list[ClockSolution]:
    """One ClockSolution per host seen in the slot's edges of `method` (see `solve`)."""
    return solve(edges, slot_start_ns, window_s, method=method).solutions


def solve(edges: list[ClockEdge], slot_start_ns: int, window_s: float, method: str = "svm",
          passes: int = 2, max_rounds: int = 3) -> SlotSolve:
    """Weighted least squares over the probe graph for the slot [slot_start, slot_start + window)
    of fabric time; edges of other slots or methods are ignored.

    Edges are evaluated at the slot's middle T in fabric time, which is T + x_a in host_a's clock:
    the first pass takes x_a = 0, later passes the solved x_a (a 10 ms offset with a 100 ppm drift
    difference is 1 us otherwise). After a solve, edges whose residual exceeds
    max(5 x bound, 5 us) (offset, or drift x window/2) are dropped and the solve repeated, at most
    `max_rounds` times; per round at most one edge per host goes, the worst first, since a bad
    edge also pulls its neighbours' residuals up.

    ClockSolution.offset_ns is x_h at slot_start (x at the middle minus drift x window/2),
    window_start = slot_start (fabric time); bound_ns: see `_host_bounds` (|error of clock_b -
    clock_a| <= bound_a + bound_b within the slot, for hosts of one component); component: the
    host's connected component. Edge weights are 1/max(bound, 20 ns, median bound / 4)^2. A
    component whose kept edges form a tree (no loop, no return edge) gets no solutions: nothing
    checks its edges (`unchecked` counts its hosts).
    """
    out = SlotSolve(slot_start_ns, window_s, method)
    passes = max(1, passes)
    wns = window_ns(window_s)
    if not edges:
        return out
    # one list per attribute, then filters in numpy: 256k edges at 16k hosts (per-edge tuples
    # would wake the garbage collector over and over)
    host_a, host_b, methods, raw_starts, raw_off, raw_drift, raw_bound = (
        [getattr(e, k) for e in edges] for k in _COLUMNS)
    starts = np.array(raw_starts, dtype=np.int64)
    off, drift, bound = (np.array(v, dtype=np.float64) for v in (raw_off, raw_drift, raw_bound))
    ok = ((np.array(methods) == method) & np.array([p != q for p, q in zip(host_a, host_b)])
          & ((starts - slot_start_ns + wns // 2) // wns == 0)  # slot_of(window_start) is this slot
          & (np.abs(off) <= MAX_ABS_OFFSET_NS) & (np.abs(drift) <= MAX_ABS_DRIFT_PPB))
    out.ignored = int((~ok).sum())
    sel = np.flatnonzero(ok)
    if not len(sel):
        return out
    if len(sel) < len(edges):
        host_a, host_b = [host_a[i] for i in sel], [host_b[i] for i in sel]
    hosts = {h: i for i, h in enumerate(dict.fromkeys(host_a + host_b))}
    n = len(hosts)
    a = np.fromiter(map(hosts.__getitem__, host_a), dtype=np.int64, count=len(sel))
    b = np.fromiter(map(hosts.__getitem__, host_b), dtype=np.int64, count=len(sel))
    ws_rel = (starts[sel] - slot_start_ns).astype(np.float64)
    off, drift, bound = off[sel], drift[sel], bound[sel]
    floor = max(MIN_BOUND_NS, float(np.median(bound)) / WEIGHT_SPAN)
    w = 1.0 / np.maximum(bound, floor) ** 2
    thr = np.maximum(OUTLIER_SIGMAS * bound, OUTLIER_FLOOR_NS)
    half_s = window_s / 2
    mid_rel = wns / 2  # T - slot_start
    keep = np.ones(len(sel), dtype=bool)
    x = np.zeros(n)
    d = np.zeros(n)
    for rnd in range(max_rounds + 1):
        kw = np.where(keep, w, 0.0)
        lap, inv_deg = _laplacian(a, b, kw, n)
        gauge = _Gauge(a[keep], b[keep], lap.diagonal() > 0, n)
        for _ in range(passes):
            theta = off + drift * (mid_rel + x[a] - ws_rel) / 1e9
            x, ok_x = _solve(lap, inv_deg, _rhs(a, b, kw, theta, n), x)
            x = gauge.demean(x)  # x_a must be relative to fabric time, not to an arbitrary constant
        d, ok_d = _solve(lap, inv_deg, _rhs(a, b, kw, drift, n), d)
        d = gauge.demean(d)
        out.converged = ok_x and ok_d
        r_x = theta - (x[b] - x[a])
        r_d = drift - (d[b] - d[a])
        if rnd == max_rounds:
            break
        score = np.maximum(np.abs(r_x), np.abs(r_d) * half_s) / thr
        bad = np.flatnonzero(keep & (score > 1.0))
        if not len(bad):
            break
        touched = np.zeros(n, dtype=bool)
        for i in bad[np.argsort(-score[bad])]:
            if not (touched[a[i]] or touched[b[i]]):
                keep[i] = False
                touched[a[i]] = touched[b[i]] = True
                out.dropped.append((host_a[i], host_b[i]))
    if out.dropped:
        log.info("clock slot %d: %d outlier edge(s) dropped: %s", slot_start_ns, len(out.dropped),
                 ", ".join(f"{p}->{q}" for p, q in out.dropped[:5]))
    if not out.converged:
        log.warning("clock slot %d: the solve did not converge; solutions may be off", slot_start_ns)

    # the last round's kept edges: hosts left without one get no solution
    has = gauge.has & gauge.checked[gauge.label]
    out.unchecked = int((gauge.has & ~has).sum())
    bound_h = _host_bounds(a, b, kw, np.maximum(bound, MIN_BOUND_NS), r_x, r_d * half_s, n)
    offset0 = x - d * half_s  # x at slot start
    comp_ids: dict[int, int] = {}
    for host, i in hosts.items():
        if not has[i] or not (np.isfinite(offset0[i]) and np.isfinite(d[i])):
            continue
        comp = comp_ids.setdefault(int(gauge.label[i]), len(comp_ids))
        out.solutions.append(ClockSolution(host=host, window_start=slot_start_ns, offset_ns=float(offset0[i]),
                                           drift_ppb=float(d[i]), bound_ns=float(bound_h[i]), component=comp))
        out.component[host] = comp
    out.components = len(comp_ids)
    out.edges_used = int(keep.sum())
    return out


def _host_bounds(a: NDArray[np.int64], b: NDArray[np.int64], w: NDArray[np.float64], edge_bound: NDArray[np.float64],
                 r_x: NDArray[np.float64], r_end: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """Per host: the weighted mean of its edges' bounds, taken as one error common to all of them
    (a host's egress queue biases every edge it is on the same way: that does not average out and
    the residuals cannot show it), plus SPREAD x the standard error of its offset from its edges'
    residuals weighted as in the fit (a sandwich estimate: what the other edges contradict counts,
    whatever an edge claimed), plus the same for the drift over half a slot."""
    def per_host(v: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.bincount(a, v, minlength=n) + np.bincount(b, v, minlength=n)  # type: ignore[return-value]

    wsum = per_host(w)
    safe = np.where(wsum > 0, wsum, 1.0)
    common = per_host(w * edge_bound) / safe
    spread_x = np.sqrt(per_host(w ** 2 * r_x ** 2)) / safe
    spread_d = np.sqrt(per_host(w ** 2 * r_end ** 2)) / safe
    return common + SPREAD * (spread_x + spread_d)


class _Gauge:
    """Connected components of the kept edges; `demean` makes each component's mean 0."""

    def __init__(self, a: NDArray[np.int64], b: NDArray[np.int64], has: NDArray[np.bool_], n: int) -> None:
        adj = sp.coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
        _, self.label = connected_components(adj, directed=False)
        self.has = has  # hosts with at least one kept edge (the others are singletons, not solved)
        self.size = np.bincount(self.label, has.astype(float))
        self.ncomp = int((self.size > 0).sum())
        # a component whose edges form a tree has nothing to check any edge against
        self.edges = np.bincount(self.label[a], minlength=len(self.size))
        self.checked = self.edges >= self.size

    def demean(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        mean = np.bincount(self.label, np.where(self.has, v, 0.0), minlength=len(self.size)) / np.maximum(self.size, 1)
        return np.where(self.has, v - mean[self.label], 0.0)


# scipy has no type information here: its sparse matrices are Any to mypy
def _laplacian(a: NDArray[np.int64], b: NDArray[np.int64], w: NDArray[np.float64], n: int
               ) -> tuple[sp.csr_matrix, sp.dia_matrix]:
    lap = sp.coo_matrix((np.concatenate([w, w, -w, -w]),
                         (np.concatenate([a, b, a, b]), np.concatenate([a, b, b, a]))), shape=(n, n)).tocsr()
    deg = lap.diagonal()
    return lap, sp.diags(np.where(deg > 0, 1.0 / np.where(deg > 0, deg, 1.0), 1.0))


def _rhs(a: NDArray[np.int64], b: NDArray[np.int64], w: NDArray[np.float64], y: NDArray[np.float64],
         n: int) -> NDArray[np.float64]:
    # normal equations of the rows x_b - x_a = y (weights w)
    # numpy's stubs type bincount as intp whatever the weights; with float weights it returns float64
    return np.bincount(b, w * y, minlength=n) - np.bincount(a, w * y, minlength=n)  # type: ignore[return-value]


def _solve(lap: sp.csr_matrix, inv_deg: sp.dia_matrix, rhs: NDArray[np.float64], x0: NDArray[np.float64]
           ) -> tuple[NDArray[np.float64], bool]:
    """Conjugate gradients on the (singular, consistent) Laplacian system: each component's
    solution is determined up to a constant, removed afterwards by the gauge."""
    if not np.any(rhs):
        return np.zeros_like(rhs), True
    x, info = cg(lap, rhs, x0=x0, rtol=1e-12, atol=0.0, maxiter=2000, M=inv_deg)  # expanders: ~30 iterations
    return x, info == 0


def clock_offset(solutions: dict[str, ClockSolution], host_a: str, host_b: str, t_ns: int) -> float | None:
    """clock_b - clock_a at fabric time t_ns from two solutions, each drift-extrapolated from its
    window start; None when a host has no solution. The two should come from the same solve and
    component (one gauge); the caller checks that."""
    sa, sb = solutions.get(host_a), solutions.get(host_b)
    if sa is None or sb is None:
        return None
    return _at(sb, t_ns) - _at(sa, t_ns)


def _at(s: ClockSolution, t_ns: int) -> float:
    return s.offset_ns + s.drift_ppb * (t_ns - s.window_start) / 1e9


def correct_window(w: ProbeWindow, offset_ns: float) -> ProbeWindow:
    """A copy of `w` with its one-way delays corrected for offset_ns = clock_dst - clock_src:
    forward (t2 - t1, dst clock minus src clock) - offset; reverse (t4 - t3) + offset. The raw
    fields are kept; the corrected ones go to *_corr_ns, the offset to clock_offset_ns."""
    update: dict[str, float | int | None] = {"clock_offset_ns": float(offset_ns)}
    for direction, sign in (("fwd", -1.0), ("rev", 1.0)):
        for stat in ("min", "p50", "p99"):
            raw = getattr(w, f"owd_{direction}_{stat}_ns")
            update[f"owd_{direction}_{stat}_corr_ns"] = None if raw is None else round(raw + sign * offset_ns)
    return w.model_copy(update=update)
