"""Pairwise clock estimation (Huygens-style), per peer and clock window, on the agent.

Exchange stamps (t1 our TX, t2 peer RX, t3 peer TX, t4 our RX; each in its own host's clock) bound
theta(t) = clock_peer - clock_ours from both sides, because one-way delays are never negative:

    forward:  t2 - t1 = delay_fwd + theta  ->  theta <= t2 - t1   (an "upper" point at t1)
    reverse:  t4 - t3 = delay_rev - theta  ->  theta >= t3 - t4   (a "lower" point at t4)

Queueing only pushes points away from theta, so the two envelopes (least-delayed packets) carry
the information. `svm_estimate` fits the line theta(t) = a + b t that separates the upper and
lower points with the largest vertical margin (the LP form of Huygens' SVM): it sits midway
between the envelopes, exact when the minimum delays of both directions are equal; a constant
asymmetry is invisible to any two-way method. Only points from pure coded pairs are used (the
pair kept its spacing, so queueing touched neither packet).

The slope is kept within a band around the peer's recent drift: with software stamps only a few
pairs per window are pure, and when the pure forward points happen to lie early in the window
and the reverse ones late, the margin grows without bound as the line tilts (an unbounded LP).
The recent drift is a robust regression (Theil-Sen) of the last windows' offsets, as Firefly
estimates drift by regression; before there is a history, the NTP-style drift of the window with
a wider band. The history only grows from windows that gave an estimate, so when the drift moves
out of its band (a daemon changed the clock's frequency, or the first windows misled it) no
window could ever correct it: a window that no line within the band separates is fitted again
within the NTP-style band, then within any plausible drift, before it counts as crossed.

The margin (half the gap between the envelopes at the line) is (min forward + min reverse
delay) / 2 and the line's error (min forward - min reverse) / 2. A standing queue delays both
packets of a pair alike, so purity cannot see it; but whatever queueing adds to the two minima
shows in the margin, and biases the line by at most the margin's excess over its queue-free value:
the smallest margin of the peer's recent windows. The svm edge's bound is its noise floor plus that
excess (before there is a baseline: plus the whole margin). A constant path asymmetry stays
invisible.

`ntp_estimate` is the baseline on the same exchanges: NTP-style min-RTT filtering (the lowest-RTT
exchange of each eighth of the window), offset ((t2 - t1) + (t3 - t4)) / 2, and a least-squares
line through those samples for offset and drift.

`ClockSync` collects each peer's complete exchanges as probe windows close and, once a clock
window (default 2 s, aligned in our clock) is complete, turns it into ClockEdge records. Clock
steps (chrony/ntpd stepping CLOCK_REALTIME, on either side) never reach an estimate: our steps
bump our epoch and drop what was collected; the peer's epoch comes in its replies, and a window
whose exchanges saw more than one peer epoch is dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from nms.records import ClockEdge

log = logging.getLogger(__name__)

MIN_POINTS = 3  # per direction: fewer and the window gives no estimate
BOUND_FLOOR_NS = 20.0
NTP_SLICES = 8
HISTORY = 8  # windows of offsets the drift regression looks at
DRIFT_BAND_PPB = 1_000.0  # how far a window's slope may leave the regression drift
BOOTSTRAP_BAND_PPB = 5_000.0  # ... or the window's NTP-style drift, before there is a history
MAX_DRIFT_PPB = 1_000_000.0  # the last band tried: 1000 ppm, as far as the lab clock may drift
MARGIN_HISTORY = 60  # windows (2 min) whose smallest margin is the peer's queue-free baseline
MARGIN_WARMUP = 15  # before this many windows (30 s) there is no baseline: the whole margin is the bound


@dataclass(frozen=True)
class Estimate:
    offset_ns: float  # theta at the reference time
    drift_ppb: float  # d theta / dt, ns per s
    bound_ns: float  # noise floor: how far the near-envelope points scatter
    points: int
    margin_ns: float | None = None  # svm: half the gap between the envelopes at the line


def _lower_hull(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of points sorted by x (Andrew's monotone chain)."""
    hx: list[float] = []
    hy: list[float] = []
    for px, py in zip(x.tolist(), y.tolist()):
        while len(hx) >= 2 and (hx[-1] - hx[-2]) * (py - hy[-2]) - (hy[-1] - hy[-2]) * (px - hx[-2]) <= 0:
            hx.pop()
            hy.pop()
        if hx and px == hx[-1]:  # same x: the lower point already won (sorted by x, then y)
            continue
        hx.append(px)
        hy.append(py)
    return np.array(hx), np.array(hy)


