"""Flow-level simulation of the controller on a k-ary 3-tier fat tree (k=36: 11,664 GPUs).

A collective (a ring among the job's GPUs in random placement, each neighbour pair over `--qps`
RoCE QPs, each QP one subflow on its own source port) runs under a fault: fabric links down
(`failures`) or hot spots (`hotspots`: background elephant traffic taking 75 % of some fabric
links). Per scenario it prints, for plain ECMP and for the controller (correlator/actions/steering.py
driven by lab/flowsim/control.py; load-aware and avoid-only), the collective's throughput (the
rate every subflow gets at once = the minimum max-min fair rate; S / it is the step time) and the
aggregate, each as a ratio to the multipath max-min optimum's first level (lambda*, every host
pair split over all its equal-cost paths: lab/flowsim/optimum.py; at this size its cut upper
bound, so the ratios are lower bounds), controller / ECMP, and the run time. `whole` is the
controller's collective throughput as a ratio to the whole-subflow bound (what any routing that keeps
each subflow on one path can reach; lab/flowsim/optimum.py), `s/rnd` the controller's own time per
round. `plan` is the global path planner (lab/flowsim/planner.py; `QPs` per pair after any split,
`traced` the share of subflows whose port the agent had traced, `drain` the links it empties, `plan s`
its own time without the max-min rates). `agents` is what the host agents do with `hop_loads`: the
moving pairs' subflows striped over their routes by headroom (correlator/actions/steering.py
`stripe`). `--no-limits` runs the controllers without the blast-radius
limits (every bad element avoided); `--controllers` picks which run.

    .venv/bin/python bench/fabric_sim.py [--k 36] [--qps 4] [--load 0.5,1.0] [--seed 1] [--no-limits]
        [--controllers plan,ctl,avoid]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from correlator.actions.steering import Limits  # noqa: E402
from lab.flowsim.control import PORT_BASE, PORT_SPAN, Controller, Job, evaluate  # noqa: E402
from lab.flowsim.fabric import FatTree  # noqa: E402
from lab.flowsim.optimum import concurrent_upper_bound, whole_subflow_upper_bound  # noqa: E402


def ring_job(ft: FatTree, load: float, qps: int, rng) -> Job:
    """A ring over a random `load` share of the GPUs: each sends to the next over `qps` subflows."""
    active = rng.choice(ft.hosts, max(2, int(ft.hosts * load)), replace=False)
    src, dst = np.repeat(active, qps), np.repeat(np.roll(active, -1), qps)
    return Job(src, dst, PORT_BASE + rng.integers(0, PORT_SPAN, src.size))


def fault(ft: FatTree, kind: str, rng) -> np.ndarray:
    """Apply the fault; returns the background traffic per directed link."""
    H = ft.hosts
    background = np.zeros(ft.n_links)
    if kind == "failures":  # 1 % of the fabric links down (edge-agg and agg-core)
        ft.fail(rng.choice(np.arange(H, 3 * H), max(1, int(0.01 * 2 * H)), replace=False))
    elif kind == "hotspots":  # 1 % of the directed fabric links carry 75 % background elephants
        hot = rng.choice(np.arange(2 * H, 6 * H), max(1, int(0.01 * 4 * H)), replace=False)
        background[hot] = 0.75 * ft.capacity[hot]
    return background


MODES = {"plan": {"planner": True}, "traced": {"planner": True, "traced_only": True}, "ctl": {"load_aware": True},
         "avoid": {"load_aware": False}, "agents": {"load_aware": False, "stripe": True}}


def scenario(k: int, qps: int, load: float, kind: str, seed: int, limits: Limits | None = Limits(),
             modes: tuple[str, ...] = ("plan", "ctl", "avoid")) -> dict:
    rng = np.random.default_rng(seed)
    ft = FatTree(k, seed=seed)
    job = ring_job(ft, load, qps, rng)
    background = fault(ft, kind, rng)
    avail = ft.available(background)
    t0 = time.perf_counter()
    ecmp = evaluate(ft, job, avail)
    t_ecmp = time.perf_counter() - t0
    bound = concurrent_upper_bound(ft, job.src, job.dst, avail)
    whole = whole_subflow_upper_bound(ft, job.src, job.dst, avail)
    row = {"kind": kind, "load": load, "subflows": job.size, "bound": bound, "whole": whole,
           "ecmp_min": ecmp.min_rate / bound, "ecmp_agg": ecmp.aggregate / (bound * job.size), "t_ecmp": t_ecmp}
    for label in modes:
        t0 = time.perf_counter()
        res = Controller(ft, job, avail, background=background, limits=limits, **MODES[label]).run(job)
        row[f"{label}_min"] = res.throughput / bound
        row[f"{label}_agg"] = res.outcome.aggregate / (bound * job.size)
        row[f"{label}_rounds"] = len(res.rounds)
        row[f"{label}_refused"] = len(res.refusals)
        row[f"t_{label}"] = time.perf_counter() - t0
        row[f"{label}_whole"] = res.throughput / whole
        row[f"{label}_split"], row[f"{label}_traced"], row[f"{label}_drained"] = res.split, res.traced, res.drained
        row[f"{label}_plan_s"] = res.plan_s
    return row


COLUMNS = {  # mode -> (header, row format)
    "plan": (f"| {'plan min':>8} {'agg':>5} {'whole':>5} {'QPs':>3} {'traced':>6} {'drain':>5} {'s/rnd':>5} "
             f"{'plan s':>6} ",
             lambda r, q: f"| {r['plan_min']:8.3f} {r['plan_agg']:5.3f} {r['plan_whole']:5.3f} "
                          f"{q * r['plan_split']:3d} {r['plan_traced']:6.2f} {r['plan_drained']:5d} "
                          f"{r['t_plan'] / max(r['plan_rounds'], 1):5.1f} {r['plan_plan_s']:6.1f} "),
    "traced": (f"| {'traced-only min':>15} {'agg':>5} {'QPs':>3} {'plan s':>6} ",
               lambda r, q: f"| {r['traced_min']:15.3f} {r['traced_agg']:5.3f} {q * r['traced_split']:3d} "
                            f"{r['traced_plan_s']:6.1f} "),
    "ctl": (f"| {'ctl min':>7} {'agg':>5} {'rnd':>3} {'whole':>5} {'s/rnd':>5} ",
            lambda r, q: f"| {r['ctl_min']:7.3f} {r['ctl_agg']:5.3f} {r['ctl_rounds']:3d} {r['ctl_whole']:5.3f} "
                         f"{r['t_ctl'] / max(r['ctl_rounds'], 1):5.1f} "),
    "agents": (f"| {'agents min':>10} {'agg':>5} {'rnd':>3} {'s/rnd':>5} ",
               lambda r, q: f"| {r['agents_min']:10.3f} {r['agents_agg']:5.3f} {r['agents_rounds']:3d} "
                            f"{r['t_agents'] / max(r['agents_rounds'], 1):5.1f} "),
    "avoid": (f"| {'avoid-only min':>14} {'agg':>5} ",
              lambda r, q: f"| {r['avoid_min']:14.3f} {r['avoid_agg']:5.3f} "),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=36)
    ap.add_argument("--qps", type=int, default=4)
    ap.add_argument("--load", default="0.5,1.0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-limits", action="store_true", help="no blast-radius limits: every bad element avoided")
    ap.add_argument("--controllers", default="plan,ctl,avoid",
                    help="which to run: plan (global planner), traced (the planner on the traced ports' paths only), "
                         "ctl (per-pair rebalance), agents (the host agents' stripe), avoid (avoid-only)")
    args = ap.parse_args()
    limits = None if args.no_limits else Limits()
    modes = tuple(m for m in args.controllers.split(",") if m)
    ft = FatTree(args.k)
    print(f"fat tree k={args.k}: {ft.hosts:,} GPUs, {3 * ft.hosts:,} links; ring job, {args.qps} QPs per pair; "
          f"ratios to the optimum's bound (min = collective throughput, agg = aggregate); "
          f"limits {'off' if limits is None else limits}")
    print(f"{'fault':9} {'load':>4} {'subflows':>8} | {'ECMP min':>8} {'agg':>5} "
          + "".join(COLUMNS[m][0] for m in modes) + f"| {'t ECMP':>6}")
    for load in (float(x) for x in args.load.split(",")):
        for kind in ("none", "failures", "hotspots"):
            r = scenario(args.k, args.qps, load, kind, args.seed, limits, modes)
            print(f"{kind:9} {load:4.2f} {r['subflows']:8,} | {r['ecmp_min']:8.3f} {r['ecmp_agg']:5.3f} "
                  + "".join(COLUMNS[m][1](r, args.qps) for m in modes) + f"| {r['t_ecmp']:5.2f}s", flush=True)


if __name__ == "__main__":
    main()
