"""A real influxd (Debian's influxdb 1.6.x) for tests, plus pytest fixtures.

`InfluxServer` (nms/app/local_daemons.py, also `nms cluster`'s) runs influxd on free loopback ports with
everything in its own temporary directory; restart() keeps the port and the data.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from nms.app.local_daemons import InfluxServer, free_port

__all__ = ["INFLUXD", "SKIP_REASON", "InfluxServer", "free_port"]

INFLUXD = Path("/usr/bin/influxd")
SKIP_REASON = "influxd not installed: apt-get install influxdb"


def _have_influxd() -> bool:
    return INFLUXD.exists() and os.access(INFLUXD, os.X_OK)


@pytest.fixture(scope="session")
def influxd():
    if not _have_influxd():
        pytest.skip(SKIP_REASON)
    server = InfluxServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def influx_store(influxd, tmp_path):
    from nms.config.models import InfluxStoreConfig
    from nms.store.influx import InfluxStore

    cfg = InfluxStoreConfig(url=influxd.url, database=f"t_{uuid.uuid4().hex[:12]}",
                            flush_interval=0.05, timeout=1.0)
    store = InfluxStore(cfg, tmp_path)
    try:
        yield store
    finally:
        store.close()
