"""The API on the InfluxDB backend: ingest and query end to end, and 503 (nothing kept) when
InfluxDB is down and the bounded backlog is full, so clients retry instead of losing data."""

from __future__ import annotations

import uuid

import httpx
import pytest
from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.cli import store as store_cli
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


def test_the_issue_through_the_api_counter_past_2_63_then_an_ordinary_one(influxd, tmp_path):
    """POST /ingest/port_samples with in_octets 2^64-1 among ordinary values, then 12345: both
    stored and read back exactly through /telemetry/query; /store shows an empty quarantine."""
    service = _service(tmp_path, influxd.url)
    with TestClient(create_app(service)) as client:
        first = [{"device": "leaf1", "port": "swp1", "ts": T0 + i, "in_octets": v}
                 for i, v in enumerate([18446744073709551615, 5, 2**63])]
        r = client.post("/ingest/port_samples", json={"items": first}, headers=auth("ingest"))
        assert r.json() == {"accepted": 3, "rejected": []}
        r = client.post("/ingest/port_samples", headers=auth("ingest"),
                        json={"items": [{"device": "leaf1", "port": "swp1", "ts": T0 + 10, "in_octets": 12345}]})
        assert r.json() == {"accepted": 1, "rejected": []}
        assert service.store.flush(timeout=10)
        q = client.post("/telemetry/query", headers=auth("read"), json={
            "measurement": "port_counters", "start": T0, "end": T0 + 20, "fields": ["in_octets"]})
        # Compared as text: a JSON number past 2^53 must not have gone through a float anywhere.
        assert '"values":[[1700000000000000000,18446744073709551615],[1700000000000000001,5],' \
               '[1700000000000000002,9223372036854775808],[1700000000000000010,12345]]' in q.text
        state = client.get("/store", headers=auth("read")).json()
        assert state["backend"] == "influxdb" and state["quarantined"] == []
        assert state["health"]["quarantine"]["points"] == 0 and state["stats"]["points_written"] == 4
        assert client.post("/store/quarantine/replay", headers=auth("read")).status_code == 403
        assert client.post("/store/quarantine/replay", headers=auth("admin")).json() == {"replayed": 0}


def test_points_influxdb_refuses_are_quarantined_and_shown(influxd, tmp_path):
    """A field another writer made a float in this shard: the service's points of it are quarantined
    (the rest land), /store and /metrics and `nms store status` show them, replay sends them again."""
    service = _service(tmp_path, influxd.url)
    db = service.store.cfg.database
    with TestClient(create_app(service)) as client:
        influxd.query(f'CREATE DATABASE "{db}"', db=db)
        r = httpx.post(f"{influxd.url}/write", params={"db": db},
                       content=f"port_counters,device=old,port=p in_octets=1.5 {T0 - 1}".encode())
        assert r.status_code == 204
        items = [{"device": "leaf1", "port": "swp1", "ts": T0 + i, "in_octets": i, "out_octets": i} for i in range(4)]
        items += [{"device": "leaf1", "port": "swp2", "ts": T0 + i, "out_octets": i} for i in range(4)]
        assert (
            client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest")).json()["accepted"] == 8
        )
        assert service.store.flush(timeout=10)
        state = client.get("/store", params={"limit": 2}, headers=auth("read")).json()
        assert state["stats"]["quarantine_points"] == 4 and state["stats"]["points_written"] == 4
        assert len(state["quarantined"]) == 2
        assert "field 'in_octets' of measurement 'port_counters' is integer but InfluxDB stores it as float" \
            in state["quarantined"][0]["reason"]
        metrics = client.get("/metrics", headers=auth("read")).text
        assert 'nms_store_quarantine_points{backend="influxdb"} 4.0' in metrics
        with store_cli.console.capture() as shown:
            store_cli._print(state)
        assert "quarantine: 4 points" in shown.get() and "nms store replay" in shown.get()

        # Still refused: the points come back to the quarantine, none is lost.
        assert client.post("/store/quarantine/replay", headers=auth("admin")).json() == {"replayed": 4}
        assert service.store.drain(10)
        assert client.get("/store", headers=auth("read")).json()["stats"]["quarantine_points"] == 4
