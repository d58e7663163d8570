"""The simulator's fabric: a k-ary 3-tier fat tree (Al-Fares et al.), its directed links with
capacities, link failures, and ECMP routing by a per-switch 5-tuple hash, all as numpy arrays.

k pods, each with k/2 edge (leaf) and k/2 aggregation switches; (k/2)^2 core switches; k/2 hosts
(one GPU NIC each) per edge switch: k^3/4 hosts (k=36: 11,664). Core (a, c) connects to
aggregation switch a of every pod, so an inter-pod path is fixed by its plane a (the aggregation
index, chosen by the source edge's hash) and its core c (chosen by the aggregation switch's hash):
(k/2)^2 equal-cost paths; an intra-pod path by a alone: k/2 paths; hosts of one edge: one path.

Links are numbered by tier so every quantity is an array indexed by link id (H = k^3/4 = the
number of links in each tier and direction):
  directed id = (2 * tier + dir) * H + j, tier 0 host-edge (j = host), 1 edge-agg
  (j = edge * k/2 + a), 2 agg-core (j = (pod * k/2 + a) * k/2 + c); dir 0 = up, 1 = down.
  undirected id = tier * H + j.
A path is its directed link ids, padded to 6 with -1. Steering sees paths as the product does:
a frozenset of undirected link names `dev:port--dev:port` (fabric links only: every path of a
host pair shares its two host links, so they are never avoidable).
"""

from __future__ import annotations

import numpy as np

PAD = -1
UDP, ROCE_DPORT = 17, 4791
PORT_BASE, PORT_SPAN = 0xC000, 0x4000  # RoCEv2 source ports from flow labels: 49152..65535


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of each element (uint64 arithmetic wraps)."""
    x = x.astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def five_tuple_hash(src: np.ndarray, dst: np.ndarray, sport: np.ndarray, switch: np.ndarray | int,
                    seed: int = 0) -> np.ndarray:
    """The ECMP hash a switch computes over (src, dst, proto UDP, sport, dport 4791); `switch` salts
    it per switch as real ASICs do (without a salt every tier would pick alike: polarisation)."""
    key = mix64(np.asarray(src, np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                ^ np.asarray(dst, np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
    key = mix64(key ^ ((np.asarray(sport, np.uint64) << np.uint64(24))
                       | np.uint64((UDP << 16) | ROCE_DPORT)))
    return mix64(key ^ (np.atleast_1d(np.asarray(switch, np.uint64)) + np.uint64(seed)) * np.uint64(0xD6E8FEB86659FD93))


def nth_true(mask: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Per row, the column of the j-th (0-based) True of `mask` (rows with fewer: undefined)."""
    return np.argmax(np.cumsum(mask, axis=1) > j[:, None], axis=1)


