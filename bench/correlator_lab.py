"""Correlator scoring on the lab's ground truth: real faults, real agents, real snmpd.

    sudo .venv/bin/python bench/correlator_lab.py [--trials 10] [--soak 300] [--kinds link-down,loss,...]

A 2-spine, 3-leaf lab with 4 hosts per leaf (`--hosts-per-leaf`) with the service (SNMP polling
every second, the correlator) and an agent on every host. Loss is found from the probes that cross a
link, so its latency is set by how many do: with 4 hosts per leaf about 640 exchanges a second
cross each leaf-spine direction, a fifth of what 32 hosts per leaf probing 16 peers over 8 uplinks
send through one (docs/correlator.md); with 2 per leaf, 160. Each trial injects one fault on a
randomly chosen element, waits for the incident, heals, and waits for it to resolve:

* latency: the correlator window in which the element's incident first had the expected kind
  (from its event history; a link first seen down becomes link_flapping) - the fault's start_ns;
* a trial is detected when that happens within the kind's deadline; every other incident opened
  during the trial (another element, or the element never getting the right kind) is a false one;
* the soak runs the clean lab for `--soak` seconds: every incident opened then is false.

Targets: link down <= 2 s p99, silent loss >= 1% <= 5 s, congestion <= 5 s, flapping
flagged at the configured threshold, a partial blackhole (`blackhole`: a spine drops half the flows
it sends to a leaf, by source address and port) <= 10 s; precision 100%, recall >= 95%; no false incident in the soak.
tests/lab/test_correlator_lab.py runs one trial of each kind with the same harness.
"""

from __future__ import annotations

import argparse
import random

from lab.correlator_trials import new_lab, pct, soak, trial, wait_quiet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--soak", type=float, default=300.0, help="seconds of clean lab")
    parser.add_argument("--kinds", default="link-down,loss,congestion,flap,nic-down,mtu,blackhole")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts-per-leaf", type=int, default=4)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    mesh = new_lab("nmsk-", "198.18.244.0/24", args.hosts_per_leaf)
    results = []
    try:
        mesh.up()
        mesh.wait_traced(60)
        wait_quiet(mesh)
        print(f"soak: {args.soak:.0f} s of clean lab ...", flush=True)
        false_soak = soak(mesh, args.soak)
        for kind in args.kinds.split(","):
            for n in range(args.trials):
                r = trial(mesh, kind, rng)
                results.append(r)
                latency = f"{r['latency_s']:.2f} s" if r["detected"] else "MISSED"
                resolved = f", resolved {r['resolved_s']:.1f} s after heal" if r["resolved_s"] is not None else ""
                print(f"  {kind} {n + 1}/{args.trials} {r['target']} {r['opts']}: {latency}{resolved}"
                      f"{', false: ' + '; '.join(r['wrong']) if r['wrong'] else ''}", flush=True)
    finally:
        mesh.down()
    print(f"\ncorrelator on the lab (2 spines, 3 leaves, {3 * args.hosts_per_leaf} hosts; SNMP every 1 s), "
          f"{args.trials} trials per kind")
    print(f"  soak {args.soak:.0f} s: {len(false_soak)} false incidents {false_soak if false_soak else ''}")
    print(
        f"  {'fault':<11} {'recall':>7} {'precision':>9} {'p50 s':>6} {'p99 s':>6} {'max s':>6} {'resolve p50 s':>13}"
    )
    for kind in args.kinds.split(","):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        lat = [r["latency_s"] for r in rs if r["detected"]]
        good = sum(r["detected"] for r in rs)
        wrong = sum(len(r["wrong"]) for r in rs)
        res = [r["resolved_s"] for r in rs if r["resolved_s"] is not None]
        print(f"  {kind:<11} {good / len(rs) * 100:6.0f}% {good / max(1, good + wrong) * 100:8.0f}% "
              f"{pct(lat, 50) if lat else float('nan'):6.2f} {pct(lat, 99) if lat else float('nan'):6.2f} "
              f"{max(lat) if lat else float('nan'):6.2f} {pct(res, 50) if res else float('nan'):13.1f}")
    loss = [r for r in results if r["kind"] == "loss" and r["detected"]]
    for percent in sorted({r["opts"]["percent"] for r in loss}):
        lat = [r["latency_s"] for r in loss if r["opts"]["percent"] == percent]
        print(f"  loss {percent:g}%: {len(lat)} detected, p50 {pct(lat, 50):.2f} s, max {max(lat):.2f} s")


if __name__ == "__main__":
    main()
