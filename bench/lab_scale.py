"""Fabric lab scale benchmark: build time, teardown time and memory of a 4x8x4 lab, as ratios to the
default 2x2x2 lab measured in the same run (this machine is noisy; compare the ratios).

    sudo .venv/bin/python bench/lab_scale.py [--runs 3] [--spines 4 --leaves 8 --hosts-per-leaf 4] [--json]

Build time is `nms lab up` until every snmpd answers and every lldpd runs its configuration
(split into: namespaces/links/routes, waiting for the kernel to report carrier, daemons);
memory is the RSS and PSS of every process in the lab's namespaces plus the kernel's growth
(/proc/meminfo: Slab, Percpu, KernelStack, PageTables, and MemAvailable overall). It uses its own
prefix and management subnet, so it runs beside a user's lab. Results are recorded in docs/lab.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab import cleanup, paths, sh
from lab import lab as lab_mod
from lab.sh import LabError, require_root
from lab.state import LabDir, topology_of
from lab.topology import Spec

PREFIX = "nmsb-"
MGMT = "198.18.253.0/24"
KERNEL_KEYS = ("Slab", "Percpu", "KernelStack", "PageTables")


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0])  # kB
    return out


def process_memory(prefix: str) -> dict:
    rss = pss = n = 0
    for ns in cleanup.lab_namespaces(prefix):
        for pid in cleanup.namespace_pids(ns):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            rss += int(status.split("VmRSS:")[1].split()[0])
            pss += int(rollup.split("\nPss:")[1].split()[0])
            n += 1
    return {"processes": n, "rss_kb": rss, "pss_kb": pss}


def check(lab: LabDir) -> float:
    """Sanity of the built lab: every host reaches the last host over every spine; returns how long
    LLDP took to show every fabric link on every spine (seconds after up returned)."""
    topo = topology_of(lab.load())
    hosts = [h.name for h in topo.by_role("host")]
    last = hosts[-1]
    for src in hosts[:-1]:
        if topo.link_of_port(src, "eth0").a.node == topo.link_of_port(last, "eth0").a.node:
            continue
        sports = [paths.sport_via(topo, src, last, s.name, "udp", 33434, 42000) for s in topo.by_role("spine")]
        got = paths.udp_probe(topo, src, last, sports, count=5)
        if any(v != 5 for v in got.values()):
            raise LabError(f"{src} -> {last}: {got}")
    t0 = time.monotonic()
    want = topo.spec.leaves
    while True:
        counts = []
        for s in topo.by_role("spine"):
            sock = str(lab.node(s.name) / "lldpd.sock")
            out = sh.run(["lldpcli", "-u", sock, "-f", "json", "show", "neighbors"]).stdout
            ifaces = json.loads(out).get("lldp", {}).get("interface", [])
            counts.append(len(ifaces) if isinstance(ifaces, list) else 1)
        if all(c == want for c in counts):
            return time.monotonic() - t0
        if time.monotonic() - t0 > 30:
            raise LabError(f"LLDP incomplete after 30 s: {counts}")
        time.sleep(0.2)


def measure(spec: Spec) -> dict:
    lab = LabDir(tempfile.mkdtemp(prefix="nms-lab-bench-"))
    cleanup.remove(PREFIX, lab, keep_dir=True)
    before = meminfo()
    marks = {}
    t0 = time.monotonic()
    lab_mod.up(lab, spec, step=lambda msg: marks.setdefault(msg.split()[0], time.monotonic()))
    build = time.monotonic() - t0
    mem = process_memory(PREFIX)
    after = meminfo()
    lldp = check(lab)
    nodes = spec.spines + spec.leaves + spec.leaves * spec.hosts_per_leaf
    t1 = time.monotonic()
    lab_mod.down(lab, PREFIX)
    teardown = time.monotonic() - t1
    return {
        "nodes": nodes, "links": spec.leaves * (spec.spines + spec.hosts_per_leaf),
        "build_s": build, "network_s": marks["waiting"] - marks["building"],
        "carrier_s": marks["starting"] - marks["waiting"],
        "services_s": t0 + build - marks["starting"], "teardown_s": teardown, "lldp_complete_s": lldp,
        **mem, "kernel_kb": sum(after[k] - before[k] for k in KERNEL_KEYS),
        "mem_available_drop_kb": before["MemAvailable"] - after["MemAvailable"],
    }


def median_run(spec: Spec, runs: int) -> dict:
    results = [measure(spec) for _ in range(runs)]
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--hosts-per-leaf", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        require_root()
        base = median_run(Spec(prefix=PREFIX, mgmt_subnet=MGMT), args.runs)
        spec = Spec(args.spines, args.leaves, args.hosts_per_leaf, prefix=PREFIX, mgmt_subnet=MGMT)
        big = median_run(spec, args.runs)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    per_node = {k: (big[k] / big["nodes"]) / (base[k] / base["nodes"]) for k in
                ("build_s", "teardown_s", "rss_kb", "kernel_kb")}
    if args.json:
        print(json.dumps({"baseline_2x2x2": base, f"lab_{args.spines}x{args.leaves}x{args.hosts_per_leaf}": big,
                          "per_node_ratio": per_node}, indent=2))
        return 0
    name = f"{args.spines}x{args.leaves}x{args.hosts_per_leaf}"
    print(f"fabric lab scale, median of {args.runs} runs (baseline: 2x2x2 in the same run)")
    print(f"{'':24}{'2x2x2':>12}{name:>12}{'per-node ratio':>16}")
    rows = [("nodes", "nodes", "{:.0f}"), ("links", "links", "{:.0f}"), ("build (s)", "build_s", "{:.2f}"),
            ("  network (s)", "network_s", "{:.2f}"), ("  carrier wait (s)", "carrier_s", "{:.2f}"),
            ("  services (s)", "services_s", "{:.2f}"),
            ("teardown (s)", "teardown_s", "{:.2f}"), ("LLDP complete (s)", "lldp_complete_s", "{:.2f}"),
            ("processes", "processes", "{:.0f}"), ("RSS (MiB)", "rss_kb", "{:.1f}"), ("PSS (MiB)", "pss_kb", "{:.1f}"),
            ("kernel (MiB)", "kernel_kb", "{:.1f}"), ("MemAvailable drop (MiB)", "mem_available_drop_kb", "{:.1f}")]
    for label, key, fmt in rows:
        scale = 1024 if key.endswith("_kb") else 1
        ratio = f"{per_node[key]:>16.2f}" if key in per_node else ""
        print(f"{label:24}{fmt.format(base[key] / scale):>12}{fmt.format(big[key] / scale):>12}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
