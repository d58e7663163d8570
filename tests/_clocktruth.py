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
