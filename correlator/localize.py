"""Localization: explain bad paths by the fewest elements, never blaming one a good path clears.

Three greedy set covers over the path x element matrices of paths.py:

* `cover_states` (down / down-episode paths; undirected links, NICs, switches): an element on any
  good path is exonerated; the remaining element covering the most unexplained bad paths wins,
  exact ties going to the higher `priority` (switch evidence, then NIC > switch > link). Elements
  covering exactly the same bad paths are reported as alternatives.
* `cover_loss` (directed links): loss is statistical (~10 exchanges/s/path: a path seeing no loss
  clears nothing at 1 %), so losses are pooled per directed link over the unexplained paths through
  it and tested against the background rate: exact binomial tail P(X >= lost | sent, floor). The
  link with the strongest excess (largest log-likelihood ratio) is taken if significant, its paths
  are removed, and so on. A superset link (same losses, more clean traffic) or a subset link (fewer
  losses) always tests weaker than the culprit. A path that saw clearly less loss than the link's
  pooled rate (its upper bound below a third of it) exonerates the link.
* `cover_inflation` (directed links): paths whose round-trip delay is inflated are bad, paths
  clearly not inflated are good; a link needs >= 75 % of its judged paths inflated (a queue is not
  uniformly full), then the same greedy cover. Round-trip inflation implicates the fwd and rev
  links together; the direction falls out because paths crossing the link the other way only are
  not inflated (and switch utilization breaks ties).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.stats import binom

MAX_PICKS = 200
RIVAL_NATS = 4.6  # cover_loss: a rival link at least 1 % as likely as the pick (e^-4.6) makes it wait


@dataclass
class Pick:
    element: int
    paths: np.ndarray  # the bad paths it explains
    alternatives: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def _column(csc: sparse.csc_matrix, j: int) -> np.ndarray:
    return csc.indices[csc.indptr[j]:csc.indptr[j + 1]]


def _row(csr: sparse.csr_matrix, i: int) -> np.ndarray:
    return csr.indices[csr.indptr[i]:csr.indptr[i + 1]]


def cover_states(E: sparse.csr_matrix, ET: sparse.csr_matrix, bad: np.ndarray, good: np.ndarray,
                 priority: np.ndarray, allowed: np.ndarray) -> list[Pick]:
    bad_idx = np.flatnonzero(bad)
    if not len(bad_idx):
        return []
    Eb = E[bad_idx].tocsc()
    eligible = allowed & (ET @ good.astype(np.float64) == 0)
    alive = np.ones(len(bad_idx), bool)
    picks: list[Pick] = []
    while len(picks) < MAX_PICKS:
        score = Eb.T @ alive.astype(np.float64)
        score[~eligible] = 0
        top = score.max(initial=0)
        if top <= 0:
            break
        tied = np.flatnonzero(score == top)
        best = int(tied[np.argmax(priority[tied])])
        rows = _column(Eb, best)
        rows = rows[alive[rows]]
        key = set(rows.tolist())
        alts = [int(c) for c in tied if c != best and set(_column(Eb, c)[alive[_column(Eb, c)]].tolist()) == key]
        picks.append(Pick(best, bad_idx[rows], alts))
        alive[rows] = False
    return picks


def _llr(S: np.ndarray, X: np.ndarray, p0: float | np.ndarray) -> np.ndarray:
    """S * KL(X/S || p0): the log-likelihood ratio of an excess loss rate (0 when at or below p0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip(X / S, 1e-12, 1 - 1e-12)
        kl = r * np.log(r / p0) + (1 - r) * np.log((1 - r) / (1 - p0))
    return np.where((S > 0) & (r > p0), S * kl, 0.0)


def cover_loss(U: sparse.csr_matrix, UT: sparse.csr_matrix, sent: np.ndarray, lost: np.ndarray,
               cand: np.ndarray, *, p0: float | np.ndarray, log_alpha: float, min_lost: int, min_rate: float,
               priority: np.ndarray) -> list[Pick]:
    """`p0`: the background rate, one for all or per directed link (its own baseline)."""
    s = np.where(cand, sent, 0).astype(np.float64)
    x = np.where(cand, lost, 0).astype(np.float64)
    S, X = UT @ s, UT @ x
    p0 = np.broadcast_to(np.asarray(p0, np.float64), S.shape)
    alive = cand.copy()
    exonerated = np.zeros(len(S), bool)
    picks: list[Pick] = []
    for _ in range(MAX_PICKS):
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (X >= min_lost) & ~exonerated & (X >= min_rate * S)
        ids = np.flatnonzero(ok)
        if not len(ids):
            break
        llr = _llr(S[ids], X[ids], p0[ids]) + 1e-9 * priority[ids]
        j = int(np.argmax(llr))
        link = int(ids[j])
        log_p = float(binom.logsf(X[link] - 1, S[link], p0[link]))
        if log_p > log_alpha:
            break
        rows = _row(UT, link)
        rows = rows[alive[rows]]
        rate = X[link] / S[link]
        n, xr = sent[rows], lost[rows]
        ucb = (xr + 3 + 2 * np.sqrt(xr)) / np.maximum(n, 1)
        if ((n > 0) & (ucb < rate / 3)).any():
            exonerated[link] = True
            continue
        same = ids[(S[ids] == S[link]) & (X[ids] == X[link])]
        rowset = set(rows.tolist())
        alts = [int(c) for c in same if c != link and set(r for r in _row(UT, c) if alive[r]) == rowset]
        rivals = _rivals(U, x, rows, ids[llr >= llr[j] - RIVAL_NATS], link, alts, X[link])
        if len(rivals):  # as likely an explanation of the same losses: neither is named on this window,
            # nor is any other link on their paths' losses (the next best would be a wrong one)
            rows = np.unique(np.concatenate([rows, *(_row(UT, int(c)) for c in rivals)]))
            rows = rows[alive[rows]]
            _set_aside(U, rows, s, x, S, X, alive)
            exonerated[[link, *alts, *rivals.tolist()]] = True
            continue
        picks.append(Pick(link, rows, alts, {"sent": int(S[link]), "lost": int(X[link]),
                                             "loss_pct": round(100 * rate, 3),
                                             "p_value": float(np.exp(log_p)), "log10_p": round(log_p / np.log(10), 1)}))
        _set_aside(U, rows, s, x, S, X, alive)
        exonerated[[link, *alts]] = True
    return picks


def _set_aside(U: sparse.csr_matrix, rows: np.ndarray, s: np.ndarray, x: np.ndarray, S: np.ndarray, X: np.ndarray,
               alive: np.ndarray) -> None:
    """Take these paths out of the cover: their exchanges and losses no longer count for any link."""
    alive[rows] = False
    sub = U[rows]
    S -= sub.T @ s[rows]
    X -= sub.T @ x[rows]


def _rivals(U: sparse.csr_matrix, x: np.ndarray, rows: np.ndarray, close: np.ndarray, link: int,
            alts: list[int], lost: float) -> np.ndarray:
    """The links of `close` (likelihood within RIVAL_NATS of the pick's), other than the pick and its
    alternatives, crossed by the pick's paths that carry at least half of its losses. Losses that
    pile up by chance on one host's paths make its access link nearly as likely as the fabric link
    all of them cross (and then likelier, now and then); waiting a window or two for more evidence
    tells them apart, while naming the wrong one opens an incident that holds."""
    close = close[(close != link) & ~np.isin(close, alts)]
    lossy = rows[x[rows] > 0]
    if not len(close) or not len(lossy):
        return close[:0]
    shared = U[lossy][:, close].T @ x[lossy]
    return close[shared >= 0.5 * lost]


def cover_inflation(U: sparse.csr_matrix, UT: sparse.csr_matrix, inflation_us: np.ndarray, cand: np.ndarray,
                    *, threshold_us: float, priority: np.ndarray, min_paths: int = 2,
                    min_fraction: float = 0.75) -> list[Pick]:
    with np.errstate(invalid="ignore"):
        bad = cand & (inflation_us >= threshold_us)
        good = cand & (inflation_us < threshold_us / 2)
    if not bad.any():
        return []
    B = UT @ bad.astype(np.float64)
    G = UT @ good.astype(np.float64)
    alive = bad.copy()
    picks: list[Pick] = []
    while len(picks) < MAX_PICKS:
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (B >= min_paths) & (B >= min_fraction * (B + G))
        ids = np.flatnonzero(ok)
        if not len(ids):
            break
        score = B[ids] + 1e-6 * priority[ids]
        link = int(ids[np.argmax(score)])
        rows = _row(UT, link)
        rows = rows[alive[rows]]
        total = B[link] + G[link]
        rowset = set(rows.tolist())
        alts = [int(c) for c in ids[B[ids] == B[link]]
                if c != link and G[c] == G[link] and set(r for r in _row(UT, c) if alive[r]) == rowset]
        picks.append(Pick(link, rows, alts, {
            "paths_inflated": int(B[link]), "paths_judged": int(total),
            "inflation_us": round(float(np.median(inflation_us[rows])), 1)}))
        alive[rows] = False
        B -= U[rows].T @ np.ones(len(rows))
    return picks
