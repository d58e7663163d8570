"""A global path planner: one path for every subflow of the job at once, so that every subflow can get
a target rate r (issue #26, docs/simulator.md "Full load").

With whole subflows at rate r a directed link of capacity c (what background traffic leaves) carries
at most floor(c / r) of them: its *slots*. Planning is then two capacitated edge colourings
(colouring.py): the subflows between edge switches get a plane a (the aggregation index) within the
slots of the source edge's uplink a and the destination edge's downlink a; within each plane the
inter-pod subflows get a core c within the slots of the source pod's and the destination pod's
agg-core links. A subflow neither step could place is repaired greedily (any path with a slot free on
all its links); if one is still left the rate is lowered to the next candidate (a capacity / a whole
number) and the planning is redone. The first rate tried is the whole-subflow bound, so a plan found at
it is optimal among whole-subflow routings.

Splitting: where a cut's links do not divide into whole subflows (an edge with two uplinks mostly
taken by another tenant), no whole-subflow routing reaches the fluid bound; `split_factor` then asks
for m times as many QPs per pair (each carrying 1/m of the pair's bytes, as NCCL spreads a connection's
data over its QPs), chosen only where it raises the whole-subflow bound.

A plan is paths (a, c); `ports_for` finds, per subflow, a RoCE source port the switches' ECMP hash
sends along that path: one the host agent has already traced if there is one, otherwise by searching
the port space with the hash (the model assumes the hash and its per-switch seeds are known to the
agent, or that it traces ports until one lands there: docs/simulator.md says what that costs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.flowsim.colouring import colour
from lab.flowsim.fabric import PORT_BASE, PORT_SPAN, FatTree, five_tuple_hash
from lab.flowsim.optimum import concurrent_upper_bound, whole_subflow_upper_bound

EPS = 1e-9
UNBOUND = 1 << 40


@dataclass
class Plan:
    plane: np.ndarray  # per subflow: aggregation index a (-1: both hosts on one edge)
    core: np.ndarray   # per subflow: core index c within the plane (-1: not between pods)
    rate: float        # every subflow can get this at once (each link carries at most floor(avail / rate))
    tries: int         # rates tried, the last one kept


def slots(avail: np.ndarray, rate: float) -> np.ndarray:
    """Whole subflows of `rate` each directed link can carry."""
    return np.floor(avail / rate + EPS).astype(np.int64)


def split_factor(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray, max_split: int = 4,
                 min_gain: float = 0.02) -> int:
    """How many QPs each subflow should become (1, 2, 4 ... up to `max_split`): the fewest whose
    whole-subflow bound (per original subflow) is within `min_gain` of the best of them (more QPs cost
    NIC state and connections, so only a real gain is worth them)."""
    fluid = concurrent_upper_bound(ft, src, dst, avail)
    splits = [1]
    while 2 * splits[-1] <= max_split:
        splits.append(2 * splits[-1])
    bounds = [whole_subflow_upper_bound(ft, src, dst, avail)]
    for m in splits[1:]:
        if bounds[0] >= fluid * (1 - EPS):
            break  # whole subflows already reach the fluid bound
        bounds.append(m * whole_subflow_upper_bound(ft, np.repeat(src, m), np.repeat(dst, m), avail))
    best = max(bounds)
    return next(m for m, b in zip(splits, bounds) if b >= best * (1 - min_gain))


def candidate_rates(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray,
                    down_to: float = 0.25) -> np.ndarray:
    """The rates a whole-subflow plan can be limited at, from the whole-subflow bound down to `down_to`
    of it: each fabric link's capacity / a whole number of subflows."""
    top = whole_subflow_upper_bound(ft, src, dst, avail)
    caps = np.unique(avail[2 * ft.hosts:])
    caps = caps[caps > 0]
    most = int(caps.max() / (down_to * top)) + 1 if caps.size else 1
    rates = np.unique(np.concatenate([caps / q for q in range(1, most + 1)] + [[top]]))
    return rates[(rates <= top * (1 + EPS)) & (rates >= down_to * top * (1 - EPS))][::-1]


def plan(ft: FatTree, src: np.ndarray, dst: np.ndarray, avail: np.ndarray, keep: np.ndarray | None = None,
         prefer_plane: np.ndarray | None = None, prefer_core: np.ndarray | None = None, max_tries: int = 6,
         attempts: int = 8, seed: int = 0, only_preferred: bool = False) -> Plan:
    """Paths for the subflows src[i] -> dst[i] at the highest candidate rate a plan is found for.
    `keep` (directed links): links that keep at least one slot whatever the rate (what the blast-radius
    limits refused to drain). `prefer_plane` (subflows x planes) and `prefer_core` (subflows x planes x
    cores): paths the host already knows a port for, taken among equals. Each rate gets `attempts`
    colourings in different random orders (with uneven slots one order can strand a subflow that
    another places) before the next lower rate is tried. `only_preferred`: no other path is used (the
    agent keeps to the ports it has traced)."""
    rates = candidate_rates(ft, src, dst, avail)
    last = None
    for i, rate in enumerate(rates[:max_tries]):
        s = slots(avail, rate)
        if keep is not None:
            s[keep & (avail > 0)] = np.maximum(s[keep & (avail > 0)], 1)
        for attempt in range(attempts):
            a, c, ok = plan_paths(ft, src, dst, s, prefer_plane, prefer_core, seed + attempt, only_preferred)
            last = Plan(a, c, float(rate), i + 1)
            if ok:
                return last
    if last is None:
        raise ValueError("no fabric capacity to plan on")
    raise RuntimeError(f"no plan found at {max_tries} rates down to {last.rate:.3g}")


