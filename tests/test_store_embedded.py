"""Embedded (DuckDB) backend specifics: persistence, retention, names DuckDB would fold, threads."""

from __future__ import annotations

import asyncio
import threading
import time

from nms.app.service import Service
from nms.store import Point, Query
from nms.store.embedded import EmbeddedStore
from tests.helpers import make_config

T0 = 1_700_000_000 * 10**9


def test_data_and_schema_survive_reopen(tmp_path):
    store = EmbeddedStore(tmp_path / "t.duckdb")
    store.write([Point("m", {"dev": "a"}, {"x": 1.0, "s": "v"}, T0)])
    store.close()
    store = EmbeddedStore(tmp_path / "t.duckdb")
    [series] = store.query(Query(measurement="m", start=T0, end=T0 + 1))
    assert series.values == [[T0, "v", 1.0]]
    result = store.write([Point("m", {"dev": "a"}, {"x": "now a string"}, T0 + 1)])
    assert result.accepted == 0 and "type conflict" in result.rejected[0][1]  # types remembered
    store.close()


def test_names_differing_only_in_case_stay_apart(tmp_path):
    store = EmbeddedStore(tmp_path / "t.duckdb")
    store.write([Point("Rate", {"Dev": "A"}, {"V": 1.0}, T0), Point("rate", {"dev": "a"}, {"v": 2.0}, T0)])
    [upper] = store.query(Query(measurement="Rate", start=T0, end=T0 + 1))
    [lower] = store.query(Query(measurement="rate", start=T0, end=T0 + 1))
    assert (upper.tags, upper.columns, upper.values) == ({"Dev": "A"}, ["time", "V"], [[T0, 1.0]])
    assert (lower.tags, lower.columns, lower.values) == ({"dev": "a"}, ["time", "v"], [[T0, 2.0]])
    store.close()


def test_prune_deletes_only_old_rows(tmp_path):
    store = EmbeddedStore(tmp_path / "t.duckdb")
    store.write([Point("m", {}, {"x": float(i)}, T0 + i) for i in range(10)])
    assert store.prune(T0 + 4) == 4
    [series] = store.query(Query(measurement="m", start=0, end=T0 + 100))
    assert [row[0] for row in series.values] == [T0 + i for i in range(4, 10)]
    store.close()


def test_service_schedules_retention(tmp_path):
    cfg = make_config(tmp_path, store={"embedded": {"retention": "1h"}}, scheduler={"retention_interval": "0.2s"})
    service = Service(cfg)
    now = time.time_ns()
    service.store.write([Point("m", {}, {"x": 1.0}, now - 2 * 3600 * 10**9), Point("m", {}, {"x": 2.0}, now)])

    async def run():
        await service.start()
        await asyncio.sleep(0.8)
        await service.stop()

    asyncio.run(run())
    store = EmbeddedStore(tmp_path / "telemetry.duckdb")
    [series] = store.query(Query(measurement="m", start=0, end=now + 1))
    assert [row[1] for row in series.values] == [2.0]
    store.close()
    text = service.metrics.registry.get_sample_value("nms_scheduler_job_runs_total",
                                                     {"job": "store-retention", "result": "ok"})
    assert text and text >= 1


def test_concurrent_batches_are_written_together_with_their_own_results(tmp_path):
    """Group commit: batches that wait while a write runs are written in one statement, and each
    caller still gets its own accepted count and rejections (with its own indices)."""
    store = EmbeddedStore(tmp_path / "t.duckdb")
    store.write([Point("g", {"w": "seed"}, {"x": 1.0, "s": "a"}, T0)])  # x is a float, s a string
    start = threading.Barrier(12)
    results: dict[int, object] = {}

    def writer(n: int) -> None:
        start.wait()
        for r in range(10):
            batch = [Point("g", {"w": str(n)}, {"x": float(r), "s": "ok"}, T0 + r * 100 + j) for j in range(20)]
            batch[n] = Point("g", {"w": str(n)}, {"x": "not a float"}, T0 + r * 100 + n)  # a type conflict at n
            results[(n, r)] = store.write(batch)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (n, r), res in results.items():
        assert res.accepted == 19 and [i for i, _ in res.rejected] == [n], (n, r, res)
        assert "type conflict" in res.rejected[0][1]
    stats = store.stats()
    assert stats["write_calls"] == 121 and stats["points_written"] == 1 + 120 * 19
    assert stats["group_writes"] < 121  # some of the 12 concurrent writers' batches went in together
    series = store.query(Query(measurement="g", start=T0, end=T0 + 10**6))
    assert sorted(len(s.values) for s in series) == [1] + [190] * 12
    store.close()


def test_a_failed_group_write_fails_every_caller_in_it(tmp_path):
    store = EmbeddedStore(tmp_path / "t.duckdb")
    store.write([Point("g", {}, {"x": 1.0}, T0)])
    store._con.execute(f"DROP TABLE {store._tables['g'].table}")  # the write statement will fail
    errors = []

    def writer(n: int) -> None:
        try:
            store.write([Point("g", {}, {"x": float(n)}, T0 + n)])
        except Exception as e:
            errors.append(type(e).__name__)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["StoreError"] * 6


def test_concurrent_writers_lose_nothing(tmp_path):
    store = EmbeddedStore(tmp_path / "t.duckdb")

    def writer(n: int) -> None:
        for i in range(50):
            store.write([Point("c", {"w": str(n)}, {"i": i}, T0 + i * 10 + j) for j in range(10)])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    series = store.query(Query(measurement="c", start=T0, end=T0 + 10**6))
    assert sorted(len(s.values) for s in series) == [500, 500, 500, 500]
    store.close()
