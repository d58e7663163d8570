"""Max-min fair rates by progressive filling, vectorised over a sparse link x flow incidence.

Every unfrozen flow's rate rises by the same amount until a link saturates (or a flow reaches its
demand); the flows crossing a saturated link freeze; repeat. One filling step is two sparse
mat-vecs (flows per link, saturated links per flow), and all links that saturate at the same level
freeze together, so the step count is the number of distinct rate levels, not of flows.

`completion_time` runs a collective whose flows all carry the same bytes: rates are refilled each
time a batch of flows finishes (flows at one level finish together), as congestion control would
hand the freed capacity to the flows still running.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

PAD = -1
REL_TOL = 1e-9


def incidence(paths: np.ndarray, n_links: int) -> sp.csr_matrix:
    """Link x flow 0/1 matrix of paths given as (flows, hops) link ids padded with -1."""
    flows, hops = paths.shape
    cols = np.repeat(np.arange(flows), hops)
    rows = paths.ravel()
    keep = rows != PAD
    data = np.ones(int(keep.sum()))
    return sp.csr_matrix((data, (rows[keep], cols[keep])), shape=(n_links, flows))


def maxmin_rates(paths: np.ndarray, capacity: np.ndarray, demand: np.ndarray | None = None,
                 matrix: sp.csr_matrix | None = None) -> np.ndarray:
    """Max-min fair rate per flow. `paths`: (flows, hops) link ids, -1 padded; `capacity`: per
    link; `demand`: optional per-flow cap (inf = elastic). A flow over a zero-capacity link gets 0."""
    A = (matrix if matrix is not None else incidence(paths, capacity.size)).tocsc()
    flows = A.shape[1]
    rate = np.zeros(flows)
    left = capacity.astype(float).copy()
    tol = REL_TOL * max(float(capacity.max(initial=0.0)), 1.0)
    cols = np.flatnonzero(np.diff(A.indptr) > 0)  # a flow with no link is not limited here
    if demand is not None:
        cols = cols[demand[cols] > 0]
    # the filling runs on the columns of the flows still rising (`cols[on]`), compacted as they
    # freeze: the step count is the number of rate levels (thousands at full load at k=36), so
    # each step should cost what the flows still rising cross, not the whole fabric
    on = np.zeros(0, bool)
    while cols.size:
        if on.size == 0 or on.sum() < 0.7 * on.size:
            cols = cols[on] if on.size else cols
            if not cols.size:
                break
            sub = A[:, cols].tocsr()
            sub_t, on = sub.T.tocsr(), np.ones(cols.size, bool)
        n = sub @ on.astype(float)
        loaded = np.flatnonzero(n > 0)
        inc = float(np.min(left[loaded] / n[loaded]))
        if demand is not None:
            inc = min(inc, float(np.min(demand[cols[on]] - rate[cols[on]])))
        inc = max(inc, 0.0)
        rate[cols[on]] += inc
        left[loaded] -= inc * n[loaded]
        saturated = np.zeros(left.size)
        saturated[loaded[left[loaded] <= tol]] = 1.0
        frozen = (sub_t @ saturated) > 0
        if demand is not None:
            frozen |= rate[cols] >= demand[cols] - tol
        on &= ~frozen
        if not on.any():
            break
    return rate


def completion_time(paths: np.ndarray, capacity: np.ndarray, size: float) -> tuple[float, np.ndarray]:
    """Time for every flow to move `size` (same units as capacity x time) under max-min fair
    sharing refilled as flows finish; returns (collective completion time, per-flow finish times).
    A flow that cannot move (rate 0) makes the time infinite."""
    A = incidence(paths, capacity.size).tocsc()
    flows = paths.shape[0]
    remaining = np.full(flows, float(size))
    finish = np.full(flows, np.inf)
    running = np.arange(flows)
    t = 0.0
    while running.size:
        sub = A[:, running].tocsr()
        rate = maxmin_rates(paths[running], capacity, matrix=sub)
        if not np.all(rate > 0):
            return np.inf, finish
        left = remaining[running] / rate
        dt = float(left.min())
        t += dt
        remaining[running] -= rate * dt
        done = remaining[running] <= REL_TOL * size * 1e3
        finish[running[done]] = t
        running = running[~done]
    return t, finish