class FatTree:
    def __init__(self, k: int, host_gbps: float = 400.0, fabric_gbps: float = 400.0, seed: int = 0):
        if k < 2 or k % 2:
            raise ValueError(f"k must be even and >= 2, got {k}")
        self.k, self.half, self.seed = k, k // 2, seed
        self.hosts = k ** 3 // 4
        H = self.hosts
        self.n_links = 6 * H
        self.capacity = np.empty(6 * H)
        self.capacity[: 2 * H] = host_gbps
        self.capacity[2 * H:] = fabric_gbps
        self.alive = np.ones(3 * H, bool)  # per undirected link
        self._names: list[str] | None = None
        self._path_sets: dict[tuple[int, int, int, int], frozenset[str]] = {}

    # --- numbering -------------------------------------------------------------------------
    def pod(self, host):
        return np.asarray(host) // (self.half * self.half)

    def edge(self, host):
        return np.asarray(host) // self.half

    def link(self, tier: int, direction: int, j):
        return (2 * tier + direction) * self.hosts + np.asarray(j)

    def edge_agg(self, edge, a):
        return np.asarray(edge) * self.half + np.asarray(a)

    def agg_core(self, pod, a, c):
        return (np.asarray(pod) * self.half + np.asarray(a)) * self.half + np.asarray(c)

    def undirected(self, directed):
        d = np.asarray(directed)
        return (d // (2 * self.hosts)) * self.hosts + d % self.hosts

    def directions(self, undirected):
        """Both directed ids (up, down) of undirected links."""
        u = np.asarray(undirected)
        tier, j = u // self.hosts, u % self.hosts
        return self.link(tier, 0, j), self.link(tier, 1, j)

    @property
    def names(self) -> list[str]:
        """Undirected link names, `dev:port--dev:port` as the product names links."""
        if self._names is None:
            h, k2 = self.half, self.half * self.half
            names = [f"h{x}:eth0--e{x // k2}-{x // h % h}:p{x % h}" for x in range(self.hosts)]
            names += [f"e{e // h}-{e % h}:u{a}--a{e // h}-{a}:d{e % h}" for e in range(self.k * h) for a in range(h)]
            names += [f"a{p}-{a}:u{c}--c{a}-{c}:d{p}" for p in range(self.k) for a in range(h) for c in range(h)]
            self._names = names
        return self._names

    # --- faults ------------------------------------------------------------------------------
    def fail(self, undirected) -> None:
        """Links down: routing withdraws them (no path crosses them) and they carry nothing."""
        self.alive[np.asarray(undirected)] = False

    def available(self, background: np.ndarray | None = None) -> np.ndarray:
        """Capacity per directed link left for the steerable traffic (down links: 0)."""
        up, down = self.directions(np.arange(3 * self.hosts))
        avail = self.capacity.copy()
        avail[up[~self.alive]] = 0.0
        avail[down[~self.alive]] = 0.0
        if background is not None:
            avail = np.maximum(avail - background, 0.0)
        return avail

    # --- routing -----------------------------------------------------------------------------
    def route(self, src: np.ndarray, dst: np.ndarray, sport: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ECMP as the switches forward: the source edge hashes the 5-tuple over its aggregation
        uplinks that still reach the destination, that aggregation switch over its core uplinks
        that do. Returns (plane a, core c) per flow: -1 where not used (same edge, same pod's c)
        and a = -2 where no path is left."""
        src, dst, sport = (np.asarray(x, np.int64) for x in (src, dst, sport))
        h = self.half
        es, ed, ps, pd = self.edge(src), self.edge(dst), self.pod(src), self.pod(dst)
        ea = self.alive[self.hosts: 2 * self.hosts].reshape(self.k * h, h)  # [edge, a]
        ac = self.alive[2 * self.hosts:].reshape(self.k, h, h)              # [pod, a, c]
        a = np.full(src.shape, PAD, np.int64)
        c = np.full(src.shape, PAD, np.int64)
        fabric = es != ed
        inter = fabric & (ps != pd)
        planes = ea[es] & ea[ed]  # [flow, a]
        cores = ac[ps] & ac[pd]   # [flow, a, c]: both ends of the core hop alive
        planes[inter] &= cores[inter].any(axis=2)
        n = planes.sum(axis=1)
        ok = fabric & (n > 0)
        a[fabric & (n == 0)] = -2
        hs = five_tuple_hash(src[ok], dst[ok], sport[ok], es[ok], self.seed)
        a[ok] = nth_true(planes[ok], (hs % n[ok].astype(np.uint64)).astype(np.int64))
        idx = np.flatnonzero(inter & ok)
        if idx.size:
            valid = cores[idx, a[idx]]
            agg_id = 1_000_000 + ps[idx] * h + a[idx]
            hc = five_tuple_hash(src[idx], dst[idx], sport[idx], agg_id, self.seed)
            c[idx] = nth_true(valid, (hc % valid.sum(axis=1).astype(np.uint64)).astype(np.int64))
        return a, c

    def path_links(self, src, dst, a, c) -> np.ndarray:
        """Directed link ids of each flow's path, shape (flows, 6), padded with -1."""
        src, dst, a, c = (np.asarray(x, np.int64) for x in (src, dst, a, c))
        es, ed, ps, pd = self.edge(src), self.edge(dst), self.pod(src), self.pod(dst)
        out = np.full((src.size, 6), PAD, np.int64)
        out[:, 0] = self.link(0, 0, src)
        out[:, 1] = self.link(0, 1, dst)
        fab = a >= 0
        out[fab, 2] = self.link(1, 0, self.edge_agg(es[fab], a[fab]))
        out[fab, 3] = self.link(1, 1, self.edge_agg(ed[fab], a[fab]))
        core = fab & (c >= 0)
        out[core, 4] = self.link(2, 0, self.agg_core(ps[core], a[core], c[core]))
        out[core, 5] = self.link(2, 1, self.agg_core(pd[core], a[core], c[core]))
        return out

    def path_set(self, src: int, dst: int, a: int, c: int) -> frozenset[str]:
        """The fabric links of one path as the steering core sees them (names, undirected)."""
        es, ed = int(src) // self.half, int(dst) // self.half
        key = (es, ed, int(a), int(c))
        hit = self._path_sets.get(key)
        if hit is None:
            names, H = self.names, self.hosts
            if a < 0:
                hit = frozenset()
            else:
                elems = [H + es * self.half + a, H + ed * self.half + a]
                if c >= 0:
                    ps, pd = es // self.half, ed // self.half
                    elems += [2 * H + int(self.agg_core(ps, a, c)), 2 * H + int(self.agg_core(pd, a, c))]
                hit = frozenset(names[u] for u in elems)
            self._path_sets[key] = hit
        return hit

    def ecmp_path_count(self, src: int, dst: int) -> int:
        """Equal-cost paths between two hosts with every link alive (the textbook counts)."""
        if self.edge(src) == self.edge(dst):
            return 1
        return self.half if self.pod(src) == self.pod(dst) else self.half * self.half
