"""Cluster capacity (issue 23 item 9; results in docs/scale.md): the cost of each role per record,
measured on real processes on loopback, the throughput of 1 and 2 members of `api` and `write` in the
same run, and the correlator's step time per shard.

    .venv/bin/python bench/cluster_capacity.py [--records 40000] [--live 8] [--shard-hosts 4096[,16384]]
    .venv/bin/python bench/cluster_capacity.py --quick        # a smoke run (~1 min)

The cluster is `nms cluster up`'s (nms/app/cluster_launcher.py: nats-server, PostgreSQL, influxd,
`nms serve --role R` members): 2 `api`, 2 `write`, 1 `correlate`, 1 `poll`. The base config holds
tests/_fabric_synth.py's leaf-spine fabric (synthetic agents: 16 peers x 8 paths, one ProbeWindow
per path per second, one ingest batch per host per second as an agent sends) and switches that the
`poll` member polls over SNMP from a real net-snmp snmpd on 127.0.0.1 (tests/_snmpd.py: the root
namespace's interfaces). Members not under measurement are stopped (SIGSTOP) so they do not take the
cores; the load generator (this process) shares the same 2 cores and its CPU is printed too.

CPU per record = user + system time of the member from /proc/<pid>/stat over the phase, less its
idle rate (measured while nothing is sent), divided by the records of the phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import httpx
import nats
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # `bench.*`; the synthetic fabric and the tests' snmpd

from _fabric_synth import Synth  # noqa: E402
from _snmpd import Snmpd  # noqa: E402

from bench import capacity_shards  # noqa: E402
from bench.capacity_model import SNMP_S_PER_PORT, Costs, agent_volume, poll_s, size  # noqa: E402
from nms.app import cluster_launcher  # noqa: E402
from nms.app.telemetry_bus import FAMILIES, stream_name  # noqa: E402
from nms.records import ProbeWindow  # noqa: E402
from nms.store.lineprotocol import encode_point  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
PREFIX = "nms"  # the launcher's bus prefix (BusConfig's default)
T_HIST = 1_700_000_000  # seconds: the throughput phases' windows (distinct from the live phase's)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


class Bed:
    """The launcher's cluster in a temporary directory, its members by name, their CPU and SIGSTOP."""

    def __init__(self, root: Path, base: dict, counts: dict[str, int]) -> None:
        self.root = root
        (root / "base.yaml").write_text(yaml.safe_dump(base))
        self.paused: set[str] = set()
        members = cluster_launcher.up(root / "cluster", counts, root / "base.yaml", timeout=180, step=say)
        self.pids = {m.name: m.pid for m in members}
        self.urls = {m.name: m.url for m in members}
        secrets = root / "cluster" / "secrets"
        self.ingest = (secrets / "ingest-token").read_text().strip()
        self.nats_token = (secrets / "nats-token").read_text().strip()

    def cpu(self, names: Iterable[str]) -> dict[str, float]:
        return {n: cpu_s(self.pids[n]) for n in names}

    def pause(self, *names: str) -> None:
        for n in names:
            os.kill(self.pids[n], signal.SIGSTOP)
            self.paused.add(n)

    def resume(self, *names: str) -> None:
        for n in names:
            os.kill(self.pids[n], signal.SIGCONT)
            self.paused.discard(n)

    def backlog(self, durable: str) -> int:
        """Messages the durable consumer has not had acknowledged yet, over every telemetry stream."""
        async def ask() -> int:
            nc = await nats.connect(self.urls["nats"], token=self.nats_token)
            try:
                js, left = nc.jetstream(), 0
                for family in FAMILIES:
                    info = await js.consumer_info(stream_name(PREFIX, family), durable)
                    left += info.num_pending + info.num_ack_pending
                return left
            finally:
                await nc.close()
        return asyncio.run(ask())

    def down(self) -> None:
        self.resume(*list(self.paused))
        cluster_launcher.down(self.root / "cluster", purge=True)


def host_bodies(synth: Synth, t: int) -> list[bytes]:
    """Second t's probe windows as the agents send them: one ingest body per host."""
    by_host: dict[str, list[dict]] = defaultdict(list)
    for r in synth.windows(t):
        if r.__class__ is ProbeWindow:
            by_host[r.src_host].append(r.model_dump(mode="json", exclude_none=True))
    return [json.dumps({"items": items}).encode() for items in by_host.values()]


