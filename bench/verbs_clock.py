"""How well hostprobe.verbs.HcaClock maps NIC completion stamps (HCA clock cycles) to realtime.

Runs against the fake pyverbs of tests/fakeverbs (no RDMA NIC here): a simulated 156.25 MHz HCA
clock with an offset and a drift. Every 10 ms the true realtime is compared with the mapping of
the cycle count at that instant, for (a) HcaClock (least-squares fit, recalibrated every 0.25 s)
and (b) the baseline: the nominal rate (hca_core_clock) anchored once at start, in the same run.

    .venv/bin/python bench/verbs_clock.py [--seconds 20] [--drift-ppm 47]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakeverbs"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--drift-ppm", type=float, default=47.0)
    args = parser.parse_args()
    conf = Path(tempfile.mkdtemp()) / "fabric.json"
    conf.write_text(json.dumps({"devices": [{
        "name": "bench_0", "ipv4": "127.0.0.2", "wire": ["127.0.0.2", 0], "hca_core_clock_khz": 156250,
        "clock_offset_ns": 123_456_789_000, "drift_ppm": args.drift_ppm, "timestamp_mask": (1 << 48) - 1}]}))
    os.environ["NMS_FAKE_VERBS"] = str(conf)
    from pyverbs import _fabric

    from hostprobe import verbs

    dev = verbs.VerbsDevice("127.0.0.2", {})
    device = _fabric.device_cfg("bench_0")
    clock = dev.clock
    base_cycles, base_real = clock.samples[0]
    fitted, nominal = [], []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        clock.tick(time.monotonic())
        now = time.time_ns()
        cycles = device.cycles(now)
        fitted.append(clock.to_ns(cycles) - now)
        nominal.append(base_real + (cycles - base_cycles) * clock.nominal - now)
        time.sleep(0.01)
    dev.close()
    f, n = np.abs(fitted), np.abs(nominal)
    print(f"{len(f)} samples over {args.seconds:g} s, NIC clock {args.drift_ppm:+g} ppm off realtime")
    print(f"  (a) HcaClock fit:          p50 {np.percentile(f, 50):8.0f} ns  p99 {np.percentile(f, 99):8.0f} ns  "
          f"max {f.max():8.0f} ns")
    print(f"  (b) nominal rate, anchored: p50 {np.percentile(n, 50):8.0f} ns  p99 {np.percentile(n, 99):8.0f} ns  "
          f"max {n.max():8.0f} ns")
    print(f"  p99 ratio baseline / fit: {np.percentile(n, 99) / max(np.percentile(f, 99), 1):.0f}x")


if __name__ == "__main__":
    main()
