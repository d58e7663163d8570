"""Scale of the network-effect clock solve (nms.clock_solve.solve_window): one 2 s slot of
synthetic edges, hosts x 16 random peers each (each host is host_a of 16 edges), offsets +-10 ms,
drifts +-50 ppm, 20 ns noise, 0.1 % of the edges poisoned by +50 us. Prints the solve time (best
of --repeat) and the error against the truth.

    .venv/bin/python bench/clock_solve.py [--hosts 1000,4000,16000] [--peers 16] [--repeat 3]

The solve runs every window_s (2 s) in the service, in a worker thread: it must stay well under that.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the synthetic clocks of the test suite

from _clocktruth import W_NS, W_S, Fabric, random_peers  # noqa: E402

from nms.clock_solve import solve  # noqa: E402


def run(n: int, peers: int, repeat: int, rng) -> None:
    ref = 850_000_000 * W_NS
    fabric = Fabric.random(n, rng, ref)
    pairs = random_peers(n, peers, rng)
    edges = [fabric.edge(a, b, ref, rng, 20.0) for a, b in pairs]
    poisoned = set()
    for i in rng.choice(len(edges), max(1, len(edges) // 1000), replace=False):
        edges[i] = edges[i].model_copy(update={"offset_ns": edges[i].offset_ns + 50_000})
        poisoned.add((edges[i].host_a, edges[i].host_b))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = solve(edges, ref, W_S)
        times.append(time.perf_counter() - started)
    truth = fabric.truth()
    err = np.array([s.offset_ns - truth[s.host][0] for s in result.solutions])
    print(f"{n:>6} hosts {len(edges):>7} edges: solve {min(times):6.3f} s (best of {repeat}), "
          f"offset error rms {np.sqrt(np.mean(err ** 2)):5.1f} ns max {np.abs(err).max():6.1f} ns, "
          f"dropped {len(result.dropped)} edges, {len(poisoned & set(result.dropped))} of the {len(poisoned)} "
          f"poisoned, converged={result.converged}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1000,4000,16000")
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    for n in (int(v) for v in args.hosts.split(",")):
        run(n, args.peers, args.repeat, rng)


if __name__ == "__main__":
    main()
