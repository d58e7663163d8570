"""Load-aware steering on a wider lab (issue #26): jobs' goodput under ECMP, avoid-only steering,
load-aware steering and planned routes, with no fault and with one degraded link, and the flows'
return after the heal.

    sudo .venv/bin/python bench/traffic_load_aware.py [--trials 2] [--observe 15] [--window 5]

A 4-spine, 2-leaf lab, 4 hosts per leaf, links shaped to 10 Mbit/s (TBF), `nms serve` (SNMP every
second, the correlator, the action engine with `host_reroute` on `auto`) and an agent per host
(steering.ports_per_dst 2, port_load 0.12). Jobs on disjoint hosts, 2 flows (QPs) of 1.2 Mbit/s
per pair (lab/load_trials.py): scenario A two all-to-all jobs, B an all-to-all and a ring.

* clean: the jobs' own source ports put 80 % of leaf1's cross-leaf flows onto spine1 (an ECMP
  collision, built with `ip route get`), no fault: the congestion is the collision's;
* degraded: own ports balanced over the four spines, then leaf1 -> spine1 cut to 2 Mbit/s for
  `--observe` s, healed, and the time until every flow sends from its own port again.

Modes, one after the other on one lab (the service restarts between them): ecmp (actions.dry_run),
avoid (actions.load_aware false: the steer carries avoid_hops only), load (hop_loads: the agents
place their ports by load; actions.plan_routes false), plan (the service's planned routes, which
the agents follow; the same ports_per_dst and port_load as the agents'). Reported per scenario,
fault and mode: each job's goodput over the observation's last `--window` s (aggregate, slowest
flow, collective = slowest x flows) and the ratios to ECMP. Target: >= 1.3x ECMP for the two all-to-all jobs.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab.agent_procs import agents_dir
from lab.control_trials import wait_mapped
from lab.load_trials import RATE, Trial, job_flows, new_lab, quiet, set_mode, trial, uplink_counts

CASES = [("A", "clean"), ("A", "degraded"), ("B", "clean"), ("B", "degraded")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--observe", type=float, default=15.0, help="seconds per trial (of the fault, when degraded)")
    ap.add_argument("--window", type=float, default=5.0, help="goodput over the observation's last seconds")
    ap.add_argument("--modes", default="ecmp,avoid,load,plan")
    ap.add_argument("--cases", default=",".join(f"{s}-{f}" for s, f in CASES))
    ap.add_argument("--hot", type=float, default=0.8, help="clean: share of each leaf's cross flows on spine1")
    ap.add_argument("--rate", type=float, default=RATE / 1e6, help="Mbit/s per flow (and the agents' port_load)")
    ap.add_argument("--prefix", default="nmsx-")
    ap.add_argument("--mgmt", default="198.18.240.0/24")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the lab comes down (finally) on kill too
    began = time.monotonic()
    cases = [tuple(c.split("-")) for c in args.cases.split(",")]
    rate = int(args.rate * 1e6)
    mesh = new_lab(args.prefix, args.mgmt, rate)
    workdir = Path(tempfile.mkdtemp(prefix="nms-load-aware-"))
    results: list[Trial] = []
    print(f"lab dir {mesh.dir.root}", flush=True)
    try:
        mesh.up()
        mesh.wait_traced(180)
        wait_mapped(mesh, 120)
        print(f"lab up in {time.monotonic() - began:.0f} s; logs under {workdir}", flush=True)
        layouts = {}
        for scenario, fault in cases:
            flows, owner = job_flows(mesh.topo, scenario, "collide" if fault == "clean" else "balanced", args.hot,
                                     rate)
            layouts[(scenario, fault)] = (flows, owner)
            print(f"{scenario}-{fault}: {len(flows)} flows, own ports put per leaf "
                  f"{uplink_counts(mesh.topo, flows, {f.id: f.sport for f in flows})} on spine1..4", flush=True)
        for mode in args.modes.split(","):
            set_mode(mesh, mode)
            quiet(mesh)
            for scenario, fault in cases:
                flows, owner = layouts[(scenario, fault)]
                for n in range(args.trials):
                    t = trial(mesh, flows, owner, scenario, fault, mode, args.observe, args.window, workdir)
                    results.append(t)
                    if not quiet(mesh):
                        print("  (not quiet within 90 s)", flush=True)
                    jobs = " ".join(f"{j} {v['aggregate'] / 1e6:.1f}/{v['slowest'] / 1e6:.2f}"
                                    for j, v in t.jobs().items())
                    ret = t.return_s if t.return_s is None else round(t.return_s, 1)
                    print(f"{mode:5} {scenario}-{fault:8} #{n + 1}: [Mbit/s agg/slowest] {jobs}; uplinks {t.uplinks}; "
                          f"moved {t.moved} (back before the heal {t.back_early}); return {ret} s "
                          f"({t.returned}); planned routes followed {t.followed[0]}/{t.followed[1]} ports; "
                          f"incidents {sorted(set(t.incidents))}; actions {t.actions}", flush=True)
    finally:
        keep_logs(mesh, workdir)
        mesh.down()
    report(results, cases)
    print(f"\nbench run time {time.monotonic() - began:.0f} s")


def keep_logs(mesh, workdir: Path) -> None:
    """The service's and the agents' logs outlive the lab (its directory goes with it)."""
    for log in [mesh.dir.root / "service.log", *agents_dir(mesh.dir).glob("*.log")]:
        if log.exists():
            shutil.copy(log, workdir / log.name)


def report(results: list[Trial], cases: list) -> None:
    print("\nmean over trials; Mbit/s; ratio = mode / ecmp (collective: slowest flow x flows)")
    print(f"{'case':12} {'mode':5} {'job':6} {'aggregate':>9} {'slowest':>8} {'collective':>10} "
          f"{'agg ratio':>9} {'coll ratio':>10} {'return s':>8}")
    for scenario, fault in cases:
        base: dict[str, dict[str, float]] = {}
        for mode in ("ecmp", "avoid", "load", "plan"):
            ts = [t for t in results if (t.scenario, t.fault, t.mode) == (scenario, fault, mode)]
            if not ts:
                continue
            for job in ts[0].jobs():
                m = {k: statistics.mean(t.jobs()[job][k] for t in ts) for k in ("aggregate", "slowest", "collective")}
                if mode == "ecmp":
                    base[job] = m
                b = base.get(job)
                ret = [t.return_s for t in ts if t.return_s is not None]
                back = sum(1 for t in ts if t.returned)
                ratio = (f"{m['aggregate'] / b['aggregate']:9.2f} {m['collective'] / max(b['collective'], 1):10.2f}"
                         if b else f"{'':9} {'':10}")
                mean_ret = f"{statistics.mean(ret):5.1f}" if ret else "    -"  # none back within the wait
                ret_s = f"{mean_ret} ({back}/{len(ts)})" if fault == "degraded" and mode != "ecmp" else ""
                print(f"{scenario + '-' + fault:12} {mode:5} {job:6} {m['aggregate'] / 1e6:9.2f} "
                      f"{m['slowest'] / 1e6:8.2f} {m['collective'] / 1e6:10.2f} {ratio} {ret_s:>8}")


if __name__ == "__main__":
    main()
