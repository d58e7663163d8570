"""The embedded store's group commit: many agents' small report batches arriving at once.

12 writers (the lab's 12 agents) each write a 30-point probe_window batch per round, all at the
same moment (a barrier: agents' windows close together), for 20 rounds, into a store already
holding 300,000 rows. Baseline, same run, same batches: written one after another (each its own
DuckDB statement, what the store did before group commit). Prints the time per round and the
ratio.

    .venv/bin/python bench/store_group_commit.py [--writers 12] [--rounds 20] [--points 30]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nms.store import Point  # noqa: E402
from nms.store.embedded import EmbeddedStore  # noqa: E402

T0 = 1_800_000_000_000_000_000


def batch(writer: int, n: int, ts: int) -> list[Point]:
    return [Point("probe_window", {"src_host": f"h{writer}", "dst_host": f"h{i % 12}", "path_id": f"p{i}"},
                  {f"f{k}": random.random() for k in range(20)}, ts) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--points", type=int, default=30)
    args = parser.parse_args()
    store = EmbeddedStore(Path(tempfile.mkdtemp()) / "bench.duckdb")
    for j in range(100):
        store.write(batch(j % 12, 3000, T0 + j * 10**9))
    rounds = [[batch(w, args.points, T0 + (1000 + r) * 10**9) for w in range(args.writers)] for r in range(args.rounds)]

    before = store.stats()
    t = time.perf_counter()
    for r in range(args.rounds):
        for b in rounds[r]:
            store.write([Point(p.measurement, p.tags, p.fields, p.ts + 1) for p in b])
    sequential = (time.perf_counter() - t) / args.rounds
    seq_groups = store.stats()["group_writes"] - before["group_writes"]

    barrier = threading.Barrier(args.writers)

    def writer(w: int) -> None:
        for r in range(args.rounds):
            barrier.wait()
            store.write(rounds[r][w])

    before = store.stats()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    grouped = (time.perf_counter() - t) / args.rounds
    groups = store.stats()["group_writes"] - before["group_writes"]
    store.close()
    n = args.writers * args.rounds
    print(f"{args.writers} writers x {args.points} points, {args.rounds} rounds, store of 300,000 rows")
    print(
        f"  baseline, one after another: {sequential * 1000:7.1f} ms per round "
        f"({seq_groups:.0f} statements for {n} batches)"
    )
    print(
        f"  at once, group commit:       {grouped * 1000:7.1f} ms per round ({groups:.0f} statements for {n} batches)"
    )
    print(f"  ratio baseline / group commit: {sequential / grouped:.1f}x")


if __name__ == "__main__":
    main()
