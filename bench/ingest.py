"""Ingest benchmark: points/s through `POST /ingest/port_samples` of a real `nms serve` process,
as a ratio to writing the same points straight into the same backend from this process, in the
same run (this machine is noisy; the ratio is what to compare).

    .venv/bin/python bench/ingest.py [--batches 20] [--batch-size 5000] [--backend embedded|influxdb|all]

Target: ratio >= 0.5 for 5,000-point batches on each backend.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # reuse the test suite's influxd runner

from nms.app.plugins import open_store  # noqa: E402
from nms.config import parse_config  # noqa: E402
from nms.records import PortSample  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
T0 = 1_700_000_000 * 10**9


def make_batches(n_batches: int, size: int, offset_ns: int) -> list[list[dict]]:
    """Realistic port counters: 500 ports of 10 switches, successive 10 s samples."""
    batches = []
    for b in range(n_batches):
        batch = []
        for i in range(size):
            step, port = divmod(b * size + i, 500)
            batch.append({"device": f"leaf{port % 10:02d}", "port": f"swp{port // 10 + 1}",
                          "ts": T0 + offset_ns + step * 10**10, "in_octets": step * 123_456_789,
                          "out_octets": step * 98_765_432, "in_pkts": step * 1000, "out_pkts": step * 900,
                          "in_errors": 0, "in_discards": step % 3, "oper_status": "up", "speed_bps": 400 * 10**9})
        batches.append(batch)
    return batches


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_config(backend: str, data_dir: Path, influx_url: str | None, database: str) -> dict:
    store: dict = {"backend": backend}
    if backend == "influxdb":
        store["influxdb"] = {"url": influx_url, "database": database, "flush_interval": "0.2s"}
    return store


def bench_direct(backend: str, batches: list[list[dict]], workdir: Path, influx_url: str | None) -> float:
    cfg = parse_config(yaml.safe_dump({"data_dir": str(workdir / "direct"),
                                       "store": store_config(backend, workdir, influx_url, "bench_direct")}))
    store = open_store(cfg)
    # The direct path starts from the same JSON-shaped data, already parsed into records.
    points = [[PortSample.model_validate(item).to_point() for item in batch] for batch in batches]
    started = time.perf_counter()
    for batch in points:
        result = store.write(batch)
        assert result.accepted == len(batch), result.rejected[:3]
    assert store.flush(timeout=120)
    elapsed = time.perf_counter() - started
    store.close()
    return sum(map(len, batches)) / elapsed


@contextlib.contextmanager
def running_service(workdir: Path, store: dict | None = None) -> Iterator[str]:
    """`nms serve` as a process with an admin token (TOKEN) on a free port; yields its URL once healthy."""
    port = free_port()
    config = workdir / "api.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "api"), "log_level": "warning", **({"store": store} if store else {}),
        "api": {"port": port, "tokens": [{"name": "bench", "scopes": ["admin"], "token": TOKEN}]}}))
    server = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=open(workdir / "server.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


def bench_api(backend: str, batches: list[list[dict]], workdir: Path, influx_url: str | None) -> float:
    with running_service(workdir, store_config(backend, workdir, influx_url, "bench_api")) as url:
        bodies = [json.dumps({"items": batch}).encode() for batch in batches]
        with httpx.Client(base_url=url, timeout=120,
                          headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}) as c:
            started = time.perf_counter()
            for body in bodies:
                r = c.post("/ingest/port_samples", content=body)
                assert r.status_code == 200 and not r.json()["rejected"], r.text[:300]
            # Count only points the backend really holds (InfluxDB writes are buffered).
            total = sum(map(len, batches))
            while written(c) < total:
                time.sleep(0.01)
            elapsed = time.perf_counter() - started
    return sum(map(len, batches)) / elapsed


def written(client: httpx.Client) -> float:
    match = re.search(r"^nms_store_points_written\{[^}]*\} (\S+)$", client.get("/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def run(backend: str, args, influx_url: str | None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix=f"nms-bench-{backend}-") as tmp:
        workdir = Path(tmp)
        direct = bench_direct(backend, make_batches(args.batches, args.batch_size, 0), workdir, influx_url)
        api = bench_api(backend, make_batches(args.batches, args.batch_size, 0), workdir, influx_url)
    return direct, api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--backend", choices=["embedded", "influxdb", "all"], default="all")
    args = parser.parse_args()
    backends = ["embedded", "influxdb"] if args.backend == "all" else [args.backend]
    print(f"ingest benchmark: {args.batches} batches x {args.batch_size} PortSample points, "
          f"{os.cpu_count()} CPUs")
    print(f"{'backend':<10} {'direct pts/s':>14} {'API pts/s':>12} {'API/direct':>11}  target >= 0.5")
    for backend in backends:
        influx = None
        if backend == "influxdb":
            from _influx import InfluxServer

            influx = InfluxServer()
            influx.start()
        try:
            direct, api = run(backend, args, influx.url if influx else None)
        finally:
            if influx:
                influx.stop()
        ratio = api / direct
        print(
            f"{backend:<10} {direct:>14,.0f} {api:>12,.0f} {ratio:>11.2f}  {'ok' if ratio >= 0.5 else 'BELOW TARGET'}"
        )


if __name__ == "__main__":
    main()