def paths_bodies(synth: Synth) -> list[bytes]:
    by_host: dict[str, list[dict]] = defaultdict(list)
    for r in synth.inventory_records(int(time.time()) - 5):
        if r.measurement == "probe_path":
            by_host[r.src_host].append(r.model_dump(mode="json", exclude_none=True))
    return [json.dumps({"items": items}).encode() for items in by_host.values()]


def post_all(jobs: list[tuple[str, str, bytes]], token: str, concurrency: int = 16) -> float:
    """POST every (base url, kind, body), `concurrency` at a time; each must be answered 202.
    Returns the seconds taken."""
    async def run() -> None:
        todo = iter(jobs)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=120, headers=headers) as client:
            async def worker() -> None:
                for url, kind, body in todo:
                    r = await client.post(f"{url}/ingest/{kind}", content=body)
                    if r.status_code != 202:
                        raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started


def wait_backlog(bed: Bed, durable: str, at_most: int, timeout: float) -> float:
    started = time.monotonic()
    while bed.backlog(durable) > at_most:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"consumer {durable}: backlog still above {at_most} after {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic()


class Phase:
    """CPU of some members (and of this process) over a phase, less their idle rates."""

    def __init__(self, bed: Bed, names: list[str], idle: dict[str, float]) -> None:
        self.bed, self.names, self.idle = bed, names, idle
        self.cpu0, self.own0, self.t0 = bed.cpu(names), time.process_time(), time.monotonic()

    def end(self) -> tuple[float, dict[str, float], float]:
        """(seconds, member -> net CPU seconds, this process's CPU seconds)."""
        wall = time.monotonic() - self.t0
        cpu1 = self.bed.cpu(self.names)
        net = {n: cpu1[n] - self.cpu0[n] - self.idle.get(n, 0.0) * wall for n in self.names}
        return wall, net, time.process_time() - self.own0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def base_config(synth: Synth, snmpd: Snmpd, switches: int, poll_interval: float) -> dict:
    fabric = synth.fabric.model_dump(mode="json", exclude_none=True)
    # one snmpd answers every switch: a generous timeout, so a loaded machine slows polls, not fails them
    snmp = snmpd.settings(interval=poll_interval, deadline=poll_interval * 0.9, timeout=poll_interval / 2)
    fabric["switches"] += [{"name": f"snmp{i:03d}", "mgmt_address": "127.0.0.1", "collectors": {"snmp": snmp}}
                           for i in range(switches)]
    return {"site": "capacity-bench", "log_level": "info", "fabric": fabric,
            "correlator": {"enabled": True}, "polling": {"enabled": True},
            "cluster": {"write": {"batch_messages": 64, "fetch_timeout": 0.5},
                        "correlate": {"fetch_timeout": 0.2}}}


def measure_cluster(args, tmp: Path) -> dict:
    synth = Synth(spines=8, leaves=args.leaves, hosts_per_leaf=16, peers=16, paths_per_peer=8, validate=False)
    per_s = sum(1 for r in synth.windows(T_HIST - 100) if r.__class__ is ProbeWindow)
    say(f"synthetic agents: {len(synth.hosts)} hosts, {per_s:,} probe windows a second")
    snmpd = Snmpd()
    snmpd.start()
    bed = None
    try:
        bed = Bed(tmp, base_config(synth, snmpd, args.switches, args.poll_interval),
                  {"api": 2, "write": 2, "correlate": 1, "poll": 1})
        out: dict = {"hosts": len(synth.hosts), "windows_s": per_s}
        bed.pause("write-1", "write-2")  # their pull requests (fetch_timeout 0.5 s) expire before any load
        post_all([(bed.urls["api-1"], "probe_paths", b) for b in paths_bodies(synth)], bed.ingest)

        say(f"poll: {args.switches} switches every {args.poll_interval:g} s for {args.poll_s:g} s ...")
        t0_ns = time.time_ns()
        phase = Phase(bed, ["poll-1", "influxd"], {})
        snmpd_cpu0 = cpu_s(snmpd.pid)  # type: ignore[arg-type]
        time.sleep(args.poll_s)
        wall, net, _ = phase.end()
        snmpd_cpu = cpu_s(snmpd.pid) - snmpd_cpu0  # type: ignore[arg-type]
        bed.pause("poll-1")
        polls, ports = count_polls(bed, t0_ns, time.time_ns())
        out["poll"] = {"polls": polls, "ports": ports, "cpu": net["poll-1"], "snmpd": snmpd_cpu,
                       "influxd": net["influxd"], "wall": wall}
        expected = int(args.switches * args.poll_s / args.poll_interval)
        say(f"poll: {polls} switch polls of {ports} ports each stored (about {expected} due), "
            f"{net['poll-1']:.2f} CPU s")

        watched = ["api-1", "api-2", "write-1", "write-2", "correlate-1", "nats", "influxd"]
        say("idle rates (3 s) ...")
        idle_phase = Phase(bed, [n for n in watched if n not in bed.paused], {})
        time.sleep(3)
        wall, idle_cpu, _ = idle_phase.end()
        idle = {n: c / wall for n, c in idle_cpu.items()}

        out["correlate"] = live_correlate(bed, synth, args.live, idle)
        bed.pause("correlate-1")
        out["api"] = api_phases(bed, synth, args.records, idle)
        before = dir_bytes(tmp / "cluster" / "influxd")
        out["write"] = write_phases(bed, out["api"], idle)
        out["write"]["disk_bytes_per_point"] = (dir_bytes(tmp / "cluster" / "influxd") - before) / out["write"][
            "records"]
        return out
    finally:
        if bed is not None:
            say("stopping the cluster ...")
            bed.down()
        snmpd.stop()


