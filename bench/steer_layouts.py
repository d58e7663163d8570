"""How the agents of one host_reroute spread the moved flows over a leaf's uplinks, on the
load-aware bench's layout (bench/traffic_load_aware.py, lab/load_trials.py) without the lab: the
agent's own placement code (hostprobe/steer.py `Steering.place`) on random port hashes.

    .venv/bin/python bench/steer_layouts.py [--layouts 200] [--seed 0]

2 leaves x 4 hosts, 4 spines; the action avoids spine1 and moves all 8 hosts, each steering its 4
peers under the other leaf with 2 ports each (its traced candidates: 16 source ports, each hashed
onto a random spine, as ECMP does); two all-to-all jobs ({host1, host2, host5, host6}, {host3,
host4, host7, host8}): 16 of each leaf's 32 (host, peer, port) slots carry a flow of 0.12 (1.2 of
10 Mbit/s). Per load case (`hop_loads` as the planner sends them, and what other traffic the
spines carry), over `--layouts` random hashes: the busiest uplink's utilization (its other traffic
plus its flows: over 1.0 it overflows), against `level`, the fluid optimum (the 16 flows of a leaf
poured onto its three uplinks), and the flows per spine (leaf1, mean). Placements: `stripe` (what
the product does: the 4 agents behind a leaf take their own slots of one stripe, `rank` and
`movers` from the planner's `stripes`), `alone` (each agent taking slots as if it were rank 0) and
`avoid` (the lowest ports that avoid: avoid-only). Jobs `no`: the planner knows no jobs (every host
steers its 4 peers, 2 of which carry flows); `known`: the jobs are posted, each host steers its 2
job peers.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter
from pathlib import Path

from hostprobe.config import SteeringSettings
from hostprobe.steer import Steering

CASES = {  # name -> (hop_loads: utilization per spine as the planner sends it, the other traffic there)
    # the movers' own flows are in the planner's loads: spread evenly before the cut, or 1 per spine
    # and the rest on spine1 in the clean collision; no other traffic
    "degraded (0.48 each)": ({2: 0.48, 3: 0.48, 4: 0.48}, {2: 0.0, 3: 0.0, 4: 0.0}),
    "collision (clean)": ({2: 0.13, 3: 0.2, 4: 0.05}, {2: 0.0, 3: 0.0, 4: 0.0}),
    # other traffic on the spines, the movers' flows elsewhere
    "other 0.6/0.6/0.1": ({2: 0.6, 3: 0.6, 4: 0.1}, {2: 0.6, 3: 0.6, 4: 0.1}),
    "other 0.9/0.3/0.3": ({2: 0.9, 3: 0.3, 4: 0.3}, {2: 0.9, 3: 0.3, 4: 0.3}),
}
HOSTS, PORTS = 8, 2
FLOW = 0.12  # one flow's utilization of a spine link (1.2 of 10 Mbit/s)


def job(host: int) -> int:
    return (host - 1) % 4 // 2  # hosts 1, 2, 5, 6: job 0; 3, 4, 7, 8: job 1


def place(mode: str, steering: Steering, loads: dict[str, float], rng: random.Random, jobs: bool) -> Counter:
    """Flows per (leaf, spine) for one random hash layout. `jobs`: the planner knows the jobs and
    sends each host its job peers only (else all 4 hosts under the other leaf)."""
    avoid = {"S1from1", "L1from1", "?"}  # the addresses a trace shows for leaf1--spine1, both ways
    flows: Counter = Counter()
    for rank in range(HOSTS):
        host, leaf = rank + 1, 1 if rank < 4 else 2
        peers = [p for p in (range(5, 9) if leaf == 1 else range(1, 5)) if not jobs or job(p) == job(host)]
        for j, peer in enumerate(peers):
            spines = [rng.randrange(1, 5) for _ in range(steering.settings.candidates)]
            paths = [(f"L{leaf}", f"S{s}from{leaf}", f"L{3 - leaf}from{s}", f"H{peer}") for s in spines]
            if mode == "avoid":
                keep = steering.place(paths, avoid, {}, 0, 1)
            else:
                r = rank % 4 if mode == "stripe" else 0  # its place among the 4 movers behind its leaf
                keep = steering.place(paths, avoid, loads, (r * len(peers) + j) * PORTS, 4 * len(peers) * PORTS)
            if job(host) == job(peer):
                flows.update((leaf, spines[i]) for i in keep)
    return flows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    steering = Steering(SteeringSettings(candidates=16, ports_per_dst=PORTS, port_load=0.12), Path("/nonexistent"),
                        b"k" * 16, 1, 8, 1.0, lambda: 1)
    print(f"{'case':22} {'jobs':5} {'placement':9} {'busiest uplink p50 / p95 / max':>30} {'level':>5} "
          f"{'p50/level':>9}  mean flows per spine 2..4")
    for name, (by_spine, other) in CASES.items():
        loads = {f"{kind}{s}from{leaf}" if kind == "S" else f"L{leaf}from{s}": u
                 for s, u in by_spine.items() for leaf in (1, 2) for kind in ("S", "L")}
        # the fluid optimum: a leaf's 16 flows poured onto its three uplinks' other traffic
        top = max(other.values())
        level = top if 16 * FLOW <= sum(top - u for u in other.values()) \
            else (16 * FLOW + sum(other.values())) / len(other)
        for jobs, modes in ((False, ("stripe", "alone", "avoid")), (True, ("stripe",))):
            for mode in modes:
                rng = random.Random(args.seed)
                busiest: list[float] = []
                total: Counter = Counter()
                for _ in range(args.layouts):
                    flows = place(mode, steering, loads, rng, jobs)
                    busiest.append(max(other[s] + n * FLOW for (_leaf, s), n in flows.items()))
                    total.update({s: n for (leaf, s), n in flows.items() if leaf == 1})
                q = statistics.quantiles(busiest, n=20)
                mean = [round(total[s] / args.layouts, 1) for s in (2, 3, 4)]
                print(f"{name:22} {'known' if jobs else 'no':5} {mode:9} "
                      f"{statistics.median(busiest):>14.2f} / {q[18]:.2f} / {max(busiest):.2f} {level:5.2f} "
                      f"{statistics.median(busiest) / level:9.2f}  {mean}")


if __name__ == "__main__":
    main()