def plan_paths(ft: FatTree, src: np.ndarray, dst: np.ndarray, s: np.ndarray, prefer_plane=None,
               prefer_core=None, seed: int = 0, only_preferred: bool = False) -> tuple[np.ndarray, np.ndarray, bool]:
    """(plane, core, every subflow placed) within the slots `s` per directed link."""
    if only_preferred and (prefer_plane is None or prefer_core is None):
        raise ValueError("only_preferred needs prefer_plane and prefer_core")
    H, h = ft.hosts, ft.half
    rng = np.random.default_rng(seed)
    es, ed, ps, pd = ft.edge(src), ft.edge(dst), ft.pod(src), ft.pod(dst)
    a = np.full(src.size, -1, np.int64)
    c = np.full(src.size, -1, np.int64)
    fab = np.flatnonzero(es != ed)
    inter = ps != pd
    up_e, dn_e = s[ft.link(1, 0, np.arange(H))].reshape(-1, h), s[ft.link(1, 1, np.arange(H))].reshape(-1, h)
    up_c = s[ft.link(2, 0, np.arange(H))].reshape(ft.k, h, h)
    dn_c = s[ft.link(2, 1, np.arange(H))].reshape(ft.k, h, h)
    # a plane is open to an inter-pod subflow only if some core of it has slots at both pods
    core_ok = (up_c[ps[fab]] > 0) & (dn_c[pd[fab]] > 0)                  # [subflow, a, c]
    if only_preferred:
        core_ok &= prefer_core[fab]
    allowed = np.where(inter[fab, None], core_ok.any(axis=2), True)
    if only_preferred:
        allowed &= prefer_plane[fab]
    # a pod's inter-pod subflows in plane a share its core links of that plane: second-level capacities
    pod_of = (np.where(inter[fab], ps[fab], -1), np.where(inter[fab], pd[fab], -1))
    # (only where the core links hold less than the pod's edge links can send: elsewhere they cannot bind
    # and are left unchecked)
    pod_cap = tuple(np.where(cores.sum(axis=2) >= edges.reshape(ft.k, h, h).sum(axis=1), UNBOUND,
                             cores.sum(axis=2)) for cores, edges in ((up_c, up_e), (dn_c, dn_e)))  # [pod, a]
    # inter-pod subflows first: they are the ones a pod's core links can bind; the intra-pod ones then
    # fill the edge slots left in those planes
    order = np.concatenate([rng.permutation(np.flatnonzero(inter[fab])), rng.permutation(np.flatnonzero(~inter[fab]))])
    a[fab] = colour(es[fab], ed[fab], up_e, dn_e, order,
                    None if prefer_plane is None else prefer_plane[fab], allowed, pod_of, pod_cap)
    for plane in range(h):
        sub = np.flatnonzero(inter & (a == plane))
        if sub.size:
            pc = None if prefer_core is None else prefer_core[sub, plane]
            c[sub] = colour(ps[sub], pd[sub], up_c[:, plane], dn_c[:, plane], rng.permutation(sub.size), pc,
                            pc if only_preferred else None)
    todo = fab[(a[fab] < 0) | (inter[fab] & (c[fab] < 0))]
    if todo.size:
        _repair(ft, src, dst, a, c, s, todo, (prefer_plane, prefer_core) if only_preferred else None)
    placed = (a[fab] >= 0).all() and (c[fab][inter[fab]] >= 0).all()
    return a, c, bool(placed)