def count_polls(bed: Bed, start_ns: int, end_ns: int) -> tuple[int, int]:
    """(switch polls, ports per poll) the poll member stored in [start, end), asked of InfluxDB."""
    q = (f'SELECT count("in_octets") FROM "port_counters" WHERE time >= {start_ns} AND time < {end_ns} '
         f'AND "device" =~ /^snmp/ GROUP BY "device", "port"')
    r = httpx.post(f"{bed.urls['influxd']}/query", params={"q": q, "db": "nms"}, timeout=30).json()
    series = r["results"][0].get("series", [])
    per_device: dict[str, list[int]] = defaultdict(list)
    for s in series:
        per_device[s["tags"]["device"]].append(int(s["values"][0][1]))
    polls = sum(max(v) for v in per_device.values())
    ports = max((len(v) for v in per_device.values()), default=0)
    return polls, ports


def live_correlate(bed: Bed, synth: Synth, seconds: int, idle: dict[str, float]) -> dict:
    """Windows of the current second, each second, through both API workers; the correlate member takes
    them from the bus (its own durable consumer) and steps once a second."""
    say(f"correlate: {seconds} s of live windows ...")
    phase = Phase(bed, ["correlate-1", "api-1", "api-2", "nats"], idle)
    records = 0
    apis = [bed.urls["api-1"], bed.urls["api-2"]]
    for _ in range(seconds):
        t = int(time.time())
        bodies = host_bodies(synth, t - 1)
        records += sum(b.count(b'"src_host"') for b in bodies)
        post_all([(apis[i % 2], "probe_windows", b) for i, b in enumerate(bodies)], bed.ingest)
        time.sleep(max(0.0, t + 1.2 - time.time()))
    wait_backlog(bed, "correlate", 0, 120)
    wall, net, own = phase.end()
    say(f"correlate: {records:,} windows, {net['correlate-1']:.2f} CPU s")
    return {"records": records, "cpu": net["correlate-1"], "wall": wall}


def api_phases(bed: Bed, synth: Synth, records: int, idle: dict[str, float]) -> dict:
    """The same number of records through api-1 alone, then through api-1 and api-2 (writers and the
    correlator stopped: the streams keep what the API published)."""
    out: dict = {"phases": []}
    t = T_HIST
    for workers in (1, 2):
        bodies: list[bytes] = []
        n = 0
        while n < records:
            more = host_bodies(synth, t)
            bodies, n, t = bodies + more, n + _records(more), t + 1
        urls = [bed.urls[f"api-{i + 1}"] for i in range(workers)]
        say(f"api x{workers}: {n:,} windows in {len(bodies)} batches ...")
        phase = Phase(bed, ["api-1", "api-2", "nats"], idle)
        elapsed = post_all([(urls[i % workers], "probe_windows", b) for i, b in enumerate(bodies)], bed.ingest)
        wall, net, own = phase.end()
        row = {"workers": workers, "records": n, "messages": len(bodies), "bytes": sum(map(len, bodies)),
               "rate": n / elapsed, "api_cpu": sum(net[u] for u in ("api-1", "api-2")), "nats_cpu": net["nats"],
               "gen_cpu": own, "wall": wall}
        out["phases"].append(row)
        say(f"api x{workers}: {row['rate']:,.0f} windows/s, API CPU {row['api_cpu']:.2f} s, "
            f"load generator {own:.2f} s, nats {net['nats']:.2f} s")
    return out


