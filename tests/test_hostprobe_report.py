"""The agent's report buffer with no service listening: batches go to the bounded on-disk spool, the
oldest are dropped when it is full, and what is left survives a restart of the reporter."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

from pydantic import SecretStr

from hostprobe.client import ServiceClient
from hostprobe.config import ServiceSettings
from hostprobe.report import Reporter
from tests.test_cli_service import _free_port


def _reporter(tmp_path, max_bytes: int, stats) -> Reporter:
    settings = ServiceSettings(url=f"http://127.0.0.1:{_free_port()}", token=SecretStr("t" * 20), timeout=1.0)
    return Reporter(ServiceClient(settings, "h1"), tmp_path, max_bytes, 1.0, stats)


def _window(i: int) -> dict:
    return {"src_host": "h1", "src_nic": "eth0", "dst_host": "h2", "dst_nic": "eth0", "path_id": f"p{i}",
            "window_start": 1_800_000_000 * 10**9 + i * 10**9, "sent": 10, "received": 10}


def test_unreachable_service_spools_then_drops_oldest_and_keeps_the_rest(tmp_path):
    stats = defaultdict(int)
    rep = _reporter(tmp_path, 4096, stats)
    for batch in range(30):
        for i in range(20):
            rep.put("probe_windows", _window(batch * 100 + i))
        rep.flush()
    assert stats["records_delivered"] == 0 and stats["batches_buffered"] == 30
    assert 0 < rep.buffered_bytes <= 4096
    assert stats["records_dropped"] > 0 and stats["records_dropped"] % 20 == 0  # whole batches, oldest first
    kept = len(rep.spool)
    newest = rep.spool.head(1000, 1 << 30)[-1].read()
    rep.stop()
    kind, _, body = newest.partition(b"\n")
    items = json.loads(gzip.decompress(body))["items"]
    assert kind == b"probe_windows" and items[-1]["path_id"] == "p2919"  # the last batch is kept
    again = _reporter(tmp_path, 4096, defaultdict(int))
    try:
        assert len(again.spool) == kept  # picked up after a restart
    finally:
        again.stop()
