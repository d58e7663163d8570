"""Pairwise clock estimation: the max-margin line (checked against an LP solver), the NTP-style
baseline, and ClockSync's window handling (clock steps on either side, sparse windows)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from hostprobe.clock_edges import (
    ClockSync,
    _hull_candidates,
    _lower_hull,
    max_margin_line,
    ntp_estimate,
    svm_estimate,
    theil_sen_slope,
)
from hostprobe.stats import Exchange

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000


def exchanges(rng, n, offset_ns, drift_ppb, *, base=8_000, queue_fwd=2_000.0, queue_rev=2_000.0, span=2 * S,
              start=T0):
    """n exchanges over `span` with peer clock = ours + offset + drift * (t - start); delays are
    base + exponential queueing. Returns arrays (t1, t2, t3, t4) in each host's clock."""
    # float64 cannot hold epoch nanoseconds exactly: compute relative to `start`, add it back as int
    r1 = np.sort(rng.integers(0, span, n)).astype(float)
    theta = lambda t: offset_ns + drift_ppb * t / 1e9  # noqa: E731
    fwd = base + rng.exponential(queue_fwd, n) if queue_fwd else np.full(n, base, float)
    rev = base + rng.exponential(queue_rev, n) if queue_rev else np.full(n, base, float)
    r2 = r1 + fwd
    r3 = r2 + 20_000  # the responder's turnaround
    as_ns = lambda r: start + np.round(r).astype(np.int64)  # noqa: E731
    return as_ns(r1), as_ns(r2 + theta(r2)), as_ns(r3 + theta(r3)), as_ns(r3 + rev)


def lp_margin(ux, uy, lx, ly):
    """The same problem as a linear program (scipy HiGHS): maximize m."""
    a_ub = np.vstack([np.c_[np.ones_like(ux), ux, np.ones_like(ux)], np.c_[-np.ones_like(lx), -lx, np.ones_like(lx)]])
    res = linprog([0, 0, -1], A_ub=a_ub, b_ub=np.r_[uy, -ly], bounds=[(None, None)] * 3, method="highs")
    assert res.status == 0
    return res.x


@pytest.mark.parametrize("seed", range(8))
def test_max_margin_line_matches_the_lp(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 80))
    ux, lx = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    slope, icpt = rng.uniform(-5e4, 5e4), rng.uniform(-1e7, 1e7)
    uy = icpt + slope * ux + 8000 + rng.exponential(800, n)
    ly = icpt + slope * lx - 8000 - rng.exponential(800, n)
    a, b, m = max_margin_line(ux, uy, lx, ly)
    la, lb, lm = lp_margin(ux, uy, lx, ly)
    assert m == pytest.approx(lm, abs=1e-3)
    # the optimum can be non-unique in (a, b) only when margins tie; the margin itself is unique
    assert np.min(uy - (a + b * ux)) >= m - 1e-3 and np.min((a + b * lx) - ly) >= m - 1e-3


def test_hull_prefilter_keeps_every_lower_hull_vertex():
    """The vectorized chord filter is exact: the same hull as the plain monotone chain, ties and
    repeated x included."""
    rng = np.random.default_rng(7)
    for t in range(2000):
        n = int(rng.integers(1, 60))
        x = np.round(rng.uniform(0, 2, n), int(rng.integers(0, 3)))  # coarse rounding: repeated x
        y = rng.exponential(100, n) if t % 2 else np.round(rng.uniform(-5, 5, n))  # ties in y
        order = np.lexsort((y, x))
        plain = _lower_hull(x[order], y[order])
        filtered = _lower_hull(*_hull_candidates(x[order], y[order]))
        assert np.array_equal(plain[0], filtered[0]) and np.array_equal(plain[1], filtered[1])


@pytest.mark.parametrize("seed", range(4))
def test_max_margin_line_within_a_slope_band_matches_the_bounded_lp(seed):
    rng = np.random.default_rng(seed)
    n = 6
    # pure forward points early, reverse points late: unbounded without a band (the line tilts forever)
    ux, lx = rng.uniform(-1, 0, n), rng.uniform(0, 1, n)
    uy = 1e6 + 8000 + rng.exponential(800, n)
    ly = 1e6 - 8000 - rng.exponential(800, n)
    a, b, m = max_margin_line(ux, uy, lx, ly, -1000.0, 1000.0)
    a_ub = np.vstack([np.c_[np.ones(n), ux, np.ones(n)], np.c_[-np.ones(n), -lx, np.ones(n)]])
    res = linprog([0, 0, -1], A_ub=a_ub, b_ub=np.r_[uy, -ly], bounds=[(None, None), (-1000, 1000), (None, None)],
                  method="highs")
    assert m == pytest.approx(res.x[2], abs=1e-3) and -1000 <= b <= 1000


