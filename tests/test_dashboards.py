"""The shipped Chronograf dashboards against a real influxd holding data the service wrote, the
downsampling retention policies and continuous queries, and the schema documentation.

No Chronograf runs here: queries are rendered the way Chronograf renders template variables
(influx/templates.go) and sent to influxd's /query."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from _influx import INFLUXD, InfluxServer
from _snmpd import Snmpd
from _snmpd import available as snmpd_available
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from nms.app.api import create_app
from nms.app.cli import app as cli_app
from nms.app.dashboards import catalog, schema
from nms.app.polling import Poller
from nms.app.service import Service
from nms.records import Finding
from nms.store.influx_downsampling import continuous_queries
from tests.helpers import auth, make_config

REPO = Path(__file__).resolve().parents[1]
S = 10**9
TIERS = [{"retention_policy": "t1s", "every": "1s", "duration": "1h", "resample_for": "15s"},
         {"retention_policy": "t2s", "every": "2s", "duration": "2h", "resample_for": "20s"}]
HOSTS = ("h1", "h2")
JOB = "job-7"


def test_schema_doc_is_the_commands_output():
    result = CliRunner().invoke(cli_app, ["dashboards", "schema"])
    assert result.exit_code == 0
    assert (REPO / "docs/schema.md").read_text() == result.stdout, "regenerate: nms dashboards schema > docs/schema.md"
    doc = json.loads(CliRunner().invoke(cli_app, ["dashboards", "schema", "--format", "json"]).stdout)
    rates = next(m for m in doc if m["name"] == "port_rates")
    assert rates["tags"] == ["device", "port"] and rates["fields"]["in_utilization"] == "float"
    assert next(m for m in doc if m["name"] == "port_counters")["fields"]["in_octets"] == "unsigned"


@pytest.mark.parametrize("name", catalog.names())
def test_dashboard_is_well_formed_for_chronograf(name):
    assert catalog.check(catalog.load(name), schema.by_name()) == []


def test_check_finds_what_would_break():
    doc = catalog.load("link_detail")
    cells = doc["dashboard"]["cells"]
    cells[1]["x"], cells[1]["w"] = 4, 9  # past the grid and over cell 0
    cells[2]["queries"][0]["query"] = cells[2]["queries"][0]["query"].replace('max("in_errors_ps")', 'max("in_errorz")')
    cells[3]["queries"][0]["query"] += " AND :nope:"
    problems = "\n".join(catalog.check(doc, schema.by_name()))
    assert "outside the 12-column grid" in problems and "overlaps" in problems
    assert "'in_errorz' is neither a tag nor a field of port_rates" in problems
    assert "variable :nope: is not defined" in problems


def test_export_fills_names_and_choices(tmp_path):
    config = tmp_path / "nms.yaml"
    config.write_text(f"data_dir: {tmp_path}\nstore:\n  backend: influxdb\n  influxdb:\n    database: fab\n"
                      f"    downsampling:\n      enabled: true\n")
    result = CliRunner().invoke(cli_app, ["dashboards", "export", "job", "--dir", str(tmp_path / "out"),
                                          "--config", str(config), "--hosts", "h1,h.2", "--job", "j/1"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out/nms-job.json").read_text())
    text = json.dumps(doc)
    assert "__NMS_" not in text and '\\"fab\\".:rp:.\\"probe_window\\"' in text
    values = {t["tempVar"]: [v["value"] for v in t["values"]] for t in doc["dashboard"]["templates"]}
    assert values == {":rp:": ['"autogen"', '"nms_1m"', '"nms_1h"'], ":job_hosts:": ["/^(h1|h\\.2)$/"],
                      ":job:": ["j\\/1"]}
    bad = CliRunner().invoke(cli_app, ["dashboards", "export", "nope", "--dir", str(tmp_path)])
    assert bad.exit_code == 1 and "no dashboard named 'nope'" in bad.output


# --- the pipeline: a real influxd with continuous queries running, the service writing into it ----


@pytest.fixture(scope="module")
def influxd_cq():
    if not INFLUXD.exists():
        pytest.skip("influxd not installed")
    server = InfluxServer()
    server.config.write_text(server._config_text().replace(
        "[continuous_queries]\n  enabled = false", '[continuous_queries]\n  enabled = true\n  run-interval = "1s"'))
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def veth():
    """A veth pair in the root namespace: a port with a speed whose state the test can change."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a veth pair whose link state changes)")
    a, b = f"nmsd{uuid.uuid4().hex[:6]}", None
    b = a + "p"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        subprocess.run(["ip", "link", "set", a, "up"], check=True)
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


