"""REST API: auth matrix, partial ingest, body limits, jobs, queries, metrics, OpenAPI."""

from __future__ import annotations

import gzip
import json

import pytest
from openapi_spec_validator import validate

from tests.helpers import TOKENS, api_client, auth, make_config

T0 = 1_700_000_000 * 10**9


@pytest.fixture
def client(tmp_path):
    with api_client(make_config(tmp_path, api={"max_body_bytes": 200_000, "max_items_per_batch": 1000})) as c:
        yield c


SAMPLE = {"device": "leaf1", "port": "swp1", "ts": T0, "in_octets": 10, "oper_status": "up"}

# (method, path, body, required scope)
ENDPOINTS = [
    ("GET", "/version", None, "read"),
    ("GET", "/metrics", None, "read"),
    ("POST", "/ingest/port_samples", {"items": [SAMPLE]}, "ingest"),
    ("POST", "/telemetry/query", {"measurement": "port_counters", "start": 0, "end": T0 * 2}, "read"),
    ("GET", "/telemetry/latest?measurement=port_counters", None, "read"),
    ("POST", "/jobs", {"id": "j1", "hosts": ["h1"], "start": T0}, "ingest"),
    ("GET", "/jobs", None, "read"),
    ("GET", "/store", None, "read"),
    ("POST", "/store/quarantine/replay", None, "admin"),
]


@pytest.mark.parametrize("method,path,body,scope", ENDPOINTS)
def test_auth_matrix(client, method, path, body, scope):
    assert client.request(method, path, json=body).status_code == 401
    bad = client.request(method, path, json=body, headers={"Authorization": "Bearer not-a-valid-token-xxxxx"})
    assert bad.status_code == 401
    for other in TOKENS:
        r = client.request(method, path, json=body, headers=auth(other))
        if other in (scope, "admin"):
            assert r.status_code < 300, (other, r.text)
        else:
            assert r.status_code == 403, (other, r.text)
            assert scope in r.json()["detail"]


def test_health_needs_no_token_and_reveals_nothing(client):
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "store_ok": True}


def test_partial_batch_keeps_good_items(client):
    items = [SAMPLE,
             {**SAMPLE, "ts": "yesterday"},
             {**SAMPLE, "ts": T0 + 1, "in_octets": -5},
             {**SAMPLE, "ts": T0 + 2, "in_octets": 12},
             {"device": "leaf1"}]
    r = client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest"))
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 2
    assert [e["index"] for e in body["rejected"]] == [1, 2, 4]
    assert "ts" in body["rejected"][0]["errors"][0]
    assert "in_octets" in body["rejected"][1]["errors"][0]
    assert any("port" in e for e in body["rejected"][2]["errors"])
    q = client.post("/telemetry/query", json={"measurement": "port_counters", "start": T0, "end": T0 + 10,
                                              "fields": ["in_octets"]}, headers=auth("read")).json()
    assert q["series"][0]["values"] == [[T0, 10], [T0 + 2, 12]]


def test_counters_past_2_63_come_back_exact(client):
    items = [{**SAMPLE, "ts": T0 + i, "in_octets": v} for i, v in enumerate([2**64 - 1, 2**63, 12345])]
    assert client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest")).json()["accepted"] == 3
    q = client.post("/telemetry/query", headers=auth("read"), json={
        "measurement": "port_counters", "start": T0, "end": T0 + 10, "fields": ["in_octets"]})
    assert '"values":[[1700000000000000000,18446744073709551615],[1700000000000000001,9223372036854775808],' \
           '[1700000000000000002,12345]]' in q.text  # as text: no float on the way
    state = client.get("/store", headers=auth("read")).json()
    assert state["backend"] == "embedded" and state["quarantined"] == [] and state["health"]["ok"]


def test_store_level_rejection_is_reported_per_item(client):
    # Valid JSON for GenericPoint, but the tag value has a newline: the store rejects it.
    items = [{"measurement": "custom", "tags": {"k": "ok"}, "fields": {"v": 1.0}, "ts": T0},
             {"measurement": "custom", "tags": {"k": "bad\nvalue"}, "fields": {"v": 1.0}, "ts": T0}]
    body = client.post("/ingest/points", json={"items": items}, headers=auth("ingest")).json()
    assert body["accepted"] == 1
    assert body["rejected"][0]["index"] == 1 and "newline" in body["rejected"][0]["errors"][0]


def test_all_bad_batch_is_422(client):
    r = client.post("/ingest/port_samples", json={"items": [{"x": 1}, {"y": 2}]}, headers=auth("ingest"))
    assert r.status_code == 422
    assert r.json()["accepted"] == 0 and len(r.json()["rejected"]) == 2


@pytest.mark.parametrize("body,status", [
    (b"not json", 400),
    (b'{"items": 5}', 400),
    (b'[1, 2]', 400),
    (b'{"items": [], "extra": 1}', 400),
])
def test_malformed_envelopes(client, body, status):
    r = client.post(
        "/ingest/port_samples", content=body, headers={**auth("ingest"), "Content-Type": "application/json"}
    )
    assert r.status_code == status, r.text


def test_oversize_body_rejected(client):
    items = [{**SAMPLE, "ts": T0 + i} for i in range(3000)]  # ~300 kB > 200 kB limit
    r = client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest"))
    assert r.status_code == 413


def test_oversize_chunked_body_rejected(client):
    chunk = json.dumps({"items": [{**SAMPLE, "ts": T0 + i} for i in range(3000)]}).encode()

    def stream():  # no Content-Length: the limit must hold while streaming
        for i in range(0, len(chunk), 8192):
            yield chunk[i:i + 8192]

    r = client.post("/ingest/port_samples", content=stream(), headers=auth("ingest"))
    assert r.status_code == 413


