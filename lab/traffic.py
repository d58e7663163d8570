"""Load: iperf3 flows in patterns (pairs, all-to-all, incast), TCP or UDP, pinned source ports.

One one-shot iperf3 server per flow (its own port) in the destination namespace, one client per
flow with `--cport` (the data stream's source port: that is what places a flow on an ECMP path)
and `-J`; clients start together. iperf3's control connection takes an ephemeral port, so under a
blackhole fault it may itself hash onto the dead link: that flow then reports a connect error.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from lab import paths, services, sh
from lab.state import LabDir, now, topology_of
from lab.topology import Topology, parse_rate

PATTERNS = ("pairs", "all-to-all", "incast")
MAX_FLOWS = 256
KEEP_RUNS = 50


@dataclass
class Flow:
    src: str
    dst: str
    proto: str
    sport: int
    dport: int
    rate_bps: int  # 0: as fast as TCP goes
    spine: str | None = None


def choose_pairs(topo: Topology, pattern: str, pairs: list[str], hosts: list[str],
                 dst: str | None) -> list[tuple[str, str]]:
    all_hosts = [h.name for h in topo.by_role("host")]
    for h in hosts + ([dst] if dst else []) + [x for p in pairs for x in p.split(":")]:
        if h not in all_hosts:
            raise sh.LabError(f"unknown host {h!r} (hosts: {', '.join(all_hosts[:6])}...)")
    hosts = hosts or all_hosts
    if pattern == "pairs":
        if pairs:
            out = [tuple(p.split(":")) for p in pairs]
            if any(len(p) != 2 or p[0] == p[1] for p in out):
                raise sh.LabError("--pair takes SRC:DST with two different hosts")
            return out
        # default: each host sends to the same-position host under the next leaf
        H, L = topo.spec.hosts_per_leaf, topo.spec.leaves
        if L < 2:
            raise sh.LabError("default pairs need 2+ leaves; give --pair SRC:DST")
        return [(f"host{i}", f"host{(i - 1 + H) % (H * L) + 1}") for i in range(1, H * L + 1)
                if f"host{i}" in hosts and f"host{(i - 1 + H) % (H * L) + 1}" in hosts]
    if pattern == "all-to-all":
        return [(a, b) for a in hosts for b in hosts if a != b]
    if pattern == "incast":
        target = dst or hosts[0]
        return [(a, target) for a in hosts if a != target]
    raise sh.LabError(f"unknown pattern {pattern!r}; choose one of {', '.join(PATTERNS)}")


def plan_flows(topo: Topology, pairs: list[tuple[str, str]], proto: str, rate: str | None, sport: int,
               dport: int, via: str | None = None) -> list[Flow]:
    if proto not in ("tcp", "udp"):
        raise sh.LabError("--proto must be tcp or udp")
    if not pairs:
        raise sh.LabError("no flows: the pattern selected no host pairs")
    if len(pairs) > MAX_FLOWS:
        raise sh.LabError(f"{len(pairs)} flows is more than {MAX_FLOWS} iperf3 pairs; pick --hosts")
    if via and (via not in topo.nodes or topo.nodes[via].role != "spine"):
        raise sh.LabError(f"--via needs a spine name, got {via!r}")
    rate_bps = parse_rate(rate) if rate else (topo.spec.link_rate_bps if proto == "udp" else 0)
    flows, used = [], set()
    for i, (src, dst) in enumerate(pairs):
        if via and paths.predict(topo, src, dst)["spine"] is None:
            raise sh.LabError(f"{src} and {dst} hang off the same leaf: no source port takes them via {via}")
        port = dport + i
        sp = sport + i if not via else paths.sport_via(topo, src, dst, via, proto, port, sport, used)
        used.add(sp)
        pred = paths.predict(topo, src, dst, proto, sp, port)
        flows.append(Flow(src, dst, proto, sp, port, rate_bps, pred["spine"]))
    return flows


def _listening(pid: int, port: int) -> bool:
    """Is process `pid` listening on TCP `port`? (/proc/PID/net/tcp shows its own namespace)."""
    try:
        lines = open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]
    except OSError:
        return False
    return any(f[1].endswith(f":{port:04X}") and f[3] == "0A" for f in (ln.split() for ln in lines))


def run_flows(topo: Topology, flows: list[Flow], duration: float, length: int | None = None,
              tick: Callable[[float], None] = lambda _: None, burst: int | None = None) -> list[dict]:
    sh.require_binaries(["iperf3"])
    addr = {h.name: topo.host_port(h.name).ip for h in topo.by_role("host")}
    servers = [subprocess.Popen(sh.in_ns(topo.netns(f.dst), ["iperf3", "-s", "-1", "-B", addr[f.dst],
                                                             "-p", str(f.dport)]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for f in flows]
    clients = []
    try:
        deadline = time.monotonic() + 5
        while not all(_listening(s.pid, f.dport) for s, f in zip(servers, flows, strict=False)):
            if time.monotonic() > deadline:
                raise sh.LabError("iperf3 servers did not start listening within 5 s")
            time.sleep(0.02)
        for f in flows:
            args = ["iperf3", "-c", addr[f.dst], "-p", str(f.dport), "-B", addr[f.src], "--cport", str(f.sport),
                    "-t", str(duration), "-J", "--connect-timeout", "3000"]
            if f.proto == "udp":
                args += ["-u"]
            if f.rate_bps:  # with a burst, packets leave in groups of that many at the same average rate
                args += ["-b", f"{f.rate_bps}/{burst}" if burst else str(f.rate_bps)]
            if length:
                args += ["-l", str(length)]
            clients.append(subprocess.Popen(sh.in_ns(topo.netns(f.src), args), stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True))
        t0 = time.monotonic()
        outputs = []
        for c in clients:
            while c.poll() is None and time.monotonic() - t0 < duration + 15:
                tick(min(1.0, (time.monotonic() - t0) / duration))
                time.sleep(0.1)
            if c.poll() is None:
                c.kill()
            outputs.append(c.communicate()[0])
        return [_result(f, out, duration) for f, out in zip(flows, outputs, strict=False)]
    finally:
        services.kill([p.pid for p in clients + servers if p.poll() is None], grace=1)
        for p in clients + servers:
            p.wait()


def _result(f: Flow, out: str, duration: float) -> dict:
    r = {**asdict(f), "duration": duration, "sent_bps": None, "received_bps": None,
         "lost_percent": None, "retransmits": None, "error": None}
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        r["error"] = (out.strip().splitlines() or ["iperf3 produced no output (killed after timeout)"])[-1]
        return r
    end = data.get("end", {})
    if data.get("error"):
        r["error"] = data["error"]
    if f.proto == "tcp" and "sum_sent" in end:
        r.update(sent_bps=end["sum_sent"]["bits_per_second"], received_bps=end["sum_received"]["bits_per_second"],
                 retransmits=end["sum_sent"].get("retransmits"))
    elif f.proto == "udp" and "sum" in end:
        s = end["sum"]
        lost = s.get("lost_percent", 0.0)
        received = end.get("sum_received", {}).get("bits_per_second", s["bits_per_second"] * (1 - lost / 100))
        r.update(sent_bps=s["bits_per_second"], lost_percent=lost, received_bps=received)
    return r


def run(lab: LabDir, pattern: str, *, pairs: list[str] = (), hosts: list[str] = (), dst: str | None = None,
        proto: str = "tcp", rate: str | None = None, duration: float = 5.0, sport: int = 40000,
        dport: int = 5201, via: str | None = None, length: int | None = None, burst: int | None = None,
        tick: Callable[[float], None] = lambda _: None) -> dict:
    """Plan, run and record one traffic run; returns the record (also appended to state.traffic)."""
    sh.require_root()
    if duration <= 0:
        raise sh.LabError("--duration must be positive")
    with lab.locked():
        topo = topology_of(lab.load())
    flows = plan_flows(topo, choose_pairs(topo, pattern, list(pairs), list(hosts), dst), proto, rate, sport, dport, via)
    start = now()
    if burst is not None and not (rate and 1 <= burst <= 10_000):
        raise sh.LabError("--burst needs --rate and is 1..10000 packets")
    results = run_flows(topo, flows, duration, length, tick, burst)
    end = now()
    record = {"pattern": pattern, "proto": proto, "start_ns": start["ns"], "start_iso": start["iso"],
              "end_ns": end["ns"], "end_iso": end["iso"], "flows": results}
    with lab.update() as state:  # ground truth of offered load, for scoring congestion detection
        state["traffic"] = (state.get("traffic", []) + [record])[-KEEP_RUNS:]
    return record
