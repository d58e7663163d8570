"""Loss as a sequential test: evidence accumulated over time against each link's own baseline.

A window judged alone cannot see 0.1 % loss (a leaf uplink of a small fabric carries ~250
exchanges/s: one loss in 4 s, against a background of one in 40 s). Here loss is tested over
windows of growing length that all end now (a window-limited generalized likelihood ratio test,
the sequential form of the binomial test: Lai 1998): 1, 2, 3 and 5 s and the whole context, from
the context's per-second rings, then the context plus the latest 1, 2, 3, 6, 12, all `BUCKET_S`
buckets of settled counts per path, folded as seconds leave the context, up to `correlator.loss_horizon`. A
new fault is judged on a short window (undiluted), a faint one on a long one (enough exchanges).
A path's buckets folded at or before its latest trouble (`Context.settled_after`: a down episode,
the end of a loss finding on a link it crosses) are left out, as the context leaves out its seconds:
a healed fault's losses are no evidence against another link its paths cross.
Each window runs the greedy binomial cover of localize.py, shortest first, over the paths no link
explains yet, each directed link against its own baseline:

* **baseline**: an upper bound (~2 sigma) of the link's loss rate over the paths no finding
  explains, decayed over `LEARN_S` (an hour: a fault of minutes barely moves it), with a prior of
  `loss_floor_pct / 4` worth `PRIOR_EXCHANGES` (a link seen for seconds is not held to a rate it
  did not show yet), at most `TYPICAL_FACTOR` x the fabric's median link baseline (a fault not found yet must not
  become its own link's baseline; nor is a link learned from while some window of it loses more
  than its baseline with p < `SUSPECT_P`), kept within [`loss_baseline_pct`, `loss_floor_pct`]:
  background stays background, and a link losing more than the floor is faulty whatever its past.
* **open**: binomial tail p <= `ALPHA_OPEN` on some window, at >= 2x the baseline and at least
  `MIN_LOST` losses, and the loss not clearly over (below).
* **hold** (hysteresis: one incident per fault): a link once found stays found while its paths'
  loss on some window still has p <= `ALPHA_HOLD` against its baseline and the loss is not over; it
  is judged before any new opening and keeps its paths, so the window cover can neither move the
  fault to a neighbour nor drop it for a window that happened to lose little.
* **over**: some window ending now is `1 / P_STOP` times likelier at the baseline than at 3/4 of
  the found rate (its exact ~2 sigma lower bound, raised as evidence accumulates): the other side of the
  sequential test. A repaired link stops being reported once ~ln(1/P_STOP) / (0.75 rate) exchanges
  crossed it clean: seconds at 5 %, ~15 s at 0.5 %, about a minute at 0.1 % (docs/correlator.md).

Memory: per path, `loss_horizon / BUCKET_S` buckets of two int32; per directed link, 3 floats and a flag.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom, chi2

from correlator.context import Context, PathStats
from correlator.localize import Pick, cover_loss
from correlator.paths import Geometry
from nms.config.models import CorrelatorConfig

BUCKET_S = 10
SHORT_S = (1, 2, 3, 5)  # windows within the context besides the whole context
LONG_BUCKETS = (1, 2, 3, 6, 12, 29)  # windows beyond it: the context plus this many buckets (the last: all)
ALPHA_OPEN = 1e-7  # per window and step: ~10 windows x 600 steps x links of a fabric stay far from 1
ALPHA_HOLD = 1e-3
MIN_LOST = 4
P_STOP = 1e-3
STOP_FRACTION = 0.75  # "over" tests the baseline against this fraction of the found (lower-bound) rate
PRIOR_EXCHANGES = 10_000.0
SUSPECT_P = 0.01
FOCUS_P = 1e-3  # a link this unlikely at its baseline (and not found yet) gets its paths probed faster
LOWER_BOUND_P = 0.02275  # one-sided 2 sigma
LEARN_S = 3600.0  # a link's loss baseline is learned over about this long (decay time constant)
TYPICAL_FACTOR = 2.0  # a link's baseline is at most this times the fabric's median link baseline


class SequentialLoss:
    def __init__(self, config: CorrelatorConfig, ctx: Context):
        self.ctx, self.span = ctx, ctx.span
        self.floor = config.loss_floor_pct / 100
        self.lowest = min(config.loss_baseline_pct / 100, self.floor)
        self.decay_s = LEARN_S
        self.nb = max(1, math.ceil((config.loss_horizon - self.span) / BUCKET_S))
        self.bsent = np.zeros((0, self.nb), np.int32)
        self.blost = np.zeros((0, self.nb), np.int32)
        self.bid = np.full(self.nb, -1, np.int64)  # the bucket (second // BUCKET_S) each column holds
        self.folded = -1  # the newest second folded into the buckets
        self.base_sent = np.zeros(0)  # per directed link: decayed exchanges and losses (its baseline)
        self.base_lost = np.zeros(0)
        # directed link -> (its rate, alternatives, since when its loss is seen: its first window's start)
        self.held: dict[int, tuple[float, list[int], int]] = {}
        self.ended: dict[int, tuple[float, int]] = {}  # directed link -> (its rate, when its loss ended)
        self.horizon_s = config.loss_horizon
        self.explained = np.zeros(0, bool)  # paths the latest step's loss findings explained
        self.suspect = np.zeros(0, bool)  # per directed link: losing more than its baseline (not learned from)
        self.focus = np.zeros(0, bool)  # per directed link: p < FOCUS_P on some window, not found yet
        self._settled: np.ndarray | None = None  # this step's Context.settled_after

    # -- state ----------------------------------------------------------------------------------
    def _grow(self, P: int, D: int) -> None:
        if P > len(self.bsent):
            extra = max(P, 2 * len(self.bsent)) - len(self.bsent)
            self.bsent = np.vstack([self.bsent, np.zeros((extra, self.nb), np.int32)])
            self.blost = np.vstack([self.blost, np.zeros((extra, self.nb), np.int32)])
            self.explained = np.concatenate([self.explained, np.zeros(extra, bool)])
        if D > len(self.base_sent):
            self.base_sent = np.concatenate([self.base_sent, np.zeros(D - len(self.base_sent))])
            self.base_lost = np.concatenate([self.base_lost, np.zeros(D - len(self.base_lost))])
            self.suspect = np.concatenate([self.suspect, np.zeros(D - len(self.suspect), bool)])
            self.focus = np.concatenate([self.focus, np.zeros(D - len(self.focus), bool)])

    def baseline(self, D: int) -> np.ndarray:
        lost = self.base_lost[:D] + self.floor / 4 * PRIOR_EXCHANGES
        rate = (lost + 2 * np.sqrt(lost) + 2) / (self.base_sent[:D] + PRIOR_EXCHANGES)  # ~2 sigma above
        seen = rate[self.base_sent[:D] > 0]
        if len(seen):  # a fault not yet found must not become its link's baseline
            rate = np.minimum(rate, TYPICAL_FACTOR * float(np.median(seen)))
        return np.clip(rate, self.lowest, self.floor)

    def fold(self, now_s: int, geo: Geometry) -> None:
        """Fold the seconds that left the context into the buckets and the links' baselines."""
        ctx, P = self.ctx, self.ctx.P
        last = now_s - self.span - 1
        first = max(self.folded + 1, ctx.newest - ctx.C + 1, last - BUCKET_S * self.nb + 1)
        if last < first or P == 0:
            self.folded = max(self.folded, last)
            return
        last_bad = self._settled_after()
        clean = ~self.explained[:P]
        D = geo.UT.shape[0]
        learn = ~self.suspect[:D]
        for s in range(first, last + 1):
            got = ctx.settled_second(s, last_bad)
            if got is None:
                continue
            sent, lost = got
            b = s // BUCKET_S
            col = b % self.nb
            if self.bid[col] != b:
                self.bsent[:, col] = 0
                self.blost[:, col] = 0
                self.bid[col] = b
            self.bsent[:P, col] += sent.astype(np.int32)
            self.blost[:P, col] += lost.astype(np.int32)
            keep = math.exp(-1.0 / self.decay_s)
            add_sent = geo.UT @ np.where(clean, sent, 0).astype(np.float64)
            add_lost = geo.UT @ np.where(clean, lost, 0).astype(np.float64)
            self.base_sent[:D] = np.where(learn, keep * self.base_sent[:D] + add_sent, self.base_sent[:D])
            self.base_lost[:D] = np.where(learn, keep * self.base_lost[:D] + add_lost, self.base_lost[:D])
        self.folded = last

    def _settled_after(self) -> np.ndarray:
        """Context.settled_after, once per step (and again after a held loss ended: explain_loss)."""
        if self._settled is None:
            self._settled = self.ctx.settled_after(self.ctx.P)
        return self._settled

    def _columns(self) -> list[tuple[int, int]]:
        """(bucket column, seconds up to its oldest) of the folded buckets, newest first."""
        if self.folded < 0:
            return []
        newest = self.folded // BUCKET_S
        return [(c, self.span + self.folded - (newest - j) * BUCKET_S + 1)
                for j, c in ((j, (newest - j) % self.nb) for j in range(self.nb)) if self.bid[c] == newest - j]

    def windows(self, stats: PathStats, P: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(seconds, sent, lost) per path for each window the cover tests, shortest first."""
        out = []
        for k in (*SHORT_S, self.span):
            k = min(k, stats.sent_age.shape[1])
            out.append((k, stats.sent_age[:, :k].sum(axis=1), stats.lost_age[:, :k].sum(axis=1)))
        sent, lost = out[-1][1].copy(), out[-1][2].copy()
        columns = self._columns()
        if not columns:
            return out
        stale, drop_sent, drop_lost = self._stale(np.arange(P), [c for c, _ in columns])
        done = 0
        for n in LONG_BUCKETS:
            n = min(n, len(columns))
            if n <= done:
                break
            cols = [c for c, _ in columns[done:n]]
            sent = sent + self.bsent[:P, cols].sum(axis=1)
            lost = lost + self.blost[:P, cols].sum(axis=1)
            sent[stale] -= drop_sent[:, done:n].sum(axis=1)
            lost[stale] -= drop_lost[:, done:n].sum(axis=1)
            done = n
            out.append((columns[n - 1][1], sent, lost))
        return out

    def _stale(self, rows: np.ndarray, cols: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows (of `rows`) with buckets folded before their path's latest trouble (a down
        episode, the end of a loss finding: Context.settled_after), and those buckets' (sent, lost)
        in `cols`, 0 elsewhere: the counts the windows leave out, as the context leaves out its
        seconds before the trouble."""
        start = self.bid[cols] * BUCKET_S  # each bucket's first second
        since = self._settled_after()[rows] + 1
        stale = np.flatnonzero(since >= start.min())
        drop = start[None, :] <= since[stale, None]
        at = rows[stale]
        return (stale, np.where(drop, self.bsent[at][:, cols], 0).astype(np.int64),
                np.where(drop, self.blost[at][:, cols], 0).astype(np.int64))

    def _over(self, rows: np.ndarray, stats: PathStats, rate: float, baseline: float, within_s: float) -> bool:
        """The loss stopped: some window ending now, shorter than `within_s` (the time the loss has
        been seen: a longer one reaches into the clean time before it), to the second within the
        context and to the bucket beyond it, is 1/P_STOP times likelier at the baseline than at
        STOP_FRACTION of the found rate."""
        r = max(rate * STOP_FRACTION, 2 * baseline)
        cols = [c for c, seconds in self._columns() if seconds < within_s]
        k = int(min(self.span, max(within_s - 1, 0)))
        bsent, blost = self.bsent[rows][:, cols], self.blost[rows][:, cols]
        if cols:
            stale, drop_sent, drop_lost = self._stale(rows, cols)
            bsent[stale] -= drop_sent.astype(bsent.dtype)
            blost[stale] -= drop_lost.astype(blost.dtype)
        sent = np.concatenate([stats.sent_age[rows, :k].sum(axis=0), bsent.sum(axis=0)])
        lost = np.concatenate([stats.lost_age[rows, :k].sum(axis=0), blost.sum(axis=0)])
        llr = np.cumsum(sent) * (r - baseline) - np.cumsum(lost) * math.log(r / baseline)  # Poisson
        return bool(len(llr)) and float(llr.max()) >= math.log(1 / P_STOP)

    # -- the test -------------------------------------------------------------------------------
    def find(self, now_ns: int, stats: PathStats, geo: Geometry, quiet: np.ndarray, prio: np.ndarray) -> list[Pick]:
        P, D = self.ctx.P, geo.UT.shape[0]
        self._settled = None
        self._grow(P, D)
        self.fold(now_ns // 1_000_000_000, geo)
        base = self.baseline(D)
        wins = self.windows(stats, P)
        taken = np.zeros(P, bool)
        picks = self._hold(now_ns, stats, geo, quiet, base, wins, taken)
        # a path whose newest window lost a third or more after a second that did not may be dying
        # (its down event may still be on its way, in the agent's next report): it opens nothing
        # this step; a loss that heavy twice running is loss
        heavy = (stats.sent_age[:, :2] > 0) & (3 * stats.lost_age[:, :2] >= stats.sent_age[:, :2])
        dying = heavy[:, 0] & ~heavy[:, 1]
        for seconds, sent, lost in wins:
            cand = quiet & ~taken & (sent > 0) & ~dying
            found = cover_loss(geo.U, geo.UT, sent, lost, cand, p0=base, log_alpha=math.log(ALPHA_OPEN),
                               min_lost=MIN_LOST, min_rate=2 * self.lowest, priority=prio)
            for pick in found:
                did, rate = pick.element, pick.stats["lost"] / max(pick.stats["sent"], 1)
                # a long window still holds a loss that ended: judged at the rate it ended at
                before = self.ended.get(did, (0.0, 0))[0]
                if rate < 2 * base[did] or self._over(pick.paths, stats, max(rate, before), base[did], seconds):
                    continue  # within twice its baseline, or loss that stopped: history
                pick.stats = self._stats(pick.stats["sent"], pick.stats["lost"],
                                         pick.stats["log10_p"] * math.log(10), seconds, base[did])
                picks.append(pick)
                taken[pick.paths] = True
                held = max(_lower(pick.stats["lost"], pick.stats["sent"]), 2 * base[did], before)
                self.held[did] = (held, pick.alternatives, now_ns - seconds * 1_000_000_000)
        self._suspect(geo, base, wins, quiet & ~taken)
        horizon = now_ns - int(self.horizon_s * 1e9)
        self.ended = {d: e for d, e in self.ended.items() if e[1] >= horizon and d not in self.held}
        self.explained[:] = False
        self.explained[:P] = taken
        return picks

    def _suspect(self, geo: Geometry, base: np.ndarray, wins, cand: np.ndarray) -> None:
        """Links losing more than their baseline on some window (p < SUSPECT_P), or found: their
        baselines stop learning, so a fault on its way to being proven is not learned as normal.
        Those at p < FOCUS_P, not found yet, are `focus`: the engine asks for their paths to be
        probed faster (Correlator.focus_requests)."""
        D = geo.UT.shape[0]
        self.suspect[:D] = False
        self.focus[:D] = False
        for _, sent, lost in wins:
            S = geo.UT @ np.where(cand, sent, 0).astype(np.float64)
            X = geo.UT @ np.where(cand, lost, 0).astype(np.float64)
            some = np.flatnonzero((X >= 2) & (X > base * S) & ~self.focus[:D])
            if len(some):
                log_p = binom.logsf(X[some] - 1, S[some], base[some])
                self.suspect[some] |= log_p < math.log(SUSPECT_P)
                self.focus[some] = log_p < math.log(FOCUS_P)
        self.suspect[list(self.held)] = True
        self.focus[list(self.held)] = False

    def _hold(self, now_ns: int, stats: PathStats, geo: Geometry, quiet: np.ndarray, base: np.ndarray, wins,
              taken: np.ndarray) -> list[Pick]:
        """The links found before, kept while their loss lasts (strongest first); they take their paths."""
        picks = []
        for did, (rate, alts, since_ns) in sorted(self.held.items(), key=lambda h: -h[1][0]):
            crossing = geo.UT.indices[geo.UT.indptr[did]:geo.UT.indptr[did + 1]]
            rows = crossing[quiet[crossing] & ~taken[crossing]]
            best: tuple[float, int, int, int] | None = None
            for seconds, sent, lost in wins:
                n, x = int(sent[rows].sum()), int(lost[rows].sum())
                if x >= MIN_LOST and x >= 2 * base[did] * n:
                    log_p = float(binom.logsf(x - 1, n, base[did]))
                    if best is None or log_p < best[0]:
                        best = (log_p, seconds, n, x)
            within = (now_ns - since_ns) / 1e9
            if best is None or best[0] > math.log(ALPHA_HOLD) or self._over(rows, stats, rate, base[did], within):
                del self.held[did]
                self.ended[did] = (rate, now_ns)
                # its losses so far were this fault's: kept in the long windows, they would become
                # evidence against another link these paths cross once the cover no longer picks it
                self.ctx.explain_loss(crossing)
                self._settled = None
                taken[crossing] = True  # from the next step on out of every window; this step's are built
                continue
            log_p, seconds, n, x = best
            self.held[did] = (max(rate, _lower(x, n)), alts, since_ns)
            picks.append(Pick(did, rows, list(alts), self._stats(n, x, log_p, seconds, base[did])))
            taken[rows] = True
        return picks

    @staticmethod
    def _stats(sent: int, lost: int, log_p: float, seconds: int, baseline: float) -> dict:
        return {"sent": sent, "lost": lost, "loss_pct": round(100 * lost / max(sent, 1), 3),
                "p_value": math.exp(log_p), "log10_p": round(log_p / math.log(10), 1), "over_s": seconds,
                "baseline_pct": round(100 * float(baseline), 4)}


def _lower(lost: int, sent: int) -> float:
    """A lower bound of a loss rate (~2 sigma): the rate the loss is held to, free of the luck that
    made its first window significant. The exact (Garwood) Poisson bound: the normal one, lost - 2
    sqrt(lost), is 0 up to 4 losses, so a loud fault found within a second on a few losses was held
    to twice its baseline and took minutes to be over after its repair."""
    return float(chi2.ppf(LOWER_BOUND_P, 2 * lost)) / 2 / max(sent, 1) if lost > 0 else 0.0