def _records(bodies: list[bytes]) -> int:
    return sum(b.count(b'"src_host"') for b in bodies)


def write_phases(bed: Bed, api: dict, idle: dict[str, float]) -> dict:
    """The backlog left by the API phases, drained by write-1 alone for one phase's messages, then by
    write-1 and write-2 for the next phase's."""
    per_phase = api["phases"][0]["messages"]
    per_msg = api["phases"][0]["records"] / per_phase
    total = bed.backlog("writer")
    out: dict = {"phases": [], "records": 0}
    for writers in (1, 2):
        names = [f"write-{i + 1}" for i in range(writers)]
        phase = Phase(bed, ["write-1", "write-2", "influxd"], idle)
        bed.resume(*[n for n in names if n in bed.paused])
        target = total - per_phase * writers
        say(f"write x{writers}: draining {per_phase} messages ...")
        wait_backlog(bed, "writer", target, 600)
        wall, net, _ = phase.end()
        n = per_phase * per_msg
        row = {"writers": writers, "records": n, "rate": n / wall, "write_cpu": net["write-1"] + net["write-2"],
               "influxd_cpu": net["influxd"], "wall": wall}
        out["phases"].append(row)
        out["records"] += n
        say(f"write x{writers}: {row['rate']:,.0f} points/s, writer CPU {row['write_cpu']:.2f} s, "
            f"influxd {net['influxd']:.2f} s")
    return out