def _repair(ft: FatTree, src, dst, a, c, s, todo, only=None) -> None:
    """Places the subflows in `todo` one by one on any path with a slot free on each of its links (if
    `only` = (planes, planes x cores) per subflow is given: one of those)."""
    h = ft.half
    a[todo], c[todo] = -1, -1
    room = s - _usage(ft, src, dst, a, c)
    up_e = room[ft.link(1, 0, np.arange(ft.hosts))].reshape(-1, h)  # copies, one per tier and direction
    dn_e = room[ft.link(1, 1, np.arange(ft.hosts))].reshape(-1, h)
    up_c = room[ft.link(2, 0, np.arange(ft.hosts))].reshape(ft.k, h, h)
    dn_c = room[ft.link(2, 1, np.arange(ft.hosts))].reshape(ft.k, h, h)
    for f in todo.tolist():
        es, ed, ps, pd = int(src[f]) // h, int(dst[f]) // h, int(src[f]) // (h * h), int(dst[f]) // (h * h)
        edge_room = np.minimum(up_e[es], dn_e[ed])
        if only is not None:
            edge_room = np.where(only[0][f], edge_room, -1)
            best = int(np.argmax(edge_room))
            if edge_room[best] >= 1:
                a[f] = best
                up_e[es, best] -= 1
                dn_e[ed, best] -= 1
            continue
        r = np.minimum(edge_room[:, None], np.minimum(up_c[ps], dn_c[pd]))   # [a, c]
        if only is not None:
            r = np.where(only[1][f], r, -1)
        best_a, best_c = np.unravel_index(int(np.argmax(r)), r.shape)
        if r[best_a, best_c] >= 1:
            a[f], c[f] = best_a, best_c
            up_e[es, best_a] -= 1
            dn_e[ed, best_a] -= 1
            up_c[ps, best_a, best_c] -= 1
            dn_c[pd, best_a, best_c] -= 1


def _usage(ft: FatTree, src, dst, a, c) -> np.ndarray:
    paths = ft.path_links(src, dst, a, c)
    return np.bincount(paths[paths >= 0], minlength=ft.n_links)


def ports_for(ft: FatTree, src: np.ndarray, dst: np.ndarray, a: np.ndarray, c: np.ndarray,
              known_port: np.ndarray | None = None, known_a: np.ndarray | None = None,
              known_c: np.ndarray | None = None, block: int = 256, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """A source port per subflow that ECMP routes along its planned path (a, c). `known_*` (subflows x
    ports): ports already traced for the subflow's host pair and their paths; the first that matches is
    taken. Others are searched with the hash, a block of ports at a time from a per-subflow offset (so
    QPs of one pair on one path get different ports). Returns (ports, traced: the port was known)."""
    n = src.size
    port = np.full(n, -1, np.int64)
    traced = np.zeros(n, bool)
    if known_port is not None:
        hit = (known_a == a[:, None]) & (known_c == c[:, None])
        any_hit = hit.any(axis=1)
        port[any_hit] = known_port[any_hit, np.argmax(hit[any_hit], axis=1)]
        traced = any_hit
    same_edge = a < 0
    port[same_edge & (port < 0)] = PORT_BASE
    rank_a, n_a, rank_c, n_c = _ranks(ft, src, dst, a, c)
    start = (np.arange(n, dtype=np.int64) * 7919) % PORT_SPAN
    offset = 0
    while offset < PORT_SPAN:
        todo = np.flatnonzero(port < 0)
        if not todo.size:
            break
        for lo in range(0, todo.size, chunk):
            t = todo[lo: lo + chunk]
            ports = PORT_BASE + (start[t, None] + offset + np.arange(block)) % PORT_SPAN   # [t, block]
            s, d = src[t, None], dst[t, None]
            ok = five_tuple_hash(s, d, ports, ft.edge(s), ft.seed) % n_a[t, None].astype(np.uint64) \
                == rank_a[t, None].astype(np.uint64)
            core = c[t] >= 0
            if core.any():
                agg = 1_000_000 + ft.pod(s) * ft.half + a[t, None]
                hc = five_tuple_hash(s, d, ports, agg, ft.seed) % np.maximum(n_c[t, None], 1).astype(np.uint64)
                ok &= ~core[:, None] | (hc == rank_c[t, None].astype(np.uint64))
            found = ok.any(axis=1)
            port[t[found]] = ports[found, np.argmax(ok[found], axis=1)]
        offset += block
    if (port < 0).any():
        raise RuntimeError(f"{int((port < 0).sum())} planned paths have no source port")
    return port, traced


def _ranks(ft: FatTree, src, dst, a, c):
    """Per subflow: the index of plane a among those ECMP chooses from at the source edge, and how many
    there are; the same for core c at the aggregation switch (as FatTree.route counts them)."""
    H, h = ft.hosts, ft.half
    es, ed, ps, pd = ft.edge(src), ft.edge(dst), ft.pod(src), ft.pod(dst)
    ea = ft.alive[H: 2 * H].reshape(-1, h)
    ac = ft.alive[2 * H:].reshape(ft.k, h, h)
    inter = ps != pd
    planes = ea[es] & ea[ed]
    cores = ac[ps] & ac[pd]                                                 # [flow, a, c]
    planes[inter] &= cores[inter].any(axis=2)
    aa = np.maximum(a, 0)
    rank_a = np.where(np.arange(h)[None, :] < aa[:, None], planes, False).sum(axis=1)
    valid = cores[np.arange(src.size), aa]                                   # [flow, c]
    cc = np.maximum(c, 0)
    rank_c = np.where(np.arange(h)[None, :] < cc[:, None], valid, False).sum(axis=1)
    return rank_a, np.maximum(planes.sum(axis=1), 1), rank_c, valid.sum(axis=1)