def test_crossing_envelopes_have_negative_margin():
    x = np.array([0.0, 0.5, 1.0])
    a, b, m = max_margin_line(x, np.array([0.0, 0.0, 0.0]), x, np.array([10.0, 10.0, 10.0]))
    assert m < 0


@pytest.mark.parametrize("offset_ns,drift_ppb", [(7_345_000, 42_000), (-9_900_000, -49_000), (0, 0)])
def test_svm_recovers_offset_and_drift_through_queueing(offset_ns, drift_ppb):
    rng = np.random.default_rng(1)
    t1, t2, t3, t4 = exchanges(rng, 60, offset_ns, drift_ppb, queue_fwd=5_000, queue_rev=500)
    ones = np.ones(len(t1), bool)
    est = svm_estimate(t1, t2, t3, t4, ones, ones, T0 + S)
    assert est is not None
    truth_mid = offset_ns + drift_ppb  # theta at T0 + 1 s
    # the envelopes sit on the base delay in both directions: error far below one queueing delay
    assert abs(est.offset_ns - truth_mid) < 500, est
    assert abs(est.drift_ppb - drift_ppb) < 1_000, est


def test_svm_beats_the_ntp_baseline_under_one_way_queueing():
    errors = {"svm": [], "ntp": []}
    for seed in range(20):
        rng = np.random.default_rng(seed)
        t1, t2, t3, t4 = exchanges(rng, 40, 1_000_000, 20_000, queue_fwd=20_000, queue_rev=500)
        ones = np.ones(40, bool)
        errors["svm"].append(abs(svm_estimate(t1, t2, t3, t4, ones, ones, T0 + S).offset_ns - 1_020_000))
        errors["ntp"].append(abs(ntp_estimate(t1, t2, t3, t4, T0 + S, 2 * S).offset_ns - 1_020_000))
    # min-RTT filtering keeps half of the forward queueing of its best samples; the envelope does not
    assert np.mean(errors["svm"]) * 3 < np.mean(errors["ntp"]), errors


def test_ntp_baseline_is_exact_without_queueing():
    rng = np.random.default_rng(9)
    t1, t2, t3, t4 = exchanges(rng, 40, -2_500_000, 10_000, queue_fwd=0, queue_rev=0)
    est = ntp_estimate(t1, t2, t3, t4, T0 + S, 2 * S)
    assert abs(est.offset_ns - (-2_500_000 + 10_000)) < 5 and abs(est.drift_ppb - 10_000) < 10


def test_svm_uses_only_pure_points_and_needs_enough_of_them():
    rng = np.random.default_rng(2)
    t1, t2, t3, t4 = exchanges(rng, 40, 1_000_000, 0, queue_fwd=0, queue_rev=0)
    fwd = np.ones(40, bool)
    rev = np.zeros(40, bool)
    assert svm_estimate(t1, t2, t3, t4, fwd, rev, T0 + S) is None  # no pure reverse points
    rev[::10] = True  # 4 pure reverse points across the window
    bad = t2.copy()
    bad[5] -= 50_000  # an impossible forward delay: flagged impure, it must not move the line
    fwd[5] = False
    est = svm_estimate(t1, bad, t3, t4, fwd, rev, T0 + S)
    assert est is not None and abs(est.offset_ns - 1_000_000) < 50


def test_bound_grows_with_stamp_noise():
    rng = np.random.default_rng(3)
    t1, t2, t3, t4 = exchanges(rng, 60, 0, 0, queue_fwd=300, queue_rev=300)
    ones = np.ones(60, bool)
    quiet = svm_estimate(t1, t2, t3, t4, ones, ones, T0 + S)
    t1, t2, t3, t4 = exchanges(rng, 60, 0, 0, queue_fwd=6000, queue_rev=6000)
    noisy = svm_estimate(t1, t2, t3, t4, ones, ones, T0 + S)
    assert noisy.bound_ns > quiet.bound_ns


class FakeClock:
    def __init__(self):
        self.epoch = 0


def make_exchanges(rng, n, offset_ns, *, start=T0, epoch=0, peer_epoch=0):
    t1, t2, t3, t4 = exchanges(rng, n, offset_ns, 0, start=start)
    out = []
    for i in range(n):
        ex = Exchange(i, None, 0, 0.0, bool(i % 2), epoch)
        ex.t1, ex.t2, ex.t3, ex.t4 = int(t1[i]), int(t2[i]), int(t3[i]), int(t4[i])
        ex.pure_fwd = ex.pure_rev = True
        ex.peer_epoch = peer_epoch
        out.append(ex)
    return out


