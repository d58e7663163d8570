"""NCCL profiler plugin benchmark, in one run (this machine is noisy: compare the ratios):

1. cost per event on NCCL's thread: the C driver (tests/nccl/driver.c) times a proxy step
   (startEvent + recordEventState + stopEvent, NCCL's most frequent event) through the plugin and
   through no-op functions behind the same function pointers; best of 5 interleaved rounds;
2. the agent's side: datagrams of a driver run decoded into records (hostprobe/nccl.py's path, with
   raw steps on so that part 3 has them: the folding's cost is included);
3. ingest: the decoded proxy-step records through `POST /ingest/nccl_proxy_steps` of a real
   `nms serve` (embedded store), as a ratio to writing the same points straight into the store;
4. records per rank per second the agent hands on, before (every step a record, the agent's
   `nccl.raw_steps_per_s` unlimited) and after folding steps into per-second stats
   (hostprobe/nccl_steps.py), on a paced driver run (`--pace-us` between groups).

    PYTHONPATH=. .venv/bin/python bench/nccl_profiler.py [--events 100000] [--batches 10]

Target: < 1 us added per event.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ingest import TOKEN, running_service, written  # noqa: E402
from hostprobe.nccl import NcclIntake  # noqa: E402
from nms.app.plugins import open_store  # noqa: E402
from nms.config import parse_config  # noqa: E402
from tests.nccl.harness import Sink, build_driver, run_driver, short_dir  # noqa: E402


def per_event_cost(driver: Path, events: int) -> dict[str, float]:
    sink = Sink(short_dir() / "bench.sock")
    try:  # a ring that holds a whole round: every event takes the full path (no "ring full" shortcut)
        out = run_driver(driver, 6, "bench", events, NMS_NCCL_SOCKET=str(sink.path),
                         NMS_NCCL_RING_SIZE=str(1 << (events - 1).bit_length()))
    finally:
        sink.close()
    return {k: float(v) for k, v in out.items()}


def captured_batches(driver: Path, threads: int, iters: int) -> list[bytes]:
    sink = Sink(short_dir() / "capture.sock")
    try:
        run_driver(driver, 6, "run", threads, iters, NMS_NCCL_SOCKET=str(sink.path), SLURM_JOB_ID="bench",
                   NMS_NCCL_RING_SIZE="65536")
        sink.drain()
        return list(sink.datagrams)
    finally:
        sink.close()


def decode_rate(datagrams: list[bytes]) -> tuple[float, list]:
    records: list = []
    # raw steps on (the debug setting, unlimited): every record decoded and validated, steps folded too
    intake = NcclIntake("h1", lambda kind, record: records.append((kind, record)), {}, raw_steps_per_s=10**9)
    started = time.perf_counter()
    for data in datagrams:
        intake.handle(data)
    return len(records) / (time.perf_counter() - started), records


def records_per_rank_per_second(driver: Path, ranks: int, seconds: float, pace_us: int) -> dict[str, float]:
    """A paced driver run's datagrams through the agent's intake twice: raw steps and folded ones."""
    sink = Sink(short_dir() / "rate.sock")
    iters = max(1, int(seconds * 1e6 / max(pace_us, 1)))
    try:
        out = run_driver(driver, 6, "run", ranks, iters, NMS_NCCL_SOCKET=str(sink.path), SLURM_JOB_ID="bench",
                         NMS_NCCL_RING_SIZE="65536", DRIVER_PACE_US=str(pace_us), timeout=seconds * 20 + 60)
        sink.drain()
    finally:
        sink.close()
    wall_s = int(out["wall_ns"]) / 1e9
    result = {"wall_s": wall_s, "ranks": ranks}
    for name, raw in (("before", 10**9), ("after", 0)):
        kinds: Counter[str] = Counter()
        intake = NcclIntake("h1", lambda kind, record, kinds=kinds: kinds.update([kind]), {}, raw_steps_per_s=raw)
        for data in sink.datagrams:
            intake.handle(data)
        intake.tick(final=True)
        if name == "before":  # every step went raw; its per-second stats are not shipped in this mode
            kinds.pop("nccl_step_stats", None)
        result[name] = sum(kinds.values()) / ranks / wall_s
        result[f"{name}_steps"] = (kinds.get("nccl_proxy_steps", 0) + kinds.get("nccl_step_stats", 0)) / ranks / wall_s
    return result


def ingest_ratio(steps: list, workdir: Path, batch: int) -> tuple[float, float]:
    items = [r.model_dump(mode="json", exclude_none=True) for r in steps]
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    cfg = parse_config(yaml.safe_dump({"data_dir": str(workdir / "direct")}))
    store = open_store(cfg)
    points = [[r.to_point() for r in steps[i:i + batch]] for i in range(0, len(steps), batch)]
    started = time.perf_counter()
    for chunk in points:
        assert store.write(chunk).accepted == len(chunk)
    assert store.flush(timeout=120)
    direct = len(steps) / (time.perf_counter() - started)
    store.close()

    with running_service(workdir) as url:
        bodies = [gzip.compress(json.dumps({"items": b}).encode(), 5) for b in batches]  # as the agent sends
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
        with httpx.Client(base_url=url, timeout=120, headers=headers) as c:
            started = time.perf_counter()
            for body in bodies:
                r = c.post("/ingest/nccl_proxy_steps", content=body)
                assert r.status_code == 200 and not r.json()["rejected"], r.text[:300]
            while written(c) < len(steps):
                time.sleep(0.01)
            api = len(steps) / (time.perf_counter() - started)
    return direct, api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="proxy steps per timed round")
    parser.add_argument("--batches", type=int, default=10, help="ingest batches of 5,000 proxy steps")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of the paced run (records per second)")
    parser.add_argument("--pace-us", type=int, default=100, help="pause between a rank's groups in the paced run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nms-bench-nccl-") as tmp:
        workdir = Path(tmp)
        driver = build_driver(workdir)
        cost = per_event_cost(driver, args.events)
        added = cost["plugin_ns_per_event"] - cost["noop_ns_per_event"]
        print(f"NCCL plugin benchmark, {os.cpu_count()} CPUs")
        print(f"per event (proxy step: start + state + stop): plugin {cost['plugin_ns_per_event']:.0f} ns, "
              f"no-op {cost['noop_ns_per_event']:.0f} ns, added {added:.0f} ns "
              f"(ratio {cost['plugin_ns_per_event'] / max(cost['noop_ns_per_event'], 0.1):.0f}x)  target < 1000 ns")
        print(f"  records {cost['recorded']:.0f}, dropped ring/slots/send {cost['dropped_ring']:.0f}/"
              f"{cost['dropped_slots']:.0f}/{cost['dropped_send']:.0f}")
        iters = max(1, args.batches * 5000 // 16)  # 4 proxy steps per group and thread, 4 threads
        datagrams = captured_batches(driver, 4, iters)
        rate, records = decode_rate(datagrams)
        print(f"agent decode: {rate:,.0f} records/s ({len(records)} records in {len(datagrams)} datagrams)")
        steps = [r for kind, r in records if kind == "nccl_proxy_steps"]
        direct, api = ingest_ratio(steps, workdir, 5000)
        print(f"ingest of {len(steps)} proxy steps (embedded): direct {direct:,.0f}/s, API {api:,.0f}/s, "
              f"API/direct {api / direct:.2f}")
        rate = records_per_rank_per_second(driver, 4, args.seconds, args.pace_us)
        print(f"records per rank per second ({rate['ranks']} ranks, {rate['wall_s']:.1f} s paced run): "
              f"before {rate['before']:,.0f} (steps {rate['before_steps']:,.0f}), after {rate['after']:,.0f} "
              f"(step stats {rate['after_steps']:,.1f}), x{rate['before'] / max(rate['after'], 1e-9):.1f} fewer")


if __name__ == "__main__":
    main()
