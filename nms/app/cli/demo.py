"""`nms demo`: the README's main job on the embedded store.

Starts `nms serve` with a fresh config in a temporary data directory, then uses the API as a
collector, a job scheduler and a NOC user would: registers a job, ingests a few minutes of port
counters for a small fabric (one port congested), queries rates and aggregates back, and stops the
service cleanly (or leaves it running with --keep-running).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from nms.app.auth import new_token
from nms.app.cli.client import ApiClient, err_console
from nms.app.cli.interrupt import signals_as_ctrl_c
from nms.app.local_daemons import free_port

console = Console()

SWITCHES = ["spine1", "spine2", "leaf1", "leaf2"]
PORTS = ["swp1", "swp2", "swp3", "swp4"]
SPEED_BPS = 100 * 10**9
HOT = ("spine1", "swp2")  # the demo's congested port


def _write_config(workdir: Path, port: int) -> Path:
    config = {
        "site": "demo",
        "data_dir": str(workdir / "data"),
        "store": {"backend": "embedded"},
        "api": {"host": "127.0.0.1", "port": port,
                "tokens": [{"name": "demo-admin", "scopes": ["admin"], "token": "${NMS_TOKEN}"}]},
        "fabric": {"switches": [{"name": s, "mgmt_address": f"127.0.0.{i + 10}",
                                 "role": "spine" if s.startswith("spine") else "leaf"}
                                for i, s in enumerate(SWITCHES)]},
    }
    path = workdir / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _samples(minutes: int, start_ns: int) -> list[dict]:
    """Counters every 10 s; HOT runs at ~95% of line rate, the others at 20-40%."""
    out = []
    for step in range(minutes * 6 + 1):
        ts = start_ns + step * 10 * 10**9
        for si, switch in enumerate(SWITCHES):
            for pi, port in enumerate(PORTS):
                util = 0.95 if (switch, port) == HOT else 0.2 + 0.05 * ((si + pi) % 5)
                octets = int(util * SPEED_BPS / 8 * 10 * step)
                out.append({"device": switch, "port": port, "ts": ts, "in_octets": octets,
                            "out_octets": octets // 2, "in_errors": 0, "in_discards": step if util > 0.9 else 0,
                            "oper_status": "up", "speed_bps": SPEED_BPS})
    return out


def _rates(samples: list[dict]) -> list[dict]:
    """Per-interval rates from successive samples of each port (the SNMP collector does this later)."""
    last: dict[tuple[str, str], dict] = {}
    rates = []
    for s in samples:
        key = (s["device"], s["port"])
        prev = last.get(key)
        last[key] = s
        if prev is None:
            continue
        dt = (s["ts"] - prev["ts"]) / 1e9
        in_bps = (s["in_octets"] - prev["in_octets"]) * 8 / dt
        rates.append({"device": s["device"], "port": s["port"], "ts": s["ts"], "interval_s": dt,
                      "in_bps": in_bps, "out_bps": (s["out_octets"] - prev["out_octets"]) * 8 / dt,
                      "in_utilization": in_bps / s["speed_bps"],
                      "in_discards_ps": (s["in_discards"] - prev["in_discards"]) / dt})
    return rates


def run_demo(minutes: int = 5, keep_running: bool = False) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="nms-demo-"))
    port = free_port()
    token = new_token()
    config = _write_config(workdir, port)
    url = f"http://127.0.0.1:{port}"
    console.rule("[bold]fabric-nms demo (embedded store)")
    console.print(f"config {config}\nservice {url}  (token in env NMS_TOKEN of the server only)")
    with signals_as_ctrl_c():  # SIGTERM, SIGHUP: the Ctrl-C teardown, no orphaned `nms serve`
        _run(minutes, keep_running, workdir, config, url, token)


def _run(minutes: int, keep_running: bool, workdir: Path, config: Path, url: str, token: str) -> None:
    env = dict(os.environ, NMS_TOKEN=token)
    server = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(config)], env=env,
                              stdout=open(workdir / "server.log", "w"), stderr=subprocess.STDOUT)
    try:
        client = ApiClient(url, token)
        _wait_ready(client, server, workdir)
        console.print(f"[green]service up[/] version {client.call('GET', '/version')['version']}")

        now = time.time_ns()
        start = now - minutes * 60 * 10**9
        job = {"id": "llama-70b-pretrain-42", "name": "llama pretrain", "hosts": ["gpu001", "gpu002"],
               "nics": ["gpu001:mlx5_0", "gpu002:mlx5_0"], "start": start}
        client.call("POST", "/jobs", json=job)
        console.print(f"job {job['id']} registered on {len(job['hosts'])} hosts")

        samples = _samples(minutes, start)
        rates = _rates(samples)
        with Progress(console=console) as progress:
            task = progress.add_task("ingesting port counters and rates", total=len(samples) + len(rates))
            for kind, items in (("port_samples", samples), ("port_rates", rates)):
                for i in range(0, len(items), 500):
                    chunk = items[i:i + 500]
                    result = client.call("POST", f"/ingest/{kind}", json={"items": chunk})
                    if result["rejected"]:
                        err_console.print(f"[red]rejected:[/] {result['rejected'][:3]}")
                        raise typer.Exit(1)
                    progress.advance(task, len(chunk))
        bad = client.call("POST", "/ingest/port_rates", json={"items": [rates[0], {"device": "leaf1"}]})
        console.print(f"a batch with one malformed record: accepted {bad['accepted']}, "
                      f"rejected index {bad['rejected'][0]['index']}: {bad['rejected'][0]['errors'][0]}")

        result = client.call("POST", "/telemetry/query", json={
            "measurement": "port_rates", "start": start, "end": now + 1, "fields": ["in_utilization"],
            "window_ns": minutes * 60 * 10**9 * 2, "agg": "max"})
        table = Table("device", "port", "max utilization", title="busiest ports over the demo window")
        rows = sorted(((s["tags"]["device"], s["tags"]["port"], max(v[1] for v in s["values"]))
                       for s in result["series"]), key=lambda r: -r[2])
        for device, port_name, util in rows[:5]:
            style = "red" if util > 0.9 else ""
            table.add_row(device, port_name, f"{util:.0%}", style=style)
        console.print(table)
        if rows[0][:2] != HOT:
            err_console.print(f"[red]expected {HOT} to be the busiest port, got {rows[0][:2]}[/]")
            raise typer.Exit(1)
        jobs = client.call("GET", "/jobs", params={"active_at": now})
        console.print(f"jobs active now: {[j['id'] for j in jobs]}")
        metrics = client.call_text("/metrics")
        ingested = [line for line in metrics.splitlines() if line.startswith("nms_ingest_items_total")]
        console.print("service metrics:\n  " + "\n  ".join(ingested))
        if keep_running:
            console.print(f"[bold]service left running[/] at {url}; NMS_URL={url} NMS_TOKEN={token} nms query "
                          "port_rates --latest; Ctrl-C to stop")
            server.wait()
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
    flushed = "store flushed" in (workdir / "server.log").read_text()
    console.print(f"[green]demo done[/]: service stopped {'cleanly, store flushed' if flushed else '[red]uncleanly[/]'}"
                  f"; data and server.log in {workdir}")
    if not flushed:
        raise typer.Exit(1)


def _wait_ready(client: ApiClient, server: subprocess.Popen, workdir: Path) -> None:
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            err_console.print(f"[red]service exited[/] (code {server.returncode}):\n"
                              f"{(workdir / 'server.log').read_text()[-2000:]}")
            raise typer.Exit(1)
        try:
            if httpx.get(f"{client.url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    err_console.print("[red]service did not become ready in 30 s[/]")
    raise typer.Exit(1)