def _ingest(client, kind, items):
    r = client.post(f"/ingest/{kind}", json={"items": items}, headers=auth("ingest"))
    assert r.status_code == 200 and r.json()["accepted"] == len(items), r.text


def _poll_snmp(service: Service, peer: str) -> None:
    """The poller (the service's code, on its config and store) polls snmpd twice with the veth
    down then up in between: counters, rates, facts, addresses and a link event."""
    async def run():
        poller = Poller(service.config, service.store, registry=None)
        try:
            for i in range(2):  # both polls must give samples, or there is no rate to downsample
                if i:
                    subprocess.run(["ip", "link", "set", peer, "up"], check=True)
                    await asyncio.sleep(3.5)  # snmpd's interface cache
                devices = await poller.poll_all()
                assert all(d.state == "ok" and d.consecutive_failures == 0 for d in devices), (i, devices)
        finally:
            await poller.close()
    asyncio.run(run())


def _agent_data(client, now: int) -> None:
    """What host agents send (POST /ingest/<kind>): edges first, so the windows get corrected."""
    slot = (now - 8 * S) // (2 * S) * (2 * S)  # solvable now (window_s 2 s + solve_lag 4 s), within resample_for
    _ingest(client, "clock_edges", [
        {"host_a": a, "host_b": b, "method": "svm", "window_start": slot, "window_s": 2.0,
         "offset_ns": sign * 1500.0, "drift_ppb": 10.0, "bound_ns": 40.0, "pure_pairs": 12}
        for a, b, sign in (("h1", "h2", 1), ("h2", "h1", -1))])
    for i in (2, 1):
        ts = now - i * 5 * S
        _ingest(client, "host_nic_samples", [
            {"host": h, "nic": "eth0", "ts": ts, "rx_bytes": 1000 * (3 - i), "tx_bytes": 900 * (3 - i),
             "rx_errors": 3 - i, "rx_dropped": 5 * (3 - i), "tx_dropped": 3 - i, "pause_rx": 7 * (3 - i),
             "ecn_marked": 2 * (3 - i), "cnp_sent": 3 - i, "oper_status": "up"} for h in HOSTS])
        _ingest(client, "points", [{"measurement": "agent_stats", "tags": {"host": h}, "ts": ts,
                                    "fields": {"paths": 4, "paths_up": 4 - i + 1, "paths_down": i - 1}} for h in HOSTS])
    _ingest(client, "probe_windows", [
        {"src_host": a, "src_nic": "eth0", "dst_host": b, "dst_nic": "eth0", "path_id": "p1",
         "window_start": now - k * S, "sent": 100, "received": 100 - k, "owd_fwd_min_ns": 9000 + k,
         "owd_fwd_p50_ns": 11000, "owd_fwd_p99_ns": 19000, "owd_rev_min_ns": 9100, "owd_rev_p50_ns": 11100,
         "owd_rev_p99_ns": 19100, "rtt_min_ns": 18000, "rtt_p50_ns": 22000, "rtt_p99_ns": 38000 + k}
        for a, b in (("h1", "h2"), ("h2", "h1")) for k in range(1, 6)])
    _ingest(client, "queue_rates", [  # what a gNMI (openconfig-qos) or CLI (tc) poll derives
        {"device": "leaf-d1", "port": "swp1", "queue": "0", "ts": now - k * S, "interval_s": 1.0,
         "transmit_bps": 9.5e7, "transmit_pps": 8000.0, "dropped_pps": 70.0 + k, "ecn_marked_pps": 3.0}
        for k in range(1, 6)])
    _ingest(client, "path_events", [{"src_host": "h1", "src_nic": "eth0", "dst_host": "h2", "dst_nic": "eth0",
                                     "path_id": "p1", "ts": now - 3 * S, "state": "down", "reason": "no replies",
                                     "sport": 40001}])