def report(args, cluster: dict, shards: list[dict]) -> None:
    api1, api2 = cluster["api"]["phases"]
    w1, w2 = cluster["write"]["phases"]
    corr, poll = cluster["correlate"], cluster["poll"]
    api_s = api1["api_cpu"] / api1["records"]
    write_s = (w1["write_cpu"] + w2["write_cpu"]) / (w1["records"] + w2["records"])
    corr_s = corr["cpu"] / corr["records"]
    bus_bytes = api1["bytes"] / api1["records"]
    print(f"\nper-role cost ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"{'role':<10} {'unit':<22} {'CPU us/unit':>12}  measured over")
    print(f"{'api':<10} {'probe window':<22} {api_s * 1e6:>12.1f}  {api1['records']:,} windows, 1 worker")
    print(f"{'write':<10} {'probe window':<22} {write_s * 1e6:>12.1f}  {w1['records'] + w2['records']:,.0f} windows")
    print(f"{'correlate':<10} {'probe window':<22} {corr_s * 1e6:>12.1f}  {corr['records']:,} live windows")
    print(f"{'poll':<10} {'switch poll':<22} {poll['cpu'] / max(1, poll['polls']) * 1e6:>12.0f}  "
          f"{poll['polls']} polls of {poll['ports']} ports (SNMP, snmpd on loopback)")
    print(f"{'nats':<10} {'probe window':<22} {api1['nats_cpu'] / api1['records'] * 1e6:>12.1f}  "
          f"{bus_bytes:.0f} bytes a window on the bus")
    influx_s = (w1["influxd_cpu"] + w2["influxd_cpu"]) / (w1["records"] + w2["records"])
    print(f"{'influxd':<10} {'point':<22} {influx_s * 1e6:>12.1f}  "
          f"{cluster['write']['disk_bytes_per_point']:.0f} bytes a point on disk (WAL, uncompacted)")

    print("\nthroughput, 1 vs 2 members (the load generator shares the 2 cores: its CPU is shown)")
    print(f"{'role':<8} {'members':>7} {'windows/s':>10} {'ratio':>6} {'role cores':>10} {'generator cores':>15} "
          f"{'server cores':>12} {'wall s':>7}")
    for r in (api1, api2):
        print(f"{'api':<8} {r['workers']:>7} {r['rate']:>10,.0f} {r['rate'] / api1['rate']:>6.2f} "
              f"{r['api_cpu'] / r['wall']:>10.2f} {r['gen_cpu'] / r['wall']:>15.2f} "
              f"{r['nats_cpu'] / r['wall']:>12.2f} {r['wall']:>7.1f}")
    for r in (w1, w2):
        print(f"{'write':<8} {r['writers']:>7} {r['rate']:>10,.0f} {r['rate'] / w1['rate']:>6.2f} "
              f"{r['write_cpu'] / r['wall']:>10.2f} {'-':>15} {r['influxd_cpu'] / r['wall']:>12.2f} "
              f"{r['wall']:>7.1f}")
    print("(server: nats-server for api, influxd for write; cores = CPU seconds / wall seconds)")

    if shards:
        print(f"\ncorrelator step per shard (leaf split over {capacity_shards.SHARDS} members)")
        print(f"{'hosts':>6} {'shard hosts':>11} {'whole s':>8} {'shard s':>8} {'shard/whole':>11} "
              f"{'windows whole':>13} {'windows shard':>13}")
        for r in shards:
            print(f"{r['hosts']:>6} {r['shard_hosts']:>11} {r['whole_s']:>8.3f} {r['shard_s']:>8.3f} "
                  f"{r['shard_s'] / r['whole_s']:>11.2f} {r['whole_windows']:>13,} {r['shard_windows']:>13,}")

    costs = Costs(api_s=api_s, write_s=write_s, correlate_s=corr_s,
                  poll_s=poll["cpu"] / max(1, poll["polls"]), poll_ports=poll["ports"],
                  bus_bytes=bus_bytes, line_bytes=line_bytes(),
                  disk_bytes=cluster["write"]["disk_bytes_per_point"])
    print(f"\ncosts for the sizing: {costs}; a 64-port switch poll {poll_s(costs) * 1e3:.0f} ms "
          f"(+{SNMP_S_PER_PORT * 1e3:.2f} ms a port beyond {costs.poll_ports}: bench/snmp_poll.py)")
    for label, nics in (("every NIC probes 16 peers x 8 paths (the agent today)", 8),
                        ("16 peers x 8 paths per host, spread over its NICs (not built)", 1)):
        volume = agent_volume(nics=nics, peers=16, paths=8)
        print(f"\nsizing, {label}: {volume.total:,.1f} records per host per second; 8 GPUs/NICs a host, "
              "members at half a core")
        print(f"{'GPUs':>7} {'hosts':>6} {'switches':>8} {'records/s':>11} {'api':>5} {'write':>5} {'corr':>5} "
              f"{'poll':>5} {'bus msg/s':>10} {'bus MB/s':>9} {'line MB/s':>9} {'points/s':>11} {'GB/day':>8}")
        for gpus in (1_000, 10_000, 100_000):
            z = size(gpus, volume, costs)
            print(f"{z.gpus:>7,} {z.hosts:>6,} {z.switches:>8,} {z.records_s:>11,.0f} {z.api:>5} {z.write:>5} "
                  f"{z.correlate:>5} {z.poll:>5} {z.bus_msgs_s:>10,.0f} {z.bus_bytes_s / 1e6:>9.1f} "
                  f"{z.points_s * costs.line_bytes / 1e6:>9.1f} {z.points_s:>11,.0f} {z.disk_gb_day:>8,.0f}")


def line_bytes() -> float:
    """Line protocol bytes of one probe window point (what the writer sends InfluxDB)."""
    synth = Synth(validate=False)
    points = [r.to_point() for r in synth.windows(T_HIST) if r.__class__ is ProbeWindow]
    return sum(len(encode_point(p)) + 1 for p in points) / len(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40_000, help="probe windows per api phase")
    parser.add_argument("--leaves", type=int, default=4, help="synthetic leaves of 16 hosts")
    parser.add_argument("--live", type=int, default=8, help="seconds of live windows for the correlator")
    parser.add_argument("--switches", type=int, default=8)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--poll-s", type=float, default=15.0)
    parser.add_argument("--shard-hosts", default="4096",
                        help="sizes, e.g. 4096,16384 (16k: 10+ min more); '' for none")
    parser.add_argument("--shard-warm", type=int, default=2)
    parser.add_argument("--shard-windows", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small phases, 1k-host shards")
    args = parser.parse_args()
    if args.quick:
        args.records, args.leaves, args.live, args.switches, args.poll_s = 4_000, 2, 3, 4, 10.0
        args.shard_hosts, args.shard_warm, args.shard_windows = "512", 2, 1
    missing = cluster_launcher.missing_binaries() + ([] if shutil.which("snmpd") or Path("/usr/sbin/snmpd").exists()
                                                     else ["snmpd (apt-get install snmpd snmp)"])
    if missing:
        sys.exit(f"cluster capacity bench: not found: {', '.join(missing)}")
    started = time.monotonic()
    say(f"load average at the start {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="nms-capacity-") as tmp:
        os.chmod(tmp, 0o711)  # as root the launcher's PostgreSQL runs as `postgres`: it must pass through
        cluster = measure_cluster(args, Path(tmp))
    shards = [capacity_shards.run(int(n), args.shard_warm, args.shard_windows, say)
              for n in args.shard_hosts.split(",") if n]
    report(args, cluster, shards)
    print(f"\ntotal {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
