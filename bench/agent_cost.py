"""CPU and memory of the probe agent at 1,000 exchanges per second, against a same-run baseline.

    sudo .venv/bin/python bench/agent_cost.py [--rate 1000] [--duration 20]

On a 2x2x2 lab with the service and an agent on every host: host1's agent is told (set_rate
command) to send `--rate` exchanges per second in all, spread over its probed paths; the others
stay at the default 10 per second per path and answer. The CPU time (user + system, from
/proc/<pid>/stat) of host1's agent over `--duration` seconds is the agent's cost; the responders'
cost per answered exchange is reported too.

Baseline, same lab, same packet rate, agents stopped: a bare Python UDP ping in host1's namespace
(two sends per "pair", replies drained every 10 ms like the agent's loop; no timestamps, no MAC, no
windows, no follow-ups) against bare echo processes on the same peers. Its CPU is the floor any
Python prober pays for the same packets, the kernel's forwarding of them through the lab included:
in the lab the sender's system time carries the softirq work of every namespace its packets cross
(veth forwarding runs in the sending context), which a real host does not pay. The ratio agent /
baseline is the agent's own overhead; absolute numbers are % of one core.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss / 1024, pss / 1024


class Load(float):
    """CPU share of one core (user + system), with the split kept."""

    def __new__(cls, user: float, system: float):
        obj = super().__new__(cls, user + system)
        obj.user, obj.system = user, system
        return obj

    def __str__(self) -> str:
        return f"{self * 100:6.2f} % of one core (user {self.user * 100:.2f}, system {self.system * 100:.2f})"


def measure(pids: list[int], seconds: float, repeat: int = 1) -> list[Load]:
    """CPU share per process over `seconds`; with repeat > 1, the run whose first process is the median."""
    runs = []
    for _ in range(repeat):
        before = [cpu_seconds(p) for p in pids]
        time.sleep(seconds)
        after = [cpu_seconds(p) for p in pids]
        runs.append([Load((a[0] - b[0]) / seconds, (a[1] - b[1]) / seconds) for a, b in zip(after, before)])
    runs.sort(key=lambda r: r[0])
    return runs[len(runs) // 2]


# --- the baseline: bare Python UDP ping/echo (run inside the namespaces) ---------------------------

def baseline_echo(addr: str, port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)


def baseline_ping(addr: str, peers: list[str], port: int, rate: float, seconds: float) -> None:
    """Pairs of datagrams at `rate` exchanges/s round robin over `peers`, replies drained; the loop runs
    every 10 ms like the agent's (batching is what makes Python affordable at this rate)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 0))
    s.setblocking(False)
    payload = b"\0" * 52  # the size of the agent's PROBE
    interval = 2.0 / rate
    got = sent = i = 0
    nxt = start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.01)
        now = time.monotonic()
        while nxt <= now:
            peer = (peers[i % len(peers)], port)
            i += 1
            for _ in range(2):
                s.sendto(payload, peer)
                sent += 1
            nxt += interval
        while True:
            try:
                s.recvfrom(2048)
                got += 1
            except BlockingIOError:
                break
    print(f"sent {sent} received {got}", flush=True)


# --- the run ---------------------------------------------------------------------------------------

def run(rate: float, duration: float, repeat: int) -> None:
    from hostprobe.config import ProbeSettings
    from lab import agent_procs
    from lab.mesh import MeshLab

    mesh = MeshLab("nmsb-", "198.18.247.0/24")
    try:
        mesh.up()
        mesh.wait_traced()
        status = mesh.agent_status()
        pids = {h: a["pid"] for h, a in status.items()}
        n_paths = len(status["host1"]["paths"])
        time.sleep(2.0)
        idle = measure([pids["host1"]], 10.0)[0]
        mesh.command("set_rate", {"rate": rate / n_paths}, hosts=["host1"])
        time.sleep(3.0)
        first = (time.time_ns() // 10**9 + 1) * 10**9
        loads = measure([pids[h] for h in ("host1", "host2", "host3", "host4")], duration, repeat)
        last = time.time_ns() // 10**9 * 10**9
        mem = memory_mib(pids["host1"])
        time.sleep(3.5)  # the last windows close (1 s + timeout) and are reported
        windows = mesh.query("probe_window", first, last, src_host="host1")
        sent = sum(w["sent"] for w in windows)
        achieved = sent / ((last - first) / 1e9)
        lost = 1 - sum(w["received"] for w in windows) / max(1, sent)
        agent_procs.stop(mesh.dir)

        topo = mesh.topo
        peers = [topo.link_of_port(h, "eth0").b.ip for h in ("host2", "host3", "host4")]
        echoes = [subprocess.Popen(["ip", "netns", "exec", topo.netns(h), sys.executable, __file__, "--echo",
                                    topo.link_of_port(h, "eth0").b.ip]) for h in ("host2", "host3", "host4")]
        time.sleep(1.0)
        ping = subprocess.Popen(["ip", "netns", "exec", topo.netns("host1"), sys.executable, __file__, "--ping",
                                 topo.link_of_port("host1", "eth0").b.ip, ",".join(peers), str(rate),
                                 str(repeat * duration + 4)], stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)
        base = measure([ping.pid, *(e.pid for e in echoes)], duration, repeat)
        base_mem = memory_mib(ping.pid)
        out, _ = ping.communicate(timeout=30)
        for e in echoes:
            e.kill()
            e.wait()
    finally:
        mesh.down()

    responders = sum(loads[1:])
    print(f"probe agent cost on the fabric lab ({os.cpu_count()} CPUs), {duration:.0f} s per measurement"
          + (f", median of {repeat}" if repeat > 1 else ""))
    default = ProbeSettings.model_fields["rate"].default
    print(f"  host1 agent, default rate ({default:g}/s per path, {n_paths} paths): {idle}")
    print(f"  host1 agent at {rate:.0f} exchanges/s (its windows: {achieved:.0f}/s sent, loss {lost * 100:.3f} %):")
    print(f"      {loads[0]}, RSS {mem[0]:.1f} MiB, PSS {mem[1]:.1f} MiB")
    print(f"  responders (host2-4 agents, answering host1 and probing at {default:g}/s): "
          f"{responders * 100:6.2f} % in all")
    print(f"  baseline: bare Python UDP ping at {rate:.0f}/s ({out.strip()}):")
    print(f"      {base[0]}, RSS {base_mem[0]:.1f} MiB; bare echoes {sum(base[1:]) * 100:.2f} % in all")
    print(f"  ratio agent / baseline (prober side): {loads[0] / base[0]:.2f}")
    print(f"  target: agent < 5 % of one core at {rate:.0f} exchanges/s: "
          f"{'met' if loads[0] < 0.05 else 'NOT met'}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--echo":
        baseline_echo(sys.argv[2], 33434)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--ping":
        baseline_ping(sys.argv[2], sys.argv[3].split(","), 33434, float(sys.argv[4]), float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="exchanges per second sent by host1's agent")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements under load (the median is shown)")
    args = parser.parse_args()
    from lab.sh import require_root

    require_root()
    run(args.rate, args.duration, args.repeat)


if __name__ == "__main__":
    main()