def _incident(service: Service, device: str, port: str, now: int) -> None:
    """The incident manager (fed by the correlator in production) opens and resolves one incident."""
    finding = Finding(kind="link_down", element=f"{device}:{port}--spine9:swp1", element_kind="link", ts=now - 4 * S,
                      confidence=0.9, severity="critical", summary=f"{device}:{port} is down", jobs=[JOB])
    assert [e.event for e in service.incidents.apply([finding], now - 4 * S)] == ["opened"]
    assert [e.event for e in service.incidents.apply([], now - 2 * S)] == ["resolved"]


def _rows(server: InfluxServer, db: str, query: str) -> list[dict]:
    out = server.query(query, db, method="GET")
    result = out["results"][0]
    assert "error" not in result, f"{query}\n-> {result['error']}"
    return result.get("series", [])


@pytest.fixture(scope="module")
def pipeline(influxd_cq, veth, tmp_path_factory):
    if not snmpd_available():
        pytest.skip("snmpd not installed")
    port, peer = veth
    snmpd = Snmpd()
    snmpd.start()
    tmp = tmp_path_factory.mktemp("dash")
    db = f"dash_{uuid.uuid4().hex[:8]}"
    config = make_config(
        # unchanged_hold 0: two polls 3.5 s apart give a rate even when snmpd has not refreshed in between;
        # polling is driven by the fixture, so the interval only sets the poll's deadline (0.8 x): a
        # first poll slowed by a busy machine must not cost the second sample
        tmp, polling={"enabled": False, "unchanged_hold": 0}, correlator={"enabled": False},
        # no audits: with no correlator their incident feed runs every second and would resolve the
        # test's incident (one clean window) before the test's own clean window does
        audits={"enabled": False}, thresholds={"resolve_after_clean_windows": 1},
        store={"backend": "influxdb", "influxdb": {"url": influxd_cq.url, "database": db, "flush_interval": "0.05s",
                                                   "timeout": "2s", "downsampling": {"enabled": True, "tiers": TIERS}}},
        fabric={"switches": [{"name": "leaf-d1", "mgmt_address": "127.0.0.1",
                              "collectors": {"snmp": snmpd.settings(interfaces=["lo", port], interval=10.0)}}]})
    service = Service(config)
    try:
        with TestClient(create_app(service)) as client:
            _poll_snmp(service, peer)
            now = time.time_ns()
            _agent_data(client, now)
            service.clock.solve_due()
            _agent_data(client, now)  # again: windows after the solve carry *_corr_ns
            _incident(service, "leaf-d1", port, now)
            assert service.store.flush(timeout=10)
            health = client.get("/store", headers=auth("read")).json()
            deadline = time.monotonic() + 30  # the continuous queries run every second
            while time.monotonic() < deadline and not all(
                    _rows(influxd_cq, db, f'SELECT count(*) FROM "{db}"."{t}"."{m}"')
                    for t in ("t1s", "t2s") for m in ("port_rates", "probe_window", "clock_solution", "queue_rates")):
                time.sleep(1)
            yield {"db": db, "port": port, "server": influxd_cq, "service": service, "health": health}
    finally:
        snmpd.stop()


def test_downsampling_created_at_start_and_filled_by_the_continuous_queries(pipeline):
    server, db = pipeline["server"], pipeline["db"]
    policies = {row[0]: row[1] for row in _rows(server, db, f'SHOW RETENTION POLICIES ON "{db}"')[0]["values"]}
    assert policies["t1s"] == "1h0m0s" and policies["t2s"] == "2h0m0s"
    cq_names = {row[0] for s in _rows(server, db, "SHOW CONTINUOUS QUERIES") if s["name"] == db for row in s["values"]}
    assert cq_names == {cq.name for cq in continuous_queries(pipeline["service"].config.store.influxdb)}
    assert len(cq_names) == 8  # 4 measurements x 2 tiers
    downsampling = pipeline["health"]["health"]["downsampling"]
    assert downsampling["error"] is None and len(downsampling["created"]) == 10
    # 1 s means of the raw rates, and the 2 s tier computed from the 1 s one: same totals of probes
    for tier in ("t1s", "t2s"):
        for m in ("port_rates", "probe_window", "clock_solution", "queue_rates"):
            assert _rows(server, db, f'SELECT count(*) FROM "{db}"."{tier}"."{m}"'), (tier, m)
    sent = [_rows(server, db, f'SELECT sum("sent") FROM "{db}"."{rp}"."probe_window"')[0]["values"][0][1]
            for rp in ("autogen", "t1s", "t2s")]
    assert sent[0] == sent[1] == sent[2] == 2 * 5 * 100  # 2 pairs x 5 windows (sent twice: same points)


