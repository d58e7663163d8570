"""SNMP polling benchmark: our collector vs net-snmp's `snmpbulkwalk` on the same target, same run.

    sudo .venv/bin/python bench/snmp_poll.py [--interfaces 1000] [--cycles 5] [--max-repetitions 20]

Builds a network namespace (`nmsb-bench`) with N veth interfaces (N/2 pairs) and a net-snmp snmpd serving
them on 127.0.0.1 inside it, then, inside that namespace:

1. throughput (values/s): one poll of the 18 IF-MIB columns the collector reads, by our collector
   (one multi-column GETBULK walk, pysnmp asyncio, lookupMib=False) and by `snmpbulkwalk` (one
   process per column, like a shell script or Telegraf's exec would; same max-repetitions),
   alternating, `--cycles` times each; printed as a ratio ours / net-snmp. For reference, the
   plain pysnmp way (`bulk_walk_cmd`, one walk per column, all columns concurrently) too;
2. CPU: process CPU seconds our whole polling path spends per cycle of N interfaces (SNMP walk,
   records, rates, link state, store points; the store write itself left out), as a share of one
   core at a 10 s interval. Target: 1,000 interfaces x 8 counters per 10 s under half a
   core.

The namespace, its interfaces and snmpd are removed at the end. Needs root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NS = "nmsb-bench"
PORT = 16199
COMMUNITY = "bench-community"
IF_COLUMNS = [f"1.3.6.1.2.1.31.1.1.1.{c}" for c in (1, 6, 7, 8, 9, 10, 11, 12, 13, 15, 19)] + \
             [f"1.3.6.1.2.1.2.2.1.{c}" for c in (4, 8, 9, 13, 14, 19, 20)]


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


def setup(n: int, workdir: Path) -> int:
    teardown(workdir)
    sh("ip", "netns", "add", NS)
    pairs = (n + 1) // 2  # this kernel has no dummy driver: veth pairs, both ends in the namespace
    batch = ["link set lo up"] + [f"link add v{i}a type veth peer name v{i}b" for i in range(pairs)] + \
            [f"link set v{i}{end} up" for i in range(pairs) for end in "ab"]
    (workdir / "ip.batch").write_text("\n".join(batch) + "\n")
    sh("ip", "-n", NS, "-batch", str(workdir / "ip.batch"))
    conf = workdir / "snmpd.conf"
    conf.write_text(f"agentAddress udp:127.0.0.1:{PORT}\nrocommunity {COMMUNITY} 127.0.0.1\n")
    env = {**os.environ, "MIBS": "", "SNMP_PERSISTENT_DIR": str(workdir / "persist")}
    sh("ip", "netns", "exec", NS, "snmpd", "-C", "-c", str(conf), "-p", str(workdir / "snmpd.pid"),
       "-Lf", str(workdir / "snmpd.log"), env=env)
    for _ in range(200):
        pid = workdir / "snmpd.pid"
        if pid.exists() and pid.read_text().strip():
            probe = sh("ip", "netns", "exec", NS, "snmpget", "-v2c", "-c", COMMUNITY, "-t", "1", "-r", "0",
                       f"127.0.0.1:{PORT}", "1.3.6.1.2.1.1.3.0", check=False, env=env)
            if probe.returncode == 0:
                return int(pid.read_text())
        time.sleep(0.05)
    raise SystemExit(f"snmpd did not start: {(workdir / 'snmpd.log').read_text()[-1000:]}")


def teardown(workdir: Path) -> None:
    pid = workdir / "snmpd.pid"
    if pid.exists() and pid.read_text().strip():
        number = int(pid.read_text())
        try:
            os.kill(number, signal.SIGTERM)
            for _ in range(100):  # wait until it is gone (at most 2 s), then insist
                time.sleep(0.02)
                os.kill(number, 0)
            os.kill(number, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sh("ip", "netns", "del", NS, check=False)


def netsnmp_cycle(max_rep: int) -> tuple[int, float]:
    """One poll of every column with snmpbulkwalk (a process per column, run one after another)."""
    env = {**os.environ, "MIBS": ""}
    values, t0 = 0, time.perf_counter()
    for column in IF_COLUMNS:
        out = sh("snmpbulkwalk", "-v2c", "-c", COMMUNITY, f"-Cr{max_rep}", "-On", "-OQ", "-t", "2", "-r", "1",
                 f"127.0.0.1:{PORT}", column, env=env).stdout
        values += out.count("\n")
    return values, time.perf_counter() - t0


def inner(args: argparse.Namespace) -> None:
    """Runs inside the namespace: the measurements, printed as one JSON line."""
    sys.path.insert(0, str(REPO))
    from nms.app.polling import Poller
    from nms.config import parse_config
    from nms.store import WriteResult

    class PointsOnly:  # the store write itself is the store benchmark's business (bench/ingest.py)
        def write(self, points):
            return WriteResult(accepted=len(points))

    import yaml

    config = parse_config(yaml.safe_dump({"data_dir": "/nonexistent/unused", "fabric": {"switches": [
        {"name": "bench", "mgmt_address": "127.0.0.1", "collectors": {"snmp": {
            "community": COMMUNITY, "port": PORT, "lldp": False, "timeout": 5.0, "retries": 1,
            "max_repetitions": args.max_repetitions}}}]}}))

    async def per_column(engine) -> tuple[int, float, float]:
        """The plain pysnmp way: one bulk_walk_cmd per column (all columns concurrently)."""
        from pysnmp.hlapi.v3arch.asyncio import (
            CommunityData,
            ContextData,
            ObjectIdentity,
            ObjectType,
            UdpTransportTarget,
            bulk_walk_cmd,
        )

        target = await UdpTransportTarget.create(("127.0.0.1", PORT), timeout=5, retries=1)
        auth = CommunityData(COMMUNITY, mpModel=1)

        async def walk(column: str) -> int:
            n = 0
            async for ei, es, _, vbs in bulk_walk_cmd(engine, auth, target, ContextData(), 0, args.max_repetitions,
                                                      ObjectType(ObjectIdentity(column)), lookupMib=False,
                                                      lexicographicMode=False):
                assert not ei and not es, (ei, es)
                n += len(vbs)
            return n

        c0, t0 = time.process_time(), time.perf_counter()
        values = sum(await asyncio.gather(*(walk(c) for c in IF_COLUMNS)))
        return values, time.perf_counter() - t0, time.process_time() - c0

    async def run() -> dict:
        poller = Poller(config, PointsOnly(), registry=None)
        ours, theirs, cpu, plain = [], [], [], []
        collector = poller.collectors["snmp"]
        device = config.fabric.switches[0]
        await collector.collect(device)  # warm-up: engine, transport, snmpd's interface cache
        for _ in range(args.cycles):
            c0, t0 = time.process_time(), time.perf_counter()
            result = await collector.collect(device)
            ours.append((result.values, time.perf_counter() - t0))
            await poller.ingest(result)  # records -> rates, link state, points
            cpu.append(time.process_time() - c0)
            theirs.append(await asyncio.to_thread(netsnmp_cycle, args.max_repetitions))
            plain.append(await per_column(collector._engines.engines[0][0]))
        await poller.close()
        return {"ours": ours, "netsnmp": theirs, "cpu": cpu, "plain": plain, "ports": len(result.samples)}

    print(json.dumps(asyncio.run(run())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interfaces", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--max-repetitions", type=int, default=20)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args)
    if os.geteuid() != 0:
        raise SystemExit("needs root (a network namespace with veth interfaces)")
    for binary in ("snmpd", "snmpbulkwalk", "ip"):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} not found: apt-get install snmpd snmp iproute2")
    workdir = Path(tempfile.mkdtemp(prefix="nms-snmp-bench-"))
    try:
        t0 = time.perf_counter()
        setup(args.interfaces, workdir)
        print(f"target: namespace {NS}, {args.interfaces} veth interfaces + lo, snmpd on 127.0.0.1:{PORT} "
              f"(set up in {time.perf_counter() - t0:.1f} s)")
        out = sh("ip", "netns", "exec", NS, sys.executable, __file__, "--inner", "--cycles", str(args.cycles),
                 "--max-repetitions", str(args.max_repetitions), timeout=1800).stdout
        r = json.loads(out.strip().splitlines()[-1])
    finally:
        teardown(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    ours_v = sum(v for v, _ in r["ours"]) / sum(t for _, t in r["ours"])
    theirs_v = sum(v for v, _ in r["netsnmp"]) / sum(t for _, t in r["netsnmp"])
    ours_t = sorted(t for _, t in r["ours"])[len(r["ours"]) // 2]
    theirs_t = sorted(t for _, t in r["netsnmp"])[len(r["netsnmp"]) // 2]
    cpu = sorted(r["cpu"])[len(r["cpu"]) // 2]
    ports = r["ports"]
    print(f"{'':24} {'values/poll':>12} {'poll s (median)':>16} {'values/s':>10}")
    print(f"{'ours (pysnmp asyncio)':24} {r['ours'][0][0]:>12,} {ours_t:>16.2f} {ours_v:>10,.0f}")
    print(f"{'net-snmp snmpbulkwalk':24} {r['netsnmp'][0][0]:>12,} {theirs_t:>16.2f} {theirs_v:>10,.0f}")
    plain_v = sum(v for v, _, _ in r["plain"]) / sum(t for _, t, _ in r["plain"])
    plain_t = sorted(t for _, t, _ in r["plain"])[len(r["plain"]) // 2]
    plain_cpu = sorted(c for _, _, c in r["plain"])[len(r["plain"]) // 2]
    print(f"{'pysnmp bulk_walk_cmd':24} {r['plain'][0][0]:>12,} {plain_t:>16.2f} {plain_v:>10,.0f}"
          f"   (one walk per column; walk CPU {plain_cpu:.2f} s/poll)")
    print(f"throughput ratio ours / net-snmp: {ours_v / theirs_v:.2f}")
    print(f"CPU per poll of {ports} interfaces (18 columns, 8 counters + status): {cpu:.2f} s median of "
          f"{len(r['cpu'])} -> {cpu / 10:.1%} of one core at a 10 s interval "
          f"({cpu / 10 * 1000 / ports:.1%} per 1,000 interfaces; target < 50%)")


if __name__ == "__main__":
    main()
