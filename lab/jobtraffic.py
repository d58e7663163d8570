"""The lab's job traffic: RoCE-like UDP flows to dport 4791 that follow the agent's steering table.

A flow is (src host, dst host, source port, offered rate). One sender process per source host
(`python -m lab.jobtraffic send`, in the host's namespace) paces every flow of that host with a
token bucket and sends from a raw UDP socket, so it can use any source port without binding it (the
agent's steer traces bind candidate ports in the same namespace). Every STEER_POLL s it re-reads the
steering table (hostprobe/steer.py, docs/steering.md): a flow whose dst address has a live entry
uses ports[i % len(ports)] (i: the flow's index among its host's flows to that dst), the others
their own source port; expired entries are ignored. Each move is logged as a JSON line
{"t_ns", "flow", "sport"} on stdout.

One receiver per destination host (`recv`) counts payload bytes per flow and writes a JSON line
{"t_ns", "bytes": {flow: n}} every `interval` s: goodput per flow per interval. Datagrams without
the generator's magic (e.g. the agents' trace probes to 4791) are skipped.

`JobTraffic` runs the lot on a lab from Python (tests, lab/control_trials.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROCE_V2_PORT = 4791
MAGIC = b"NMSJ"
HEADER = struct.Struct("!4sIQQ")  # magic, flow id, sequence, send time ns
UDP = struct.Struct("!HHHH")
STEER_POLL = 0.2  # seconds between steering-table checks: flows move within this (target: 1 s)
PAYLOAD = 1024


@dataclass
class Flow:
    id: int
    src: str  # host names
    dst: str
    src_addr: str
    dst_addr: str
    sport: int
    rate_bps: int  # offered payload rate
    dport: int = ROCE_V2_PORT


# -- sender -------------------------------------------------------------------------------------
def steered_ports(path: Path | None) -> dict[str, list[int]]:
    """{dst address: ports} of the table's live entries (none when it is missing or malformed).
    Read whole every poll: it is a few hundred bytes, and expiry needs no change to the file."""
    if path is None:
        return {}
    from hostprobe.steer import SteerError, live_routes, read_table
    try:
        return live_routes(read_table(path))
    except (SteerError, ValueError, OSError):
        return {}


def send(flows: list[Flow], steering: Path | None, duration: float, out=sys.stdout) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # we never read: keep no copies
    sock.bind((flows[0].src_addr, 0))
    rank: dict[int, int] = {}
    seen: dict[str, int] = {}
    for f in flows:
        rank[f.id] = seen.get(f.dst_addr, 0)
        seen[f.dst_addr] = rank[f.id] + 1
    sport = {f.id: f.sport for f in flows}
    seq = dict.fromkeys(sport, 0)
    pad = b"\0" * (PAYLOAD - HEADER.size)
    start = last = time.monotonic()
    credit = dict.fromkeys(sport, 0.0)
    next_poll = start
    while True:
        now = time.monotonic()
        if now - start >= duration:
            break
        if now >= next_poll:
            next_poll = now + STEER_POLL
            routes = steered_ports(steering)
            for f in flows:
                ports = routes.get(f.dst_addr)
                want = ports[rank[f.id] % len(ports)] if ports else f.sport
                if want != sport[f.id]:
                    sport[f.id] = want
                    out.write(json.dumps({"t_ns": time.time_ns(), "flow": f.id, "sport": want}) + "\n")
                    out.flush()
        dt, last = now - last, now
        for f in flows:
            credit[f.id] = min(credit[f.id] + dt * f.rate_bps / 8, 8 * PAYLOAD)
            while credit[f.id] >= PAYLOAD:
                credit[f.id] -= PAYLOAD
                seq[f.id] += 1
                body = HEADER.pack(MAGIC, f.id, seq[f.id], time.time_ns()) + pad
                packet = UDP.pack(sport[f.id], f.dport, UDP.size + len(body), 0) + body  # checksum 0: none
                try:
                    sock.sendto(packet, (f.dst_addr, 0))
                except OSError:
                    pass  # e.g. ENOBUFS under congestion: that packet is lost, as on a wire
        time.sleep(0.001)


# -- receiver -----------------------------------------------------------------------------------
def receive(bind: str, port: int, interval: float, duration: float, out=sys.stdout) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((bind, port))
    sock.settimeout(0.05)
    counts: dict[int, int] = {}
    start = time.monotonic()
    next_out = start + interval
    while time.monotonic() - start < duration:
        try:
            data = sock.recv(4096)
            if len(data) >= HEADER.size and data[:4] == MAGIC:
                fid = HEADER.unpack_from(data)[1]
                counts[fid] = counts.get(fid, 0) + len(data)
        except TimeoutError:
            pass
        if time.monotonic() >= next_out:
            next_out += interval
            out.write(json.dumps({"t_ns": time.time_ns(), "bytes": counts}) + "\n")
            out.flush()
            counts = {}


# -- running it on a lab ------------------------------------------------------------------------
class JobTraffic:
    """Senders and receivers of `flows` in the lab's host namespaces; logs under `workdir`."""

    def __init__(self, topo, flows: list[Flow], workdir: Path, steering: dict[str, Path] | None = None,
                 interval: float = 0.5):
        self.topo, self.flows, self.dir, self.interval = topo, flows, Path(workdir), interval
        self.steering = steering or {}
        self.procs: list[subprocess.Popen] = []

    def start(self, duration: float) -> JobTraffic:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        for dst in sorted({f.dst for f in self.flows}):
            addr = next(f.dst_addr for f in self.flows if f.dst == dst)
            args = [sys.executable, "-m", "lab.jobtraffic", "recv", "--bind", addr,
                    "--interval", str(self.interval), "--duration", str(duration + 2)]
            self._spawn(dst, args, self.dir / f"recv-{dst}.jsonl", env)
        time.sleep(0.3)
        for src in sorted({f.src for f in self.flows}):
            mine = [asdict(f) for f in self.flows if f.src == src]
            args = [sys.executable, "-m", "lab.jobtraffic", "send", "--flows", json.dumps(mine),
                    "--duration", str(duration)]
            if src in self.steering:
                args += ["--steering", str(self.steering[src])]
            self._spawn(src, args, self.dir / f"send-{src}.jsonl", env)
        self.started_ns = time.time_ns()
        return self

    def _spawn(self, host: str, args: list[str], log: Path, env: dict) -> None:
        from lab import sh
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen(sh.in_ns(self.topo.netns(host), args), stdout=f,
                                               stderr=subprocess.DEVNULL, env=env))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def goodput(self, start_ns: int, end_ns: int) -> dict[int, float]:
        """Mean goodput (bit/s) per flow over receiver intervals ending in (start_ns, end_ns]."""
        total: dict[int, int] = {f.id: 0 for f in self.flows}
        n = 0
        for dst in {f.dst for f in self.flows}:
            rows = _lines(self.dir / f"recv-{dst}.jsonl")
            rows = [r for r in rows if start_ns < r["t_ns"] <= end_ns]
            n = max(n, len(rows))
            for r in rows:
                for fid, b in r["bytes"].items():
                    if int(fid) in total:
                        total[int(fid)] += b
        seconds = max(n, 1) * self.interval
        return {fid: 8 * b / seconds for fid, b in total.items()}

    def moves(self) -> list[dict]:
        """Every source-port change of every sender: {"t_ns", "flow", "sport"}."""
        out = []
        for src in {f.src for f in self.flows}:
            out += _lines(self.dir / f"send-{src}.jsonl")
        return sorted(out, key=lambda r: r["t_ns"])


def _lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.jobtraffic", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("--flows", required=True, help="JSON list of flows (Flow fields), one source address")
    s.add_argument("--steering", type=Path, help="the agent's steering table to follow")
    s.add_argument("--duration", type=float, default=60.0)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=ROCE_V2_PORT)
    r.add_argument("--interval", type=float, default=0.5)
    r.add_argument("--duration", type=float, default=60.0)
    a = p.parse_args(argv)
    try:
        if a.cmd == "send":
            flows = [Flow(**f) for f in json.loads(a.flows)]
            if not flows or len({f.src_addr for f in flows}) != 1:
                p.error("--flows: want one or more flows, all from one source address")
            send(flows, a.steering, a.duration)
        else:
            receive(a.bind, a.port, a.interval, a.duration)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