def test_reconcile_is_idempotent_and_replaces_changed_definitions(pipeline, tmp_path):
    base = pipeline["service"].config.store.influxdb.model_dump(mode="json")
    base["password"] = base["token"] = None

    def start_with(tiers):
        cfg = dict(base, downsampling={"enabled": True, "tiers": tiers}, spool_dir=str(tmp_path / uuid.uuid4().hex))
        service = Service(make_config(tmp_path, store={"backend": "influxdb", "influxdb": cfg}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and service.store.health().get("downsampling") is None:
            time.sleep(0.05)
        health = service.store.health()["downsampling"]
        service.store.close()
        return health

    again = start_with(TIERS)
    assert again["created"] == again["altered"] == again["dropped"] == [] and again["error"] is None
    changed = start_with([dict(TIERS[0], duration="3h", resample_for="16s"), TIERS[1]])
    assert changed["altered"] == ["retention policy t1s: duration 1h -> 3h"]
    assert len(changed["dropped"]) == len([c for c in changed["created"] if "t1s" in c]) == 4  # 4 measurements
    restored = start_with(TIERS)
    assert restored["altered"] == ["retention policy t1s: duration 3h -> 1h"] and len(restored["created"]) == 4


def _template_values(pipeline, doc: dict, rp: str) -> dict[str, tuple[str, str]]:
    """Each variable's value as Chronograf would pick it; tagValues from their SHOW TAG VALUES."""
    server, db = pipeline["server"], pipeline["db"]
    values = {":dashboardTime:": ("constant", "now() - 15m"), ":upperDashboardTime:": ("constant", "now()"),
              ":interval:": ("constant", "1s"), ":rp:": ("csv", f'"{rp}"')}
    wanted = {":device:": "leaf-d1", ":port:": pipeline["port"]}
    for t in doc["dashboard"]["templates"]:
        if t["type"] == "tagValues":
            q = t["query"]
            show = catalog.render(q["influxql"], {":database:": ("database", q["db"]),
                                                  ":measurement:": ("measurement", q["measurement"]),
                                                  ":tagKey:": ("tagKey", q["tagKey"])})
            found = [row[1] for s in _rows(server, db, show) for row in s["values"]]
            assert wanted[t["tempVar"]] in found, (t["tempVar"], found)
            values[t["tempVar"]] = ("tagValue", wanted[t["tempVar"]])
        elif t["type"] == "csv" and t["tempVar"] != ":rp:":
            values[t["tempVar"]] = ("csv", next(v["value"] for v in t["values"] if v["selected"]))
    return values


@pytest.mark.parametrize("name", catalog.names())
def test_every_query_returns_rows_from_what_the_service_wrote(pipeline, name):
    db = pipeline["db"]
    tiers = [t["retention_policy"] for t in TIERS]
    doc = catalog.export(name, database=db, tiers=tiers, job_hosts=list(HOSTS), job=JOB)
    choices = [v["value"].strip('"') for t in doc["dashboard"]["templates"] if t["tempVar"] == ":rp:"
               for v in t["values"]] or ["autogen"]
    assert choices == ["autogen", *tiers] or choices == ["autogen"]
    for rp in choices:
        values = _template_values(pipeline, doc, rp)
        for cell, query in catalog.queries(doc):
            if rp != "autogen" and ":rp:" not in query:
                continue  # this query reads raw data only: already run
            text = catalog.render(query, values)
            assert ":" + "rp:" not in text and "__NMS_" not in text
            series = _rows(pipeline["server"], db, text)
            assert series, f"{name} / {cell} / {rp}: no rows for\n{text}"
            aliases = catalog._ALIAS.findall(query.split(" FROM ")[0])
            for s in series:
                assert s["columns"][0] == "time" and set(aliases) <= set(s["columns"]), (cell, s["columns"])
                assert any(v is not None for row in s["values"] for v in row[1:]), (cell, rp, s)