def collect(window_s=2.0):
    clock, edges = FakeClock(), []
    sync = ClockSync("a", clock, window_s, lambda kind, rec: edges.append((kind, rec)))
    return clock, sync, edges


def test_clock_sync_emits_one_svm_and_one_ntp_edge_per_complete_window():
    rng = np.random.default_rng(4)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    sync.add("b", make_exchanges(rng, 40, 3_000_000, start=start))
    sync.add("b", make_exchanges(rng, 40, 3_000_000, start=start + 2 * S))
    assert sync.run(start + 2 * S) == 2  # only the first window is complete
    kinds = sorted(rec.method for _, rec in edges)
    assert kinds == ["ntp", "svm"] and all(k == "clock_edges" for k, _ in edges)
    svm = next(rec for _, rec in edges if rec.method == "svm")
    assert (svm.host_a, svm.host_b, svm.window_start) == ("a", "b", start)
    assert abs(svm.offset_ns - 3_000_000) < 300 and svm.pure_pairs > 0
    assert sync.run(start + 4 * S) == 2 and len(edges) == 4
    assert sync.run(start + 10 * S) == 0  # nothing left


def test_a_peer_step_inside_a_window_drops_that_window():
    rng = np.random.default_rng(5)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    before = make_exchanges(rng, 20, 0, start=start, peer_epoch=3)
    after = make_exchanges(rng, 20, 5_000_000, start=start + S, peer_epoch=4)
    sync.add("b", before[:10] + after[:10])
    assert sync.run(start + 2 * S) == 0 and sync.stats["clock_windows_stepped"] == 1
    mixed = make_exchanges(rng, 20, 0, start=start + 2 * S, peer_epoch=-1)  # reply and follow-up disagreed
    sync.add("b", mixed)
    assert sync.run(start + 4 * S) == 0 and sync.stats["clock_windows_stepped"] == 2


def test_our_step_discards_what_was_collected_and_exchanges_sent_before_it():
    rng = np.random.default_rng(6)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    sync.add("b", make_exchanges(rng, 20, 0, start=start))
    clock.epoch = 1  # a step
    sync.add("b", make_exchanges(rng, 20, 0, start=start, epoch=0))  # sent before the step: dropped
    assert sync.run(start + 2 * S) == 0 and not edges
    sync.add("b", make_exchanges(rng, 20, 0, start=start + 2 * S, epoch=1))
    assert sync.run(start + 4 * S) == 2


def test_sparse_windows_give_no_svm_edge_but_are_counted():
    rng = np.random.default_rng(7)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    few = make_exchanges(rng, 2, 0, start=start)
    sync.add("b", few)
    sync.run(start + 2 * S)
    assert [rec.method for _, rec in edges] == ["ntp"] and sync.stats["clock_windows_sparse"] == 1


def test_drift_comes_from_the_history_when_a_window_is_lopsided():
    """Pure forward points only early in the window and reverse ones only late: the window alone
    cannot tell offset from drift; with the recent windows' drift it still can."""
    rng = np.random.default_rng(8)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    drift = 30_000  # ppb
    for k in range(4):
        w0 = start + 2 * S * k
        batch = make_exchanges(rng, 40, 2_000_000 + drift * 2 * k, start=w0)
        for i, ex in enumerate(batch):
            ex.t2 += int(drift * (ex.t1 - w0) / 1e9)  # the drift inside the window (make_exchanges has none)
            ex.t3 += int(drift * (ex.t1 - w0) / 1e9)
            if k == 3:
                ex.pure_fwd, ex.pure_rev = i < 12, i >= 28
        sync.add("b", batch)
        sync.run(w0 + 2 * S)
    last = [rec for _, rec in edges if rec.method == "svm"][-1]
    truth_mid = 2_000_000 + drift * 6 + drift  # at the last window's middle
    assert abs(last.offset_ns + last.drift_ppb - truth_mid) < 500, last
    assert abs(last.drift_ppb - drift) <= 1_100, last


