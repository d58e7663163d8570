"""The multipath optimum the controller is measured against, as linear programs (scipy HiGHS).

Every host pair may split its traffic across all the equal-cost paths routing allows (alive links
only), on the capacity left by background traffic. Two numbers:

* `max_concurrent`: the largest rate lambda every flow gets at once. It is the first level of the
  multipath max-min fair allocation (progressive filling raises all flows together until this
  level), and S / lambda is a lower bound on the completion time of a collective moving S per
  flow under *any* routing, static or changing (a time average of feasible rates is feasible).
* `max_throughput`: the largest aggregate rate with each flow at most its demand. It bounds the
  aggregate of the multipath max-min fair allocation from above (that allocation is feasible).

The LP is exact yet small because a fat tree lets commodities be aggregated without loss: host
links only see their own host pairs; between edge switches a pair's traffic splits over planes a
(X[edge pair, a]); above the aggregation layer only the pod pair and plane matter, and it splits
over cores c (Y[pod pair, a, c]).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from lab.flowsim.fabric import FatTree

METHOD = "highs-ipm"


@dataclass
class Optimum:
    max_concurrent: float  # per subflow (rate units of the capacities)
    max_throughput: float  # aggregate over all subflows
    variables: int
    seconds: float


class _Rows:
    """Sparse constraint rows collected as coordinates."""

    def __init__(self):
        self.r, self.c, self.v, self.b, self.n = [], [], [], [], 0

    def add(self, row_ids: np.ndarray, cols: np.ndarray, vals: np.ndarray | float, rhs: np.ndarray) -> None:
        self.r.append(np.asarray(row_ids) + self.n)
        self.c.append(np.asarray(cols))
        self.v.append(np.broadcast_to(np.asarray(vals, float), np.shape(cols)))
        self.b.append(np.asarray(rhs, float))
        self.n += len(rhs)

    def matrix(self, n_cols: int):
        if not self.n:
            return None, None
        m = sp.csr_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                          shape=(self.n, n_cols))
        return m, np.concatenate(self.b)


def optimum(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray,
            demand: float = np.inf) -> Optimum:
    """Both LPs for the subflows (src[i] -> dst[i]); subflows of one host pair are pooled."""
    started = time.perf_counter()
    H, h = ft.hosts, ft.half
    pair_key = src.astype(np.int64) * H + dst
    pairs, q = np.unique(pair_key, return_counts=True)          # host pairs, subflows each
    ps_, pd_ = pairs // H, pairs % H
    es, ed = ft.edge(ps_), ft.edge(pd_)
    fabric = es != ed
    m_key = es * (ft.k * h) + ed
    edge_pairs, pair_m = np.unique(m_key[fabric], return_inverse=True)
    m_es, m_ed = edge_pairs // (ft.k * h), edge_pairs % (ft.k * h)
    m_ps, m_pd = m_es // h, m_ed // h
    ea = ft.alive[H: 2 * H].reshape(-1, h)
    ac = ft.alive[2 * H:].reshape(ft.k, h, h)
    # X[m, a] exists where both edge-agg links of plane a are alive (and, between pods, some core)
    inter_m = m_ps != m_pd
    x_ok = ea[m_es] & ea[m_ed]
    x_ok[inter_m] &= (ac[m_ps[inter_m]] & ac[m_pd[inter_m]]).any(axis=2)
    xm, xa = np.nonzero(x_ok)
    # Y[pod pair, a, c] where both agg-core links are alive
    pp_key = m_ps[inter_m] * ft.k + m_pd[inter_m]
    pod_pairs, m_pp = np.unique(pp_key, return_inverse=True)
    pp_p, pp_q = pod_pairs // ft.k, pod_pairs % ft.k
    y_ok = ac[pp_p] & ac[pp_q]                                   # [pp, a, c]
    yp, ya, yc = np.nonzero(y_ok)
    n_g, n_x, n_y = pairs.size, xm.size, yp.size
    X0, Y0, n_var = n_g, n_g + n_x, n_g + n_x + n_y              # variables: R_g, X, Y

    ub, eq = _Rows(), _Rows()
    g = np.arange(n_g)
    # host links: sum of the host's pairs <= capacity (up at the source, down at the destination)
    ub.add(ps_, g, 1.0, avail[ft.link(0, 0, np.arange(H))])
    ub.add(pd_, g, 1.0, avail[ft.link(0, 1, np.arange(H))])
    # commodity conservation: sum_a X[m, a] - sum_{g in m} R_g = 0
    fg = np.flatnonzero(fabric)
    eq.add(np.concatenate([xm, pair_m]), np.concatenate([X0 + np.arange(n_x), fg]),
           np.concatenate([np.ones(n_x), -np.ones(fg.size)]), np.zeros(edge_pairs.size))
    # edge-agg links, up at the source edge and down at the destination edge
    ub.add(m_es[xm] * h + xa, X0 + np.arange(n_x), 1.0, avail[ft.link(1, 0, np.arange(H))])
    ub.add(m_ed[xm] * h + xa, X0 + np.arange(n_x), 1.0, avail[ft.link(1, 1, np.arange(H))])
    # plane conservation per (pod pair, a): sum_c Y - sum_{m in pp} X[m, a] = 0
    x_inter = np.flatnonzero(inter_m[xm])
    mi = np.full(edge_pairs.size, -1)
    mi[np.flatnonzero(inter_m)] = m_pp
    eq.add(np.concatenate([yp * h + ya, mi[xm[x_inter]] * h + xa[x_inter]]),
           np.concatenate([Y0 + np.arange(n_y), X0 + x_inter]),
           np.concatenate([np.ones(n_y), -np.ones(x_inter.size)]), np.zeros(pod_pairs.size * h))
    # agg-core links: up from the source pod, down into the destination pod
    ub.add((pp_p[yp] * h + ya) * h + yc, Y0 + np.arange(n_y), 1.0, avail[ft.link(2, 0, np.arange(H))])
    ub.add((pp_q[yp] * h + ya) * h + yc, Y0 + np.arange(n_y), 1.0, avail[ft.link(2, 1, np.arange(H))])
    A_ub, b_ub = ub.matrix(n_var)
    A_eq, b_eq = eq.matrix(n_var)

    # max throughput: maximise sum R_g, R_g <= q_g * demand
    bounds = np.zeros((n_var, 2))
    bounds[:, 1] = np.inf
    bounds[:n_g, 1] = q * demand if np.isfinite(demand) else np.inf
    c = np.zeros(n_var)
    c[:n_g] = -1.0
    tp = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method=METHOD)
    if tp.status != 0:
        raise RuntimeError(f"max-throughput LP: {tp.message}")
    # max concurrent: R_g = q_g * lam; substitute lam as the column of R (one scalar variable)
    cols = sp.csr_matrix((q.astype(float), (np.arange(n_g), np.zeros(n_g, int))), shape=(n_g, 1))
    ident = sp.identity(n_var - n_g, format="csr")
    T = sp.block_diag([cols, ident], format="csr")               # [R; X; Y] = T @ [lam; X; Y]
    c2 = np.zeros(T.shape[1])
    c2[0] = -1.0
    b2 = np.zeros((T.shape[1], 2))
    b2[:, 1] = np.inf
    b2[0, 1] = demand if np.isfinite(demand) else np.inf
    mc = linprog(c2, A_ub=A_ub @ T, b_ub=b_ub, A_eq=None if A_eq is None else A_eq @ T, b_eq=b_eq,
                 bounds=b2, method=METHOD)
    if mc.status != 0:
        raise RuntimeError(f"max-concurrent LP: {mc.message}")
    return Optimum(max_concurrent=float(-mc.fun), max_throughput=float(-tp.fun), variables=n_var,
                   seconds=time.perf_counter() - started)


def concurrent_upper_bound(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray) -> float:
    """An upper bound on `max_concurrent` from cuts, computable at any size: per host link, per
    edge switch's uplinks (downlinks) against the subflows that must leave (enter) it, per pod's
    core uplinks (downlinks) against the subflows leaving (entering) the pod. Every subflow's
    traffic crosses each cut it spans whatever the split, so lambda * subflows <= cut capacity.
    Tight for one fault (tests compare it with the LP); looser when faults combine across planes."""
    H, h = ft.hosts, ft.half
    bounds = [np.inf]

    def cut(capacity_by_group: np.ndarray, users: np.ndarray) -> None:
        n = np.bincount(users, minlength=capacity_by_group.size)
        used = n > 0
        if used.any():
            bounds.append(float(np.min(capacity_by_group[used] / n[used])))

    up, down = avail[ft.link(0, 0, np.arange(H))], avail[ft.link(0, 1, np.arange(H))]
    cut(up, src)
    cut(down, dst)
    es, ed = ft.edge(src), ft.edge(dst)
    fab = es != ed
    cut(avail[ft.link(1, 0, np.arange(H))].reshape(-1, h).sum(axis=1), es[fab])
    cut(avail[ft.link(1, 1, np.arange(H))].reshape(-1, h).sum(axis=1), ed[fab])
    ps, pd = ft.pod(src), ft.pod(dst)
    inter = ps != pd
    cut(avail[ft.link(2, 0, np.arange(H))].reshape(ft.k, -1).sum(axis=1), ps[inter])
    cut(avail[ft.link(2, 1, np.arange(H))].reshape(ft.k, -1).sum(axis=1), pd[inter])
    return min(bounds)


def whole_subflow_upper_bound(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray) -> float:
    """An upper bound on the rate every subflow can get at once when each subflow keeps to one path
    (what source-port steering does: a QP's packets all hash alike), from the same cuts as
    `concurrent_upper_bound`: if every subflow gets r, a link of capacity c carries at most
    floor(c / r) of them, so the n subflows that must cross a cut of links c_1..c_m need
    sum floor(c_i / r) >= n. The largest such r is one of c_i / q for whole q. Below the fluid bound
    where a cut's subflows do not divide into its links (a leaf that lost an uplink: 72 subflows
    over 17 links of 4 need some link to carry 5)."""
    H, h = ft.hosts, ft.half
    best = concurrent_upper_bound(ft, src, dst, avail)  # host links: one path each, the fluid bound holds

    @functools.cache
    def largest_rate(capacities: tuple[float, ...], counts: tuple[int, ...], n: int) -> float:
        # the largest r = c_i / q with sum floor(c / r) >= n; r only falls with q, so walk the
        # candidate rates from the top (links of one capacity counted once, with their number)
        c, m = np.array(capacities), np.array(counts)
        rates = np.unique((c[:, None] / np.arange(1, n + 1)).ravel())[::-1]
        fits = (np.floor(c[None, :] / rates[:, None] + 1e-9) * m).sum(axis=1) >= n
        return float(rates[np.argmax(fits)]) if fits.any() else 0.0

    def cut(caps: np.ndarray, users: np.ndarray) -> None:
        nonlocal best
        n = np.bincount(users, minlength=caps.shape[0])
        for g in np.flatnonzero(n):
            c, m = np.unique(caps[g][caps[g] > 0], return_counts=True)
            best = min(best, largest_rate(tuple(c.tolist()), tuple(m.tolist()), int(n[g])))

    es, ed = ft.edge(src), ft.edge(dst)
    fab = es != ed
    cut(avail[ft.link(1, 0, np.arange(H))].reshape(-1, h), es[fab])
    cut(avail[ft.link(1, 1, np.arange(H))].reshape(-1, h), ed[fab])
    ps, pd = ft.pod(src), ft.pod(dst)
    inter = ps != pd
    cut(avail[ft.link(2, 0, np.arange(H))].reshape(ft.k, -1), ps[inter])
    cut(avail[ft.link(2, 1, np.arange(H))].reshape(ft.k, -1), pd[inter])
    return best
