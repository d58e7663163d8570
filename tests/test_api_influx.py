"""The API on the InfluxDB backend: ingest and query end to end, and 503 (nothing kept) when
InfluxDB is down and the bounded backlog is full, so clients retry instead of losing data."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.service import Service
from tests.helpers import auth, make_config

pytestmark = pytest.mark.influx
T0 = 1_700_000_000 * 10**9


def _service(tmp_path, url: str, **influx) -> Service:
    store = {"backend": "influxdb",
             "influxdb": {"url": url, "database": f"api_{uuid.uuid4().hex[:10]}", "flush_interval": "0.05s",
                          "timeout": "1s", **influx}}
    return Service(make_config(tmp_path, store=store))


def test_ingest_and_query_through_influxdb(influxd, tmp_path):
    service = _service(tmp_path, influxd.url)
    with TestClient(create_app(service)) as client:
        items = [{"device": "spine1", "port": f"swp{p}", "ts": T0 + i * 10**9, "interval_s": 1.0,
                  "in_bps": float(i * p)} for p in (1, 2) for i in range(5)]
        items.append({"device": "spine1", "port": "swp1", "ts": T0, "interval_s": -1.0})
        r = client.post("/ingest/port_rates", json={"items": items}, headers=auth("ingest"))
        assert r.json()["accepted"] == 10 and r.json()["rejected"][0]["index"] == 10
        assert service.store.flush(timeout=10)
        q = client.post("/telemetry/query", headers=auth("read"), json={
            "measurement": "port_rates", "start": T0, "end": T0 + 10 * 10**9, "fields": ["in_bps"],
            "window_ns": 10 * 10**9, "agg": "max", "tags": {"port": ["swp2"]}}).json()
        assert q["series"] == [{"measurement": "port_rates", "tags": {"device": "spine1", "port": "swp2"},
                                "columns": ["time", "in_bps"], "values": [[T0, 8.0]]}]
        health = client.get("/health").json()
        assert health == {"status": "ok", "store_ok": True}
        metrics = client.get("/metrics", headers=auth("read")).text
        assert 'nms_store_points_written{backend="influxdb"} 10.0' in metrics


def test_influxdb_down_and_backlog_full_gives_503(influxd, tmp_path):
    # Nothing listens on this port: writes spool until the 20 kB backlog is full.
    dead = f"http://127.0.0.1:{_closed_port()}"
    service = _service(tmp_path, dead, spool_max_bytes=20_000)
    with TestClient(create_app(service)) as client:
        statuses = []
        for batch in range(20):
            items = [{"device": "leaf1", "port": "swp1", "ts": T0 + batch * 1000 + i, "in_octets": i}
                     for i in range(50)]
            statuses.append(client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest")))
        codes = [r.status_code for r in statuses]
        assert codes[0] == 200 and codes[-1] == 503, codes
        assert statuses[-1].headers["Retry-After"] == "5"
        assert client.get("/health").status_code == 503
        metrics = client.get("/metrics", headers=auth("read")).text
        assert "nms_store_spool_bytes" in metrics


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
