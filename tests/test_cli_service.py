"""`nms serve` as a real process, driven by the `nms` CLI client; clean shutdown flushes the store."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from nms.app.local_daemons import free_port
from nms.store import Query
from nms.store.embedded import EmbeddedStore

TOKEN = "cli-test-token-0123456789abcdef"
READ_TOKEN = "cli-read-only-token-0123456789"


def start_server(tmp_path, tls: dict | None = None) -> dict:
    port = free_port()
    config = tmp_path / "nms.yaml"
    api = {"port": port, "tokens": [{"name": "admin", "scopes": ["admin"], "token": "${TEST_ADMIN_TOKEN}"},
                                    {"name": "viewer", "scopes": ["read"], "token": READ_TOKEN}]}
    if tls:
        api["tls"] = tls
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "api": api}))
    env = dict(os.environ, TEST_ADMIN_TOKEN=TOKEN)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(config)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=tls["cert"]) if tls else True
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health", timeout=0.5, verify=verify).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail((tmp_path / "server.log").read_text())
    return {"url": url, "proc": proc, "data": tmp_path / "data", "log": tmp_path / "server.log", "port": port}


@pytest.fixture
def server(tmp_path):
    srv = start_server(tmp_path)
    yield srv
    if srv["proc"].poll() is None:
        srv["proc"].kill()
        srv["proc"].wait()


def nms(*args: str, token: str | None = TOKEN, url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NMS_TOKEN", "NMS_URL")}
    env.update(NMS_URL=url, COLUMNS="200")
    if token:
        env["NMS_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "nms", *args], env=env, capture_output=True, text=True, timeout=60)


def test_cli_against_running_service(server, tmp_path):
    url = server["url"]
    now = time.time_ns()
    items = [{"device": "leaf1", "port": "swp1", "ts": now - i * 10**9, "interval_s": 1.0, "in_bps": float(i)}
             for i in range(5)]
    r = httpx.post(f"{url}/ingest/port_rates", json={"items": items}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json() == {"accepted": 5, "rejected": []}

    out = nms("query", "port_rates", "--start", "1m", "--field", "in_bps", "--json", url=url)
    assert out.returncode == 0, out.stderr
    [series] = json.loads(out.stdout)["series"]
    assert [row[1] for row in series["values"]] == [4.0, 3.0, 2.0, 1.0, 0.0]

    out = nms("query", "port_rates", "--latest", "--tag", "device=leaf1", url=url)
    assert out.returncode == 0 and "leaf1" in out.stdout and "0.0" in out.stdout

    out = nms("query", "port_rates", "--start", "1m", "--field", "in_bps", "--window", "1h", "--agg", "max",
              "--json", url=url)
    assert json.loads(out.stdout)["series"][0]["values"][0][1] == 4.0

    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps([{"id": f"job-{i}", "hosts": ["h1"], "start": now} for i in range(3)]))
    out = nms("jobs", "add", str(jobs_file), url=url)
    assert out.returncode == 0 and "3 job(s) stored" in out.stdout
    out = nms("jobs", "list", "--json", url=url)
    assert sorted(j["id"] for j in json.loads(out.stdout)) == ["job-0", "job-1", "job-2"]
    assert nms("jobs", "delete", "job-1", url=url).returncode == 0
    missing = nms("jobs", "delete", "job-1", url=url)
    assert missing.returncode == 1 and "404" in missing.stderr

    version = nms("version", "--url", url, url=url)
    assert version.returncode == 0 and "store embedded" in version.stdout

    store = nms("store", "status", url=url)
    assert store.returncode == 0 and "store embedded: ok" in store.stdout and "measurements" in store.stdout
    assert nms("store", "replay", token=READ_TOKEN, url=url).returncode == 1  # admin only


def test_cli_errors_are_clear_and_nonzero(server):
    url = server["url"]
    no_token = nms("jobs", "list", token=None, url=url)
    assert no_token.returncode == 1 and "401" in no_token.stderr and "NMS_TOKEN" in no_token.stderr
    read_only = nms("jobs", "delete", "x", token=READ_TOKEN, url=url)
    assert read_only.returncode == 1 and "403" in read_only.stderr
    unreachable = nms("jobs", "list", url=f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 2 and "cannot reach the service" in unreachable.stderr
    bad_tag = nms("query", "port_rates", "--tag", "nonsense", url=url)
    assert bad_tag.returncode == 2 and "key=value" in bad_tag.stderr


def test_sigterm_shuts_down_cleanly_and_keeps_data(server):
    url = server["url"]
    items = [{"measurement": "custom", "tags": {"k": "v"}, "fields": {"x": i}, "ts": 1000 + i} for i in range(100)]
    httpx.post(f"{url}/ingest/points", json={"items": items}, headers={"Authorization": f"Bearer {TOKEN}"})
    server["proc"].send_signal(signal.SIGTERM)
    server["proc"].wait(timeout=30)
    assert "service stopped; store flushed" in server["log"].read_text()
    store = EmbeddedStore(server["data"] / "telemetry.duckdb")
    [series] = store.query(Query(measurement="custom", start=0, end=10**6))
    assert len(series.values) == 100
    store.close()
    assert TOKEN not in server["log"].read_text()


def test_tls_when_a_certificate_is_configured(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    srv = start_server(tmp_path, tls={"cert": str(cert), "key": str(key)})
    try:
        r = httpx.get(
            f"{srv['url']}/version",
            verify=ssl.create_default_context(cafile=str(cert)),
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.status_code == 200 and r.json()["store_backend"] == "embedded"
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the TLS port
            httpx.get(f"http://127.0.0.1:{srv['port']}/health", timeout=2)
        with pytest.raises(httpx.HTTPError):  # and an unverified certificate is refused by clients
            httpx.get(f"{srv['url']}/health", timeout=2)
    finally:
        srv["proc"].kill()
        srv["proc"].wait()


def test_demo_main_job_runs_end_to_end():
    """The API-only demo (no root): its own checks (busiest port found, clean shutdown) set the exit code."""
    out = subprocess.run([sys.executable, "-m", "nms", "demo", "--api-only", "--minutes", "1"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "spine1 │ swp2 │ 95%" in out.stdout
    assert "service stopped cleanly, store flushed" in out.stdout
