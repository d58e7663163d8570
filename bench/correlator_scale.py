"""Scale of the correlator (correlator.Correlator): time per step (one 1 s window) at 1k, 4k and 16k
hosts, after warm-up, with one leaf-spine link blackholed so localization has work.

Synthetic leaf-spine (tests/_fabric_synth.py): 32 hosts per leaf, 16 spines, each host probing
K=16 random peers on 4 paths (random spines; replies hash onto their own spine): 64 probe paths a
host, so 1M ProbeWindows a second at 16k hosts, plus their ProbePaths and every switch port's
InterfaceAddress, PortSample and PortRates (one poll during warm-up).

    .venv/bin/python bench/correlator_scale.py [--hosts 1024,4096,16384] [--warm 12] [--windows 5]

Per size it prints the median step time, the median `add` time for the window's records (the
service's event loop pays that), a same-run baseline (one pass over the window's ProbeWindows
reading five attributes: the least any consumer of them does), the step/baseline ratio, and the
growth of the step time against the 1k size next to the growth in hosts (linear = equal).
Target: < 1 s per window at 4k hosts on one core, growing about linearly.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test suite's synthetic fabric

from _fabric_synth import NS, T0, Synth, undirected  # noqa: E402

from correlator.engine import Correlator  # noqa: E402
from nms.config.models import CorrelatorConfig, Thresholds  # noqa: E402
from nms.records import ProbeWindow  # noqa: E402

HOSTS_PER_LEAF, SPINES, PEERS, PATHS = 32, 16, 16, 4


def baseline(records) -> float:
    started = time.perf_counter()
    total = 0
    for r in records:
        if r.__class__ is ProbeWindow:
            total += r.sent + r.received + (r.owd_fwd_p50_ns or 0) + (r.owd_rev_p50_ns or 0) + len(r.path_id)
    return time.perf_counter() - started


def run(hosts: int, warm: int, windows: int) -> dict:
    t_build = time.perf_counter()
    print(f"[{hosts} hosts] building the fabric and its paths ...", flush=True)
    s = Synth(spines=SPINES, leaves=max(1, hosts // HOSTS_PER_LEAF), hosts_per_leaf=HOSTS_PER_LEAF, peers=PEERS,
              paths_per_peer=PATHS, validate=False, seed=hosts)
    c = Correlator(s.fabric, Thresholds(), CorrelatorConfig())
    c.add(s.inventory_records())
    c.add(s.switch_records(T0))
    print(f"[{hosts} hosts] {len(s.keys):,} paths, {len(s.links):,} links, built in "
          f"{time.perf_counter() - t_build:.1f} s; warm-up ({warm} windows) ...", flush=True)
    first_step = None
    for i, t in enumerate(range(T0, T0 + warm)):
        c.add(s.windows(t))
        started = time.perf_counter()
        c.step((t + 1) * NS + NS // 10)
        if first_step is None:
            first_step = time.perf_counter() - started  # includes mapping every path to its links
        print(f"\r[{hosts} hosts] warm-up {i + 1}/{warm}", end="", flush=True)
    print(flush=True)
    link = undirected(*s.up_link(1, 1).split("->"))
    s.down.add(link)
    steps, adds, bases, found = [], [], [], []
    for i, t in enumerate(range(T0 + warm, T0 + warm + windows)):
        records = s.windows(t)
        bases.append(baseline(records))
        started = time.perf_counter()
        c.add(records)
        adds.append(time.perf_counter() - started)
        del records
        started = time.perf_counter()
        findings = c.step((t + 1) * NS + NS // 10)
        steps.append(time.perf_counter() - started)
        found.append(sorted((f.kind, f.element) for f in findings))
        print(f"\r[{hosts} hosts] measured {i + 1}/{windows}: step {steps[-1]:.3f} s", end="", flush=True)
    print(flush=True)
    ok = ("link_down", link) in found[-1] and len(found[-1]) == 1
    return {"hosts": len(s.hosts), "paths": len(s.keys), "step": statistics.median(steps),
            "add": statistics.median(adds), "base": statistics.median(bases), "first": first_step,
            "found": found[-1], "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1024,4096,16384")
    parser.add_argument("--warm", type=int, default=12)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    results = [run(int(n), args.warm, args.windows) for n in args.hosts.split(",")]
    ref = results[0]
    print(f"\n{'hosts':>6} {'paths':>9} {'step s':>7} {'add s':>7} {'base s':>7} {'step/base':>9} "
          f"{'first s':>8} {'growth':>7} {'hosts x':>7}  localized")
    for r in results:
        print(f"{r['hosts']:>6} {r['paths']:>9,} {r['step']:7.3f} {r['add']:7.3f} {r['base']:7.3f} "
              f"{r['step'] / r['base']:9.2f} {r['first']:8.2f} {r['step'] / ref['step']:7.2f} "
              f"{r['hosts'] / ref['hosts']:7.2f}  {'yes' if r['ok'] else 'NO: ' + str(r['found'])}")


if __name__ == "__main__":
    main()
