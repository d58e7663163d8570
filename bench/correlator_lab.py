"""Correlator scoring on the lab's ground truth: real faults, real agents, real snmpd.

    sudo .venv/bin/python bench/correlator_lab.py [--trials 10] [--soak 300] [--kinds link-down,loss,...]
        [--spines 2 --leaves 3 --hosts-per-leaf 4] [--prefix nmsk- --mgmt 198.18.244.0/24]

A lab of `--spines` x `--leaves` x `--hosts-per-leaf` (default 2 x 3 x 4, 12 hosts) with the service
(SNMP polling every second, the correlator) and an agent on every host. Loss is found from the
probes that cross a link, so its latency is set by how many do: with every host a peer, 2 x H x
(L - 1) x H paths cross each leaf-spine direction (H hosts per leaf, L leaves; both legs, whatever
the spine count) at 10 exchanges/s each: 640/s in the default lab, 240/s in 3 x 4 x 2, a fifth of
what 32 hosts per leaf probing 16 peers over 8 uplinks send through one (docs/correlator.md). Each
trial injects one fault on a randomly chosen element, waits for the incident, heals, and waits for
it to resolve:

* latency: the correlator window in which the element's incident first had the expected kind
  (from its event history; a link first seen down becomes link_flapping) - the fault's start_ns;
* a trial is detected when that happens within the kind's deadline (a partial blackhole whose dead
  flows cross other links alike may name one of them with the faulted link among its alternatives:
  detected, and counted in the `ambiguous` column); every other top-level incident
  opened during the trial (another element, or the element never getting the right kind) is a false
  one; the children of an incident (a dead switch's links under its `device_down`) are not;
* the soak runs the clean lab for `--soak` seconds: every incident opened then is false.

Kinds (`--kinds`, lab fault in brackets) and deadlines: link-down 10 s, loss (1/2/5 %, `loss`) 15 s,
loss-1 (exactly 1 %: issue 28's "within 5 s p99" is read off its column) 15 s,
loss-0.5 (0.5 % one way on a leaf-spine link) 60 s (issue 28's target), loss-0.1 (0.1 %) 200 s
(docs/correlator.md's p99 for 0.1 % at the default probe rate on the 3 x 4 x 2 lab, ~240 exchanges/s
per direction: 150-200 s; the mean from its formula is ~64 s), congestion 15 s, flap 30 s, nic-down
10 s, mtu 20 s, blackhole (a spine drops half the flows it sends to a leaf, by source address and
port) 10 s, switch-down (a whole spine dies, every link at once: one `device_down` on it whose
children are its links' incidents) 10 s.

Targets: link down <= 2 s p99, silent loss >= 1% <= 5 s, 0.5 % <= 60 s, congestion <= 5 s, flapping
flagged at the configured threshold, a partial blackhole <= 10 s; precision 100%, recall >= 95%; no
false incident in the soak. tests/lab/test_correlator_lab.py runs one trial of the older kinds with
the same harness. The numbers need an otherwise idle machine (docs/correlator.md).
"""

from __future__ import annotations

import argparse
import random

from lab.correlator_trials import KIND_OF, new_lab, pct, soak, trial, wait_quiet

KINDS = "link-down,loss,loss-1,loss-0.5,loss-0.1,congestion,flap,nic-down,mtu,blackhole,switch-down"


def summary(results: list[dict], kinds: list[str], shape: str, trials: int, soak_s: float,
            false_soak: list[str]) -> list[str]:
    """The table: per kind recall, precision, detection p50/p99/max and resolve time; the soak line."""
    nan = float("nan")
    lines = [f"correlator on the lab ({shape}; SNMP every 1 s), {trials} trials per kind",
             f"  soak {soak_s:.0f} s: {len(false_soak)} false incidents {false_soak if false_soak else ''}",
             f"  {'fault':<11} {'recall':>7} {'precision':>9} {'p50 s':>6} {'p99 s':>6} {'max s':>6} "
             f"{'resolve p50 s':>13} {'resolve max s':>13} {'ambiguous':>9}"]
    for kind in kinds:
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        lat = [r["latency_s"] for r in rs if r["detected"]]
        good = sum(r["detected"] for r in rs)
        wrong = sum(len(r["wrong"]) for r in rs)
        res = [r["resolved_s"] for r in rs if r["resolved_s"] is not None]
        lines.append(f"  {kind:<11} {good / len(rs) * 100:6.0f}% {good / max(1, good + wrong) * 100:8.0f}% "
                     f"{pct(lat, 50) if lat else nan:6.2f} {pct(lat, 99) if lat else nan:6.2f} "
                     f"{max(lat) if lat else nan:6.2f} {pct(res, 50) if res else nan:13.1f} "
                     f"{max(res) if res else nan:13.1f} {sum(r['ambiguous'] for r in rs):9d}")
    loss = [r for r in results if r["kind"] == "loss" and r["detected"]]
    for percent in sorted({r["opts"]["percent"] for r in loss}):
        lat = [r["latency_s"] for r in loss if r["opts"]["percent"] == percent]
        lines.append(f"  loss {percent:g}%: {len(lat)} detected, p50 {pct(lat, 50):.2f} s, max {max(lat):.2f} s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--soak", type=float, default=300.0, help="seconds of clean lab")
    parser.add_argument("--kinds", default=KINDS, help=f"comma-separated, of: {', '.join(KIND_OF)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spines", type=int, default=2)
    parser.add_argument("--leaves", type=int, default=3)
    parser.add_argument("--hosts-per-leaf", type=int, default=4)
    parser.add_argument("--prefix", default="nmsk-", help="the lab's namespace prefix")
    parser.add_argument("--mgmt", default="198.18.244.0/24", help="the lab's management subnet")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KIND_OF]
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; choose from {', '.join(KIND_OF)}")
    if args.spines < 2 and "switch-down" in kinds:
        parser.error("--kinds switch-down needs --spines >= 2 (a lab with its only spine dead is split)")
    rng = random.Random(args.seed)
    mesh = new_lab(args.prefix, args.mgmt, args.hosts_per_leaf, spines=args.spines, leaves=args.leaves)
    shape = (f"{args.spines} spines x {args.leaves} leaves x {args.hosts_per_leaf} hosts per leaf, "
             f"{args.leaves * args.hosts_per_leaf} hosts")
    results = []
    false_soak: list[str] = []
    try:
        mesh.up()
        mesh.wait_traced(120)
        wait_quiet(mesh)
        print(f"soak: {args.soak:.0f} s of clean lab ...", flush=True)
        false_soak = soak(mesh, args.soak)
        for kind in kinds:
            for n in range(args.trials):
                r = trial(mesh, kind, rng)
                results.append(r)
                latency = f"{r['latency_s']:.2f} s" if r["detected"] else "MISSED"
                latency += " (among alternatives)" if r["ambiguous"] else ""
                resolved = f", resolved {r['resolved_s']:.1f} s after heal" if r["resolved_s"] is not None else ""
                print(f"  {kind} {n + 1}/{args.trials} {r['target']} {r['opts']}: {latency}{resolved}"
                      f"{', false: ' + '; '.join(r['wrong']) if r['wrong'] else ''}", flush=True)
                for why in r["wrong_why"]:  # when and why each false incident opened, with its evidence
                    print(f"      {why}", flush=True)
    finally:
        mesh.down()
    print()
    print("\n".join(summary(results, kinds, shape, args.trials, args.soak, false_soak)))


if __name__ == "__main__":
    main()