def _hull_candidates(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop points (sorted by x, then y) that cannot be lower-hull vertices, in one vectorized pass:
    the leftmost, the lowest and the rightmost-lowest points are vertices, so by convexity the hull
    runs on or below the chords joining them, and a point strictly above its chord is not a vertex.
    Queueing spreads most points far above the envelope, so few reach the Python hull loop."""
    n = len(x)
    last = int(np.searchsorted(x, x[-1]))  # the lowest point at the largest x
    low = int(np.argmin(y[:last + 1]))
    keep = np.zeros(n, dtype=bool)
    keep[[0, low, last]] = True
    for i, j in ((0, low), (low, last)):
        if j - i > 1:
            between = slice(i + 1, j)
            if x[j] == x[i]:
                continue  # same x as both ends, higher y: none of these is a vertex
            chord = y[i] + (y[j] - y[i]) * (x[between] - x[i]) / (x[j] - x[i])
            keep[between] = y[between] <= chord
    return x[keep], y[keep]


def _hull_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    order = np.lexsort((y, x))
    hx, hy = _lower_hull(*_hull_candidates(x[order], y[order]))
    return np.diff(hy) / np.diff(hx) if len(hx) > 1 else np.empty(0)


def max_margin_line(ux: np.ndarray, uy: np.ndarray, lx: np.ndarray, ly: np.ndarray,
                    slope_lo: float = -np.inf, slope_hi: float = np.inf) -> tuple[float, float, float]:
    """The line y = a + b x, slope_lo <= b <= slope_hi, with every upper point above and every lower
    point below it, by the largest vertical margin m. Returns (a, b, m); m < 0 when no such line
    separates the sets.

    For a slope b the best margin is (min(uy - b ux) - max(ly - b lx)) / 2, a concave function of b
    whose breakpoints are the edge slopes of the upper set's lower hull and of the lower set's upper
    hull, so the optimum is at one of those slopes or at an end of the allowed range."""
    slopes = np.concatenate((_hull_slopes(ux, uy), -_hull_slopes(lx, -ly)))
    slopes = np.concatenate((slopes[(slopes >= slope_lo) & (slopes <= slope_hi)],
                             [s for s in (slope_lo, slope_hi) if np.isfinite(s)] or [0.0]))
    top = (uy[None, :] - slopes[:, None] * ux[None, :]).min(axis=1)
    bottom = (ly[None, :] - slopes[:, None] * lx[None, :]).max(axis=1)
    best = int(np.argmax(top - bottom))
    return (top[best] + bottom[best]) / 2, float(slopes[best]), (top[best] - bottom[best]) / 2


def theil_sen_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the pairwise slopes (Theil-Sen): robust to a few bad points. Written out (a
    few lines of numpy) so that the agent does not load scipy.stats for it."""
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    ok = dx != 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


def _near_spread(residuals: np.ndarray, k: int = 2) -> float:
    r = np.sort(residuals)
    return float(r[min(k, len(r) - 1)] - r[0])


def svm_estimate(t1, t2, t3, t4, pure_fwd, pure_rev, ref_ns: int,
                 drift_range: tuple[float, float] = (-np.inf, np.inf)) -> Estimate | None:
    """Max-margin estimate from exchanges (arrays of ns; purity as bool arrays); times relative to
    ref_ns (our clock), drift (ppb) within drift_range. None with fewer than MIN_POINTS pure points
    in a direction or crossing envelopes (inconsistent stamps)."""
    t1, t2, t3, t4 = (np.asarray(a, dtype=np.int64) for a in (t1, t2, t3, t4))
    f, r = np.asarray(pure_fwd, dtype=bool), np.asarray(pure_rev, dtype=bool)
    if f.sum() < MIN_POINTS or r.sum() < MIN_POINTS:
        return None
    ux, uy = (t1[f] - ref_ns) / 1e9, (t2[f] - t1[f]).astype(float)  # x in seconds, y in ns
    lx, ly = (t4[r] - ref_ns) / 1e9, (t3[r] - t4[r]).astype(float)
    a, b, margin = max_margin_line(ux, uy, lx, ly, *drift_range)
    if margin < 0:
        return None
    bound = (_near_spread(uy - (a + b * ux)) + _near_spread((a + b * lx) - ly)) / 4
    return Estimate(a, b, max(bound, BOUND_FLOOR_NS), int(f.sum() + r.sum()), float(margin))


def ntp_estimate(t1, t2, t3, t4, ref_ns: int, window_ns: int) -> Estimate | None:
    """Min-RTT filtered offsets (the best exchange of each 1/NTP_SLICES of the window) and a
    least-squares line through them."""
    t1, t2, t3, t4 = (np.asarray(a, dtype=np.int64) for a in (t1, t2, t3, t4))
    if len(t1) < 2:
        return None
    rtt = (t4 - t1) - (t3 - t2)
    offset = ((t2 - t1) + (t3 - t4)) / 2
    start = ref_ns - window_ns // 2
    slot = np.clip((t1 - start) * NTP_SLICES // window_ns, 0, NTP_SLICES - 1)
    xs, ys = [], []
    for s in np.unique(slot):
        idx = np.flatnonzero(slot == s)
        i = idx[np.argmin(rtt[idx])]
        xs.append((t1[i] - ref_ns) / 1e9)
        ys.append(offset[i])
    x, y = np.array(xs), np.array(ys)
    if len(x) >= 2 and np.ptp(x) > 0:
        b, a = np.polyfit(x, y, 1)
    else:
        a, b = float(y.mean()), 0.0
    bound = float(np.std(y - (a + b * x))) if len(x) > 2 else float(rtt.min() / 2)
    return Estimate(float(a), float(b), max(bound, BOUND_FLOOR_NS), len(x))


class ClockSync:
    """Per-peer exchange collection and ClockEdge emission (see the module docstring)."""

    def __init__(self, host: str, clock, window_s: float, emit, max_per_peer: int = 4096):
        self.host, self.clock, self.emit = host, clock, emit
        self.window_ns = int(window_s * 1e9)
        self.max_per_peer = max_per_peer
        self.peers: dict[str, list[tuple]] = {}
        self.history: dict[str, tuple[int, deque]] = {}  # peer -> (its epoch, (mid_ns, offset at mid))
        self.margins: dict[str, deque] = {}  # peer -> svm margins of its last windows (clock steps keep them)
        self.epoch = clock.epoch
        self.stats = {"clock_windows": 0, "clock_windows_sparse": 0, "clock_windows_stepped": 0,
                      "clock_windows_crossed": 0, "clock_windows_refit": 0}

    def add(self, peer: str, exchanges) -> None:
        """Complete exchanges of a closed probe window (Exchange objects of hostprobe.stats)."""
        if self.clock.epoch != self.epoch:
            self.reset()
        rows = self.peers.setdefault(peer, [])
        for ex in exchanges:
            if ex.t1 and ex.t2 and ex.t3 and ex.t4 and ex.epoch == self.epoch:
                rows.append((ex.t1, ex.t2, ex.t3, ex.t4, bool(ex.pure_fwd), bool(ex.pure_rev), ex.peer_epoch))
        if len(rows) > self.max_per_peer:
            del rows[:-self.max_per_peer]

    def reset(self) -> None:
        """Our clock stepped: everything collected is in the old time base."""
        self.peers.clear()
        self.history.clear()
        self.epoch = self.clock.epoch

    def run(self, complete_before_ns: int) -> int:
        """Estimate every clock window that ends before `complete_before_ns` (our clock: every probe
        window inside it has closed). Returns the number of edges emitted."""
        if self.clock.epoch != self.epoch:
            self.reset()
        emitted = 0
        w = self.window_ns
        for peer, rows in self.peers.items():
            if not rows or rows[0][0] // w * w + w > complete_before_ns:  # nothing complete yet
                continue
            arr = np.array(rows, dtype=np.int64)
            starts = arr[:, 0] // w * w
            done = starts + w <= complete_before_ns
            for start in np.unique(starts[done]).tolist():
                emitted += self._window(peer, arr[starts == start], start)
            self.peers[peer] = [row for row, d in zip(rows, done.tolist()) if not d]
        return emitted

    def _drift_range(self, peer: str, peer_epoch: int, ntp: Estimate | None) -> tuple[float, float]:
        epoch, hist = self.history.get(peer, (None, None))
        if epoch != peer_epoch:  # first window, or the peer's clock stepped: its history is void
            hist = deque(maxlen=HISTORY)
            self.history[peer] = (peer_epoch, hist)
        if len(hist) >= 3:
            x = np.array([m for m, _ in hist], dtype=np.int64)
            drift = theil_sen_slope((x - x[-1]) / 1e9, np.array([o for _, o in hist]))
            return drift - DRIFT_BAND_PPB, drift + DRIFT_BAND_PPB
        if ntp is not None:
            return ntp.drift_ppb - BOOTSTRAP_BAND_PPB, ntp.drift_ppb + BOOTSTRAP_BAND_PPB
        return -np.inf, np.inf

    def _window(self, peer: str, a: np.ndarray, start: int) -> int:
        self.stats["clock_windows"] += 1
        peer_epoch = int(a[0, 6])
        if len(np.unique(a[:, 6])) > 1 or peer_epoch < 0:  # the peer's clock stepped inside the window
            self.stats["clock_windows_stepped"] += 1
            return 0
        mid = start + self.window_ns // 2
        t1, t2, t3, t4 = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
        out = 0
        ntp = ntp_estimate(t1, t2, t3, t4, mid, self.window_ns)
        fwd, rev = a[:, 4].astype(bool), a[:, 5].astype(bool)
        band = self._drift_range(peer, peer_epoch, ntp)
        svm = svm_estimate(t1, t2, t3, t4, fwd, rev, mid, band)
        few = min(fwd.sum(), rev.sum()) < MIN_POINTS
        if svm is None and not few:  # the band may be what is wrong (module doc): wider ones
            wider = [(ntp.drift_ppb - BOOTSTRAP_BAND_PPB, ntp.drift_ppb + BOOTSTRAP_BAND_PPB)] if ntp else []
            for other in [*wider, (-MAX_DRIFT_PPB, MAX_DRIFT_PPB)]:
                if other != band and (svm := svm_estimate(t1, t2, t3, t4, fwd, rev, mid, other)) is not None:
                    self.stats["clock_windows_refit"] += 1
                    break
        if svm is None:
            self.stats["clock_windows_sparse" if few else "clock_windows_crossed"] += 1
        else:
            self.history[peer][1].append((mid, svm.offset_ns))
            out += self._edge(peer, "svm", self._with_queueing(peer, svm), start, int(min(fwd.sum(), rev.sum())))
        if ntp is not None:
            out += self._edge(peer, "ntp", ntp, start, 0)
        return out

    def _with_queueing(self, peer: str, e: Estimate) -> Estimate:
        """The estimate with its bound raised by the margin's excess over the peer's baseline (the
        smallest margin of its last MARGIN_HISTORY windows): queueing that touched the envelope
        points of both directions leaves the line off by at most that much (module doc). Before
        MARGIN_WARMUP windows, by the whole margin (the envelopes' own limit)."""
        margins = self.margins.setdefault(peer, deque(maxlen=MARGIN_HISTORY))
        margins.append(e.margin_ns)
        base = min(margins) if len(margins) >= MARGIN_WARMUP else 0.0
        return replace(e, bound_ns=e.bound_ns + e.margin_ns - base)

    def _edge(self, peer: str, method: str, e: Estimate, start: int, pure: int) -> int:
        half = self.window_ns / 2e9
        self.emit("clock_edges", ClockEdge(
            host_a=self.host, host_b=peer, method=method, window_start=start, window_s=self.window_ns / 1e9,
            offset_ns=e.offset_ns - e.drift_ppb * half, drift_ppb=e.drift_ppb, bound_ns=e.bound_ns,
            pure_pairs=pure, margin_ns=e.margin_ns))
        return 1