def test_too_many_items_rejected(client):
    items = [{"measurement": "m", "fields": {"v": 1}, "ts": i} for i in range(1001)]
    r = client.post("/ingest/points", json={"items": items}, headers=auth("ingest"))
    assert r.status_code == 413 and "1000" in r.json()["detail"]


def test_gzip_body_accepted_and_bomb_rejected(client):
    items = [{**SAMPLE, "ts": T0 + i} for i in range(100)]
    body = gzip.compress(json.dumps({"items": items}).encode())
    r = client.post("/ingest/port_samples", content=body,
                    headers={**auth("ingest"), "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["accepted"] == 100
    bomb = gzip.compress(b'{"items": [' + b" " * 50_000_000 + b"]}")  # ~50 kB compressed, 50 MB inflated
    assert len(bomb) < 200_000
    r = client.post("/ingest/port_samples", content=bomb, headers={**auth("ingest"), "Content-Encoding": "gzip"})
    assert r.status_code == 413
    r = client.post("/ingest/port_samples", content=b"garbage", headers={**auth("ingest"), "Content-Encoding": "gzip"})
    assert r.status_code == 400


def test_jobs_crud(client):
    job = {"id": "train-1", "name": "llama", "hosts": ["h1", "h2"], "nics": ["h1:mlx5_0"],
           "ranks": [{"rank": 0, "host": "h1", "nic": "mlx5_0"}, {"rank": 1, "host": "h2"}],
           "start": "2026-01-01T00:00:00Z", "end": None}
    r = client.post("/jobs", json=job, headers=auth("ingest"))
    assert r.status_code == 201
    assert r.json()["start"] == 1767225600 * 10**9
    assert client.post("/jobs", json=job, headers=auth("ingest")).status_code == 200  # replaced
    other = {"id": "train-0", "hosts": ["h3"], "start": T0, "end": T0 + 10}
    client.post("/jobs", json=other, headers=auth("ingest"))
    assert [j["id"] for j in client.get("/jobs", headers=auth("read")).json()] == ["train-1", "train-0"]
    active = client.get("/jobs", params={"active_at": 1767225600 * 10**9 + 5}, headers=auth("read")).json()
    assert [j["id"] for j in active] == ["train-1"]
    assert [j["id"] for j in client.get("/jobs", params={"host": "h3"}, headers=auth("read")).json()] == ["train-0"]
    assert client.get("/jobs/train-1", headers=auth("read")).json()["ranks"][1] == {
        "rank": 1, "host": "h2", "nic": None, "comm_id": None, "peers": [], "qps": [], "net_devices": []}
    assert client.delete("/jobs/train-1", headers=auth("ingest")).status_code == 204
    assert client.get("/jobs/train-1", headers=auth("read")).status_code == 404
    assert client.delete("/jobs/train-1", headers=auth("ingest")).status_code == 404


@pytest.mark.parametrize("job,needle", [
    ({"id": "x", "hosts": ["h1"], "start": 10, "end": 5}, "end is before start"),
    ({"id": "x", "hosts": ["h1"], "nics": ["h2:eth0"], "start": 1}, "not listed"),
    ({"id": "x", "hosts": ["h1"], "ranks": [{"rank": 0, "host": "h9"}], "start": 1}, "not listed"),
    ({"id": "bad id!", "hosts": [], "start": 1}, "pattern"),
])
def test_invalid_jobs_rejected(client, job, needle):
    r = client.post("/jobs", json=job, headers=auth("ingest"))
    assert r.status_code == 422
    assert needle in r.text


def test_query_validation_and_latest(client):
    client.post("/ingest/port_samples", json={"items": [SAMPLE, {**SAMPLE, "ts": T0 + 5, "in_octets": 99}]},
                headers=auth("ingest"))
    r = client.post("/telemetry/query", json={"measurement": "port_counters", "start": 10, "end": 5},
                    headers=auth("read"))
    assert r.status_code == 422 and "end must be after start" in r.text
    r = client.get("/telemetry/latest", params={"measurement": "port_counters", "tag": "device=leaf1",
                                                "field": "in_octets"}, headers=auth("read"))
    assert r.json()["series"][0]["values"] == [[T0 + 5, 99]]
    r = client.get("/telemetry/latest", params={"measurement": "port_counters", "tag": "nonsense"},
                   headers=auth("read"))
    assert r.status_code == 422


def test_metrics_count_requests_ingest_and_auth_failures(client):
    client.post("/ingest/port_samples", json={"items": [SAMPLE, {"bad": 1}]}, headers=auth("ingest"))
    client.get("/version")
    text = client.get("/metrics", headers=auth("read")).text
    assert 'nms_ingest_items_total{kind="port_samples",result="accepted"} 1.0' in text
    assert 'nms_ingest_items_total{kind="port_samples",result="rejected"} 1.0' in text
    assert 'nms_auth_failures_total{reason="missing"} 1.0' in text
    assert 'nms_store_points_written{backend="embedded"} 1.0' in text
    assert 'nms_http_requests_total{method="POST",route="/ingest/port_samples",status="200"} 1.0' in text


def test_openapi_schema_is_valid_and_documents_ingest_bodies(client):
    spec = client.get("/openapi.json").json()
    validate(spec)
    body = spec["paths"]["/ingest/probe_windows"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    name = body["$ref"].rsplit("/", 1)[1]
    assert "items" in spec["components"]["schemas"][name]["properties"]
    assert "bearer" in json.dumps(spec["components"]["securitySchemes"]).lower()


def test_secrets_never_in_api_output(client):
    texts = [client.get(p, headers=auth("admin")).text for p in ("/version", "/metrics", "/openapi.json", "/jobs")]
    for token in TOKENS.values():
        assert all(token not in t for t in texts)