def test_a_drift_change_does_not_lock_the_max_margin_fit_out():
    """Three windows at drift 0 make the history's band 0 +- 1 ppm; then the peer's clock runs
    40 ppm fast (e.g. chrony changed its frequency). No line in that band separates the new
    windows, and the history only grows from windows that gave an estimate: without the refit in
    wider bands the pair would never get an svm estimate again."""
    rng = np.random.default_rng(9)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    drift = 40_000  # ppb

    def window(k, drift_ppb):
        w0 = start + 2 * S * k
        t = exchanges(rng, 40, 1_000_000 + drift_ppb * 2 * max(0, k - 3), drift_ppb, start=w0, queue_fwd=500.0,
                      queue_rev=500.0)
        out = []
        for i in range(40):
            ex = Exchange(i, None, 0, 0.0, bool(i % 2), 0)
            ex.t1, ex.t2, ex.t3, ex.t4 = (int(a[i]) for a in t)
            ex.pure_fwd = ex.pure_rev = True
            out.append(ex)
        return w0, out, t

    for k in range(3):
        w0, batch, _ = window(k, 0)
        sync.add("b", batch)
        sync.run(w0 + 2 * S)
    assert sync.stats["clock_windows_refit"] == 0
    band = sync._drift_range("b", 0, None)
    assert band[0] < 0 < band[1] and band[1] - band[0] <= 2_001
    w0, _, t = window(3, drift)
    mid = w0 + S
    assert svm_estimate(*t, np.ones(40, bool), np.ones(40, bool), mid, band) is None  # the trap
    for k in range(3, 8):
        w0, batch, _ = window(k, drift)
        sync.add("b", batch)
        sync.run(w0 + 2 * S)
    late = [rec for _, rec in edges if rec.method == "svm" and rec.window_start >= start + 6 * S]
    assert len(late) == 5 and all(abs(rec.drift_ppb - drift) < 2_000 for rec in late), late
    assert sync.stats["clock_windows_refit"] >= 1 and sync.stats["clock_windows_crossed"] == 0


def test_theil_sen_slope_matches_scipy_and_shrugs_off_an_outlier():
    from scipy.stats import theilslopes

    rng = np.random.default_rng(11)
    x = np.arange(8) * 2.0
    y = 3e6 + 20_000 * x + rng.normal(0, 100, 8)
    y[3] += 50_000
    assert theil_sen_slope(x, y) == pytest.approx(theilslopes(y, x).slope)
    assert abs(theil_sen_slope(x, y) - 20_000) < 200


def _pure_window(rng, w0, offset_ns, standing_fwd_ns=0):
    """40 pure exchanges of one window; the forward direction waits in a standing queue (both
    packets of every pair alike: purity cannot see it)."""
    t1, t2, t3, t4 = exchanges(rng, 40, offset_ns, 0, start=w0, queue_fwd=500.0, queue_rev=500.0)
    out = []
    for i in range(40):
        ex = Exchange(i, None, 0, 0.0, bool(i % 2), 0)
        ex.t1 = int(t1[i])  # the reply leaves and arrives later too
        ex.t2, ex.t3, ex.t4 = (int(t[i]) + standing_fwd_ns for t in (t2, t3, t4))
        ex.pure_fwd = ex.pure_rev = True
        out.append(ex)
    return out


def test_a_standing_queue_raises_the_bound_by_the_margins_excess():
    """A standing queue on one direction biases the max-margin line by half of it, and no two-way
    method can tell it from an offset; what shows is the margin (half the gap between the
    envelopes), grown by as much over the pair's baseline. Before MARGIN_WARMUP windows there is
    no baseline and the whole margin is in the bound."""
    from hostprobe.clock_edges import MARGIN_WARMUP

    rng = np.random.default_rng(12)
    clock, sync, edges = collect()
    start = T0 // (2 * S) * 2 * S
    queue = 30_000
    for k in range(MARGIN_WARMUP + 2):
        w0 = start + 2 * S * k
        sync.add("b", _pure_window(rng, w0, 1_000_000, standing_fwd_ns=queue if k == MARGIN_WARMUP + 1 else 0))
        sync.run(w0 + 2 * S)
    svm = [rec for _, rec in edges if rec.method == "svm"]
    assert len(svm) == MARGIN_WARMUP + 2
    first, clean, queued = svm[0], svm[-2], svm[-1]
    assert first.margin_ns == pytest.approx(8_000, abs=300) and first.bound_ns >= first.margin_ns  # warm-up
    assert clean.bound_ns < 300 and abs(clean.offset_ns + clean.drift_ppb - 1_000_000) < clean.bound_ns
    error = queued.offset_ns + queued.drift_ppb - 1_000_000  # at the window's middle
    assert error == pytest.approx(queue / 2, rel=0.1)  # the bias: invisible in the line itself
    assert queued.margin_ns == pytest.approx(clean.margin_ns + queue / 2, rel=0.1)
    assert abs(error) <= queued.bound_ns < 2 * abs(error)
