"""Synthetic host clocks and the ClockEdges a perfect estimator would report (plus noise): the
ground truth of tests/test_clock_solve.py and bench/clock_solve.py.

Host h's clock: clock_h(t) = t + o_h + r_h * (t - ref) / 1e9 (o in ns, r in ppb). All arithmetic
is relative to `ref` (ns since the epoch are past float precision).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nms.records import ClockEdge

W_S = 2.0
W_NS = 2 * 10**9


@dataclass
class Fabric:
    hosts: list[str]
    o: np.ndarray  # offsets at ref (ns)
    r: np.ndarray  # drifts (ppb)
    ref: int  # a slot start (fabric and true time nearly agree)

    @classmethod
    def random(cls, n: int, rng, ref: int, offset_ns: float = 10e6, drift_ppb: float = 50e3, prefix: str = "h"):
        return cls([f"{prefix}{i}" for i in range(n)], rng.uniform(-offset_ns, offset_ns, n),
                   rng.uniform(-drift_ppb, drift_ppb, n), ref)

    def truth(self, idx: list[int] | None = None) -> dict[str, tuple[float, float]]:
        """host -> (offset from fabric time at fabric time `ref`, drift vs fabric time in ppb), fabric
        time being the mean clock of the hosts in `idx` (default all)."""
        idx = list(range(len(self.hosts))) if idx is None else idx
        o, r = self.o[idx] / 1.0, self.r[idx] / 1e9
        t = -o.mean() / (1 + r.mean())  # true time (rel. ref) when the mean clock reads ref
        return {self.hosts[i]: (t * (1 + ri) + oi, ((1 + ri) / (1 + r.mean()) - 1) * 1e9)
                for i, oi, ri in zip(idx, o, r)}

    def edge(self, a: int, b: int, window_start: int, rng=None, noise_ns: float = 0.0,
             method: str = "svm", bound_ns: float | None = None) -> ClockEdge:
        """The exact line theta(t) = clock_b - clock_a over host a's window starting at
        window_start (host a's clock), plus gaussian noise on offset and drift."""
        ra, rb = self.r[a] / 1e9, self.r[b] / 1e9
        u = window_start - self.ref  # host a's clock reading, rel. ref
        t = (u - self.o[a]) / (1 + ra)  # true time then
        offset = t * (1 + rb) + self.o[b] - u
        drift = ((1 + rb) / (1 + ra) - 1) * 1e9
        if noise_ns:
            offset += rng.normal(0, noise_ns)
            drift += rng.normal(0, noise_ns / (W_S / 2))  # a line fit over the window: ~noise per half window
        return ClockEdge.model_construct(host_a=self.hosts[a], host_b=self.hosts[b], method=method,
                                         window_start=window_start, window_s=W_S, offset_ns=float(offset),
                                         drift_ppb=float(drift), bound_ns=noise_ns if bound_ns is None else bound_ns,
                                         pure_pairs=20)


def ring_with_chords(n: int, chords: int, rng, offset: int = 0) -> list[tuple[int, int]]:
    links = {(i, (i + 1) % n) for i in range(n)}
    while len(links) < n + chords:
        a, b = (int(v) for v in rng.choice(n, 2, replace=False))
        if (b, a) not in links:
            links.add((a, b))
    return [(a + offset, b + offset) for a, b in sorted(links)]


def random_peers(n: int, k: int, rng) -> list[tuple[int, int]]:
    """Each host probes k random others (the service's peer plan is same-leaf + K random)."""
    out = []
    for a in range(n):
        peers = rng.choice(n - 1, k, replace=False)
        out += [(a, int(p) + (p >= a)) for p in peers]
    return out


class ProbedFabric:
    """Probe exchanges between hosts with hidden clocks (a `Fabric`), as the agents' ClockSync sees
    them: the input of the end-to-end coverage test of the clock bounds.

    A directed path's one-way delay is its base (8 us, plus a constant asymmetry of up to
    `asym_ns` each way) + the sender's egress queue at that instant + per-packet jitter. Pure
    packets (the coded pair kept its spacing, `pure` of them) get only stamp noise (exponential,
    `stamp_ns`); the others queueing of `queue_ns` on average (exponential). A loaded host's egress
    queue is a standing queue, the same for both packets of a pair (purity cannot see it): each
    quarter second it is empty or uniform in [0, standing_ns], and it delays the host's probes and
    its replies alike. `shift` lengthens one direction of one pair from a given time (a path moved).
    """

    def __init__(self, fabric: Fabric, pairs: list[tuple[int, int]], rng, *, rate: float = 20.0,
                 asym_ns: float = 100.0, stamp_ns: float = 300.0, queue_ns: float = 20_000.0, pure: float = 0.35,
                 loaded: dict[int, float] | None = None, busy: float = 0.5,
                 shift: tuple[int, int, float, float] | None = None):
        self.fabric, self.pairs, self.rng, self.rate = fabric, pairs, rng, rate
        self.base = {p: 8_000.0 + rng.uniform(-asym_ns, asym_ns) for a, b in pairs for p in ((a, b), (b, a))}
        self.stamp_ns, self.queue_ns, self.pure = stamp_ns, queue_ns, pure
        self.loaded, self.busy = loaded or {}, busy
        self.shift = shift  # (from host, to host, extra ns, from true time s)
        self._queues: dict[tuple[int, int], float] = {}

    def _queue(self, host: int, t_ns: np.ndarray) -> np.ndarray:
        top = self.loaded.get(host)
        if not top:
            return np.zeros(len(t_ns))
        out = np.empty(len(t_ns))
        for i, q in enumerate((t_ns // 250e6).astype(np.int64).tolist()):
            if (host, q) not in self._queues:
                self._queues[host, q] = self.rng.uniform(0, top) if self.rng.random() < self.busy else 0.0
            out[i] = self._queues[host, q]
        return out

    def _delay(self, src: int, dst: int, t_ns: np.ndarray, pure: np.ndarray) -> np.ndarray:
        d = self.base[src, dst] + self._queue(src, t_ns)
        if self.shift and (src, dst) == self.shift[:2]:
            d = d + np.where(t_ns >= self.shift[3] * 1e9, self.shift[2], 0.0)
        jitter = np.where(pure, self.rng.exponential(self.stamp_ns, len(t_ns)),
                          self.rng.exponential(self.queue_ns, len(t_ns)))
        return d + jitter

    def _clock(self, h: int, t_ns: np.ndarray) -> np.ndarray:
        """Host h's clock reading (rel. ref) at true time t (rel. ref)."""
        return t_ns + self.fabric.o[h] + self.fabric.r[h] * t_ns / 1e9

    def exchanges(self, a: int, b: int, t0_s: float, t1_s: float) -> list:
        """Host a's exchanges with b sent in true time [t0, t1), as hostprobe.stats.Exchange objects."""
        from hostprobe.stats import Exchange

        n = self.rng.poisson(self.rate * (t1_s - t0_s))
        r1 = np.sort(self.rng.uniform(t0_s * 1e9, t1_s * 1e9, n))
        pf, pr = self.rng.random(n) < self.pure, self.rng.random(n) < self.pure
        r2 = r1 + self._delay(a, b, r1, pf)
        r3 = r2 + 20_000.0  # the responder's turnaround
        r4 = r3 + self._delay(b, a, r3, pr)
        stamps = [np.round(self._clock(h, t)).astype(np.int64) + self.fabric.ref
                  for h, t in ((a, r1), (b, r2), (b, r3), (a, r4))]
        out = []
        for i in range(n):
            ex = Exchange(i, None, 0, 0.0, bool(i % 2))
            ex.t1, ex.t2, ex.t3, ex.t4 = (int(s[i]) for s in stamps)
            ex.pure_fwd, ex.pure_rev = bool(pf[i]), bool(pr[i])
            out.append(ex)
        return out

    def pair_truth(self, a: int, b: int, fabric_ns: int) -> float:
        """clock_b - clock_a at the instant the mean host clock reads fabric_ns (abs. ns)."""
        f = self.fabric
        t = ((fabric_ns - f.ref) - f.o.mean()) / (1 + f.r.mean() / 1e9)  # true time, rel. ref
        return float((f.o[b] - f.o[a]) + (f.r[b] - f.r[a]) * t / 1e9)

    def clock_edges(self, seconds: float) -> list[ClockEdge]:
        """Run every prober's ClockSync (the agent's code) over `seconds` of true time from ref."""
        from hostprobe.clock_edges import ClockSync

        class _Clock:
            epoch = 0

        edges: list[ClockEdge] = []
        syncs = {a: ClockSync(self.fabric.hosts[a], _Clock(), W_S, lambda _, e: edges.append(e))
                 for a in sorted({a for a, _ in self.pairs})}
        for s in range(int(seconds)):
            for a, b in self.pairs:
                syncs[a].add(self.fabric.hosts[b], self.exchanges(a, b, s, s + 1))
            for a, sync in syncs.items():  # the probe timeout has passed: windows before now are complete
                sync.run(int(self._clock(a, np.array([(s + 1) * 1e9 - 1e8]))[0]) + self.fabric.ref)
        return [e for e in edges if e.method == "svm"]
