"""Volume at the source (issue 23 item 10; docs/scale.md): records per host per second that real
`nms-agent` processes send to the API, by ingest kind, next to what bench/capacity_model.py derives
from the agent's config for the same peers and paths.

    .venv/bin/python bench/agent_volume.py [--agents 17] [--seconds 125]     # --quick: 5 agents, 10 s

Real parts, as tests/test_hostprobe_agent.py runs them (no root, no lab): one `nms serve` and one
`nms-agent` per loopback address (127.0.0.2, ...), each agent at the default probe, clock, counter and
report settings; the service's peer plan gives every agent all the others as peers
(`agents.peers_random` = agents - 1). Loopback has one path per peer (every source port takes it), so
the measured case is N-1 peers x 1 path; the windows scale with paths by construction (one ProbeWindow
per path per 1 s window). Counted per kind, after every agent has its paths up: the records whose own
timestamps fall in the measured span, read back through `/telemetry/query` once the count settles
(steady state, whatever the agents spooled meanwhile), and the service's
`nms_ingest_items_total{result="accepted"}` over the span (what reached the API then).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.capacity_model import agent_volume  # noqa: E402
from nms.app.local_daemons import free_port  # noqa: E402

ADMIN = "volume-bench-admin-token-0123456789"
AGENT = "volume-bench-agent-token-0123456789"
KEY = "volume-bench-probe-key-0123456789"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def accepted(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120).text
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^nms_ingest_items_total\{kind="([^"]+)",result="accepted"\} (\S+)$', text, re.M)}


MEASUREMENTS = {"probe_windows": "probe_window", "clock_edges": "clock_edge", "probe_paths": "probe_path",
                "host_nic_samples": "host_nic", "points": "agent_stats", "path_events": "path_event"}


def stored(url: str, start_ns: int, end_ns: int) -> dict[str, int]:
    """Records per kind whose own timestamps fall in [start, end), read back through the API."""
    out = {}
    for kind, measurement in MEASUREMENTS.items():
        r = httpx.post(f"{url}/telemetry/query", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120,
                       json={"measurement": measurement, "start": start_ns, "end": end_ns, "limit": 1_000_000})
        r.raise_for_status()
        out[kind] = sum(len(series["values"]) for series in r.json()["series"])
    return out


def stored_settled(url: str, start_ns: int, end_ns: int, at_most: float = 90.0) -> dict[str, int]:
    """`stored`, once two reads 3 s apart agree (the agents' late or spooled batches are in)."""
    deadline, last = time.monotonic() + at_most, stored(url, start_ns, end_ns)
    while time.monotonic() < deadline:
        time.sleep(3.0)
        now = stored(url, start_ns, end_ns)
        if now == last:
            break
        last = now
    return last


def paths_up(tmp: Path, host: str) -> int:
    try:
        return int(json.loads((tmp / host / "status.json").read_text())["stats"].get("paths_up", 0))
    except (OSError, ValueError, KeyError):
        return 0


def run(agents: int, seconds: float, tmp: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Per host per second, by kind: (records timestamped in the span, records that reached the API in it)."""
    hosts = {f"h{i:02d}": f"127.0.0.{i + 2}" for i in range(agents)}
    port, probe_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp / "nms.yaml").write_text(yaml.safe_dump({
        "data_dir": str(tmp / "data"), "log_level": "warning", "correlator": {"enabled": False},
        "fabric": {"hosts": [{"name": h, "nics": [{"name": "lo", "address": a}]} for h, a in hosts.items()]},
        "agents": {"peers_random": agents - 1},
        "api": {"port": port, "tokens": [{"name": "admin", "scopes": ["admin"], "token": ADMIN},
                                         {"name": "agents", "scopes": ["ingest"], "token": AGENT}]}}))
    procs: list[subprocess.Popen] = []
    try:
        with open(tmp / "serve.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(tmp / "nms.yaml")],
                                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
        _wait(lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200, 60, "the service")
        for host, address in hosts.items():
            conf = {"host": host, "service": {"url": url, "token": AGENT},
                    "nics": [{"name": "lo", "address": address}], "probe": {"key": KEY, "port": probe_port},
                    "report": {"buffer_dir": str(tmp / host)}}
            (tmp / f"{host}.yaml").write_text(yaml.safe_dump(conf))
            with open(tmp / f"{host}.log", "ab") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "hostprobe.agent", "--config",
                                               str(tmp / f"{host}.yaml")], stdout=log, stderr=subprocess.STDOUT,
                                              cwd=REPO))
        say(f"{agents} agents started; waiting until each has its {agents - 1} paths up ...")
        try:
            _wait(lambda: all(paths_up(tmp, h) >= agents - 1 for h in hosts), 240, "every agent's paths")
        except TimeoutError:  # a loaded machine: measure what is up, and say so
            say("not every agent has every path up after 240 s")
        time.sleep(2.0)  # the windows of the first traced seconds are out
        up = sorted(paths_up(tmp, h) for h in hosts)
        say(f"paths up per agent: {up[0]}..{up[-1]} of {agents - 1}; measuring {seconds:g} s ...")
        before, t0, start_ns = accepted(url), time.monotonic(), time.time_ns()
        time.sleep(seconds)
        after, span, end_ns = accepted(url), time.monotonic() - t0, time.time_ns()
        arrived = {k: (after[k] - before.get(k, 0.0)) / span / agents for k in after}
        say("reading back the records timestamped in the span ...")
        own = stored_settled(url, start_ns, end_ns)
        return {k: n / ((end_ns - start_ns) / 1e9) / agents for k, n in own.items()}, arrived
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=17)
    parser.add_argument("--seconds", type=float, default=125.0, help="cover a retrace (120 s)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.seconds = 5, 10.0
    with tempfile.TemporaryDirectory(prefix="nms-agent-volume-") as tmp:
        measured, arrived = run(args.agents, args.seconds, Path(tmp))
    derived = agent_volume(nics=1, peers=args.agents - 1, paths=1)
    print(f"\nrecords per host per second: {args.agents - 1} peers x 1 path (loopback), 1 NIC, default settings")
    print(f"{'kind':<18} {'timestamped':>11} {'arrived':>9} {'derived':>9}")
    for kind in MEASUREMENTS:
        print(f"{kind:<18} {measured.get(kind, 0.0):>11.3f} {arrived.get(kind, 0.0):>9.3f} "
              f"{getattr(derived, kind, 0.0):>9.3f}")
    print(f"{'total':<18} {sum(measured.values()):>11.2f} {sum(arrived.get(k, 0.0) for k in MEASUREMENTS):>9.2f} "
          f"{derived.total:>9.2f}")
    print("(timestamped: records whose own time is in the span, read back; arrived: accepted by the API in it)")
    print("\nderived at other settings (hostprobe/config.py defaults otherwise):")
    for nics, peers, paths in ((1, 12, 4), (1, 16, 8), (8, 16, 8)):
        v = agent_volume(nics=nics, peers=peers, paths=paths)
        print(f"  {nics} NIC(s) x {peers} peers x {paths} paths: {v.total:,.1f} records/s "
              f"({v.probe_windows:,.0f} probe windows)")


if __name__ == "__main__":
    main()
