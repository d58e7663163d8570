"""gNMI streaming vs SNMP polling, CPU per value, on the same 1,000 interfaces in the same run.

    sudo .venv/bin/python bench/gnmi_stream.py [--interfaces 1000] [--seconds 20] [--polls 5]

Builds the SNMP benchmark's namespace (bench/snmp_poll.py: N veth interfaces, snmpd on 127.0.0.1)
and starts the lab's gNMI target (lab/gnmi_target.py) in it on 127.0.0.1:9339, then, inside
that namespace, measures this process's CPU time for the whole collection path (records, rates,
link state, store points; not the store write) per value received:

1. SNMP: `--polls` polls of the 18 IF-MIB columns by our collector, each ingested by the poller;
2. gNMI: the poller's own Subscribe STREAM (counters SAMPLEd every 1 s, status ON_CHANGE) for
   `--seconds`, counting the values of every batch it ingests.

Prints values/s per core for each and the ratio of CPU per value, gNMI / SNMP (target:
below 1/3). The target's own CPU is printed for reference (it shares the 2 CPUs). Needs root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snmp_poll import COMMUNITY, NS, PORT, REPO, setup, sh, teardown  # noqa: E402

GNMI_PORT = 9339


def inner(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    import yaml

    from nms.app.polling import Poller
    from nms.config import parse_config
    from nms.store import WriteResult

    class PointsOnly:
        def write(self, points):
            return WriteResult(accepted=len(points))

    config = parse_config(yaml.safe_dump({"data_dir": "/nonexistent/unused", "fabric": {"switches": [
        {"name": "bench", "mgmt_address": "127.0.0.1", "collectors": {
            "snmp": {"community": COMMUNITY, "port": PORT, "lldp": False, "timeout": 5.0, "retries": 1},
            "gnmi": {"port": GNMI_PORT, "insecure": True, "interval": 1.0, "interfaces": ["v*"]}}}]}}))

    class NoPolls:
        def add_job(self, *a, **kw):
            pass

    async def run() -> dict:
        poller = Poller(config, PointsOnly(), registry=None)
        snmp, device = poller.collectors["snmp"], config.fabric.switches[0]
        await snmp.collect(device)  # warm-up
        snmp_values, snmp_cpu = 0, 0.0
        for _ in range(args.polls):
            c0 = time.process_time()
            result = await snmp.collect(device)
            await poller.ingest(result)
            snmp_cpu += time.process_time() - c0
            snmp_values += result.values
        counted = {"values": 0, "batches": 0}
        ingest = poller.ingest

        async def counting(result):
            if counted.get("on"):
                counted["values"] += result.values
                counted["batches"] += 1
            await ingest(result)

        poller.ingest = counting
        poller.schedule(NoPolls())  # opens the gNMI stream
        await asyncio.sleep(3)  # connected, initial values and a couple of ticks
        counted["on"] = True
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(args.seconds)
        gnmi_cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        counted["on"] = False
        status = poller.devices()
        await poller.close()
        return {"snmp_values": snmp_values, "snmp_cpu": snmp_cpu, "gnmi_values": counted["values"],
                "gnmi_batches": counted["batches"], "gnmi_cpu": gnmi_cpu, "wall": wall,
                "states": [(d.collector, d.state, d.last_error) for d in status]}

    print(json.dumps(asyncio.run(run())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interfaces", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args)
    if os.geteuid() != 0:
        raise SystemExit("needs root (a network namespace with veth interfaces)")
    if shutil.which("snmpd") is None:
        raise SystemExit("snmpd not found: apt-get install snmpd snmp iproute2")
    workdir = Path(tempfile.mkdtemp(prefix="nms-gnmi-bench-"))
    target = None
    try:
        setup(args.interfaces, workdir)
        target = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-m", "lab.gnmi_target", "--listen",
                                   f"127.0.0.1:{GNMI_PORT}", "--insecure", "--interfaces", "v*"], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=open(workdir / "target.log", "wb"))
        print(f"target: namespace {NS}, {args.interfaces} veth interfaces; snmpd on 127.0.0.1:{PORT}, "
              f"gNMI target on 127.0.0.1:{GNMI_PORT}")
        out = sh("ip", "netns", "exec", NS, sys.executable, __file__, "--inner", "--seconds", str(args.seconds),
                 "--polls", str(args.polls), timeout=1800).stdout
        r = json.loads(out.strip().splitlines()[-1])
        cpu_target = _cpu_of(target.pid)
    finally:
        if target is not None:
            target.terminate()
            target.wait(10)
        teardown(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    snmp_per_value = r["snmp_cpu"] / r["snmp_values"]
    gnmi_per_value = r["gnmi_cpu"] / max(r["gnmi_values"], 1)
    print(f"{'':8} {'values':>10} {'CPU s':>8} {'us/value':>9} {'values/s per core':>18}")
    print(f"{'SNMP':8} {r['snmp_values']:>10,} {r['snmp_cpu']:>8.2f} {snmp_per_value * 1e6:>9.2f} "
          f"{1 / snmp_per_value:>18,.0f}   ({args.polls} polls of 18 IF-MIB columns)")
    print(f"{'gNMI':8} {r['gnmi_values']:>10,} {r['gnmi_cpu']:>8.2f} {gnmi_per_value * 1e6:>9.2f} "
          f"{1 / gnmi_per_value:>18,.0f}   ({r['gnmi_batches']} batches in {r['wall']:.1f} s, SAMPLE 1 s)")
    print(f"CPU per value, gNMI / SNMP: {gnmi_per_value / snmp_per_value:.2f} (target < 0.33)")
    print(f"gNMI: {r['gnmi_cpu'] / r['wall']:.1%} of one core for {args.interfaces} interfaces at 1 s; "
          f"the target used {cpu_target:.1f} s of CPU over the whole run")
    print("device states:", r["states"])


def _cpu_of(pid: int) -> float:
    """CPU seconds of a process and its children so far (the target runs under `ip netns exec`)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return total


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out] + [c for p in out for c in _children(int(p))]


if __name__ == "__main__":
    main()
