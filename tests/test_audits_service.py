"""The audit runner on a real Service: /audits API and its auth, report history and formats, probe
windows read back from the store, escalation into incidents (open, kept across runs and restarts,
resolved when a run no longer finds it), the config's errors, and `nms audit` against a real server."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from test_audits_checks import T0, clean_snapshot
from test_topology import fabric
from typer.testing import CliRunner

from correlator.incidents import IncidentManager
from nms.app.api import create_app
from nms.app.audits.escalation import IncidentFeed, can_escalate, to_finding
from nms.app.audits.history import AuditHistory
from nms.app.audits.model import AuditFinding
from nms.app.audits.runner import AuditRunner
from nms.app.audits.snapshot import host_nic_settings
from nms.app.cli import app as cli
from nms.app.service import Service
from nms.config import ConfigError, parse_config
from nms.config.models import AuditsConfig
from nms.state import StateStore
from tests.helpers import TOKENS, api_client, auth, make_config, serve_in_thread

W = 10**9
ALL = ["cabling", "mtu", "speed", "errors", "ecmp_balance", "clock", "config_drift", "probe_coverage"]


def config(tmp_path, **audits):
    return make_config(tmp_path, fabric=fabric(hosts_per_leaf=2).model_dump(mode="json"), polling={"enabled": False},
                       audits={"start_delay": 3600, **audits})


@pytest.fixture
def client(tmp_path):
    with api_client(config(tmp_path)) as c:
        yield c


def test_run_without_data_reports_not_enough_data_and_no_finding(client):
    assert client.post("/audits/run", headers=auth("read")).status_code == 403
    assert client.post("/audits/run").status_code == 401
    r = client.post("/audits/run", headers=auth("act"))
    assert r.status_code == 200, r.text
    report = r.json()
    assert [x["audit"] for x in report["results"]] == ALL
    assert {x["audit"]: x["status"] for x in report["results"]} == dict.fromkeys(ALL, "no_data")
    assert all(x["reason"] and x["findings"] == [] for x in report["results"])
    assert report["trigger"] == "manual" and report["id"] == 1
    # clock sync is on but no agent sent edges; the store has no probe window
    reasons = {x["audit"]: x["reason"] for x in report["results"]}
    assert "no host agent" in reasons["clock"] and "no host agent" in reasons["probe_coverage"]


def test_list_history_formats_and_errors(client):
    one = client.post("/audits/run", headers=auth("admin"), json={"name": "mtu"}).json()
    two = client.post("/audits/run", headers=auth("act"), json={}).json()
    audits = client.get("/audits", headers=auth("read")).json()
    assert [a["name"] for a in audits] == ALL
    by = {a["name"]: a for a in audits}
    assert by["mtu"]["last_report_id"] == two["id"] and by["mtu"]["last"]["status"] == "no_data"
    assert by["errors"]["settings"]["ber_threshold"] == 1e-12 and by["errors"]["schedule"] == "every 3600 s"
    assert by["mtu"]["open_incidents"] == "major"
    history = client.get("/audits/reports", headers=auth("read")).json()
    assert [h["id"] for h in history] == [two["id"], one["id"]] and history[1]["audits"] == {"mtu": "no_data"}
    only = client.get("/audits/reports", params={"audit": "clock"}, headers=auth("read")).json()
    assert [h["id"] for h in only] == [two["id"]]
    md = client.get(f"/audits/reports/{one['id']}", params={"format": "md"}, headers=auth("read"))
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.text.startswith(f"# Fabric audit report {one['id']}") and "| mtu | not enough data:" in md.text
    html = client.get(f"/audits/reports/{one['id']}", params={"format": "html"}, headers=auth("read"))
    assert html.headers["content-type"].startswith("text/html") and "<td>mtu</td>" in html.text
    assert client.get(f"/audits/reports/{one['id']}", headers=auth("read")).json() == one
    assert client.get("/audits/reports/999", headers=auth("read")).status_code == 404
    assert client.get("/audits/reports/1", params={"format": "pdf"}, headers=auth("read")).status_code == 422
    assert client.post("/audits/run", headers=auth("act"), json={"name": "gremlins"}).status_code == 404
    assert client.post("/audits/run", headers=auth("act"), json={"nme": "mtu"}).status_code == 422
    assert client.get("/audits", headers=auth("ingest")).status_code == 403


def test_probe_windows_from_the_store_give_coverage(client):
    windows = [{"src_host": "host1", "src_nic": "eth0", "dst_host": "host3", "dst_nic": "eth0", "path_id": pid,
                "window_start": time.time_ns() - 5 * W, "sent": 10, "received": 10} for pid in ("pa", "pb")]
    assert client.post("/ingest/probe_windows", headers=auth("ingest"), json={"items": windows}).status_code == 200
    client.app.state.service.store.flush()
    report = client.post("/audits/run", headers=auth("act"), json={"name": "probe_coverage"}).json()
    [res] = report["results"]
    # host1 and host3 probe each other (their two ECMP paths are unknown: no topology), host2/host4 nothing
    assert res["status"] == "findings"
    assert sorted((f["element"], f["severity"]) for f in res["findings"]) == [("host2", "minor"), ("host4", "minor")]
    assert res["notes"] == ["topology unknown: ECMP path counts not compared"]


def test_host_nic_mtu_and_speed_read_back_from_the_store(client):
    now = time.time_ns()
    nics = [{"host": "host1", "nic": "eth0", "ts": now - W, "mtu": 9000, "speed_bps": 10**11},
            {"host": "host2", "nic": "eth0", "ts": now - 3600 * W, "mtu": 1500},  # stale: not used
            {"host": "host3", "nic": "eth0", "ts": now - W, "rx_bytes": 5}]  # an agent that says nothing of MTU
    assert client.post("/ingest/host_nic_samples", headers=auth("ingest"), json={"items": nics}).status_code == 200
    store = client.app.state.service.store
    store.flush()
    assert host_nic_settings(store, now, 60) == {("host1", "eth0"): {"mtu": 9000, "speed_bps": 10**11}}


def mtu_fault_snapshot(now_ns: int):
    snap = clean_snapshot()
    snap.now_ns = now_ns
    snap.samples[("spine2", "swp1")] = snap.samples[("spine2", "swp1")].model_copy(update={"mtu": 1500})
    snap.samples[("spine1", "swp2")] = snap.samples[("spine1", "swp2")].model_copy(update={"speed_bps": 10**9})
    return snap


def test_findings_open_incidents_until_a_run_no_longer_finds_them(tmp_path):
    state = StateStore(tmp_path / "state.sqlite")
    incidents = IncidentManager(state, resolve_after=2)
    history = AuditHistory(state.database)
    runner = AuditRunner(AuditsConfig(), history)
    feed = IncidentFeed(incidents, runner.standing)
    report = runner.run(mtu_fault_snapshot(T0), ["mtu", "speed"])
    assert [len(r.findings) for r in report.results] == [1, 1]
    events = feed.apply([], T0)  # the correlator's window (here: nothing of its own)
    assert sorted((e.event, e.incident.kind, e.incident.element) for e in events) == [
        ("opened", "mtu_mismatch", "leaf1:swp3--spine2:swp1"), ("opened", "speed_mismatch", "leaf2:swp2--spine1:swp2")]
    mtu = next(e.incident for e in events if e.incident.kind == "mtu_mismatch")
    assert mtu.evidence["audit"] == "mtu" and "Set both ends" in mtu.evidence["remediation"]
    assert feed.apply([], T0 + 5 * W) == []  # standing: stays open across windows
    # a restart: the standing findings come back from the history, the incident stays open
    runner = AuditRunner(AuditsConfig(), history)
    feed = IncidentFeed(IncidentManager(state, resolve_after=2), runner.standing)
    assert feed.apply([], T0 + 6 * W) == [] and len(feed.open_incidents()) == 2
    runner.run(clean_snapshot(), ["mtu"])  # fixed (the speed mismatch is not)
    assert feed.apply([], T0 + 7 * W) == []  # one clean window
    [resolved] = feed.apply([], T0 + 8 * W)
    assert resolved.event == "resolved" and resolved.incident.kind == "mtu_mismatch"
    assert [i.kind for i in feed.open_incidents()] == ["speed_mismatch"]
    state.close()


@pytest.mark.parametrize("audit,element,element_kind,kind", [
    ("clock", "host3", "host", "clock_unsynced"),
    ("probe_coverage", "host1<>host4", "host_pair", "probe_gap"),
    ("config_drift", "leaf", "role", "config_drift"),
    ("speed", "leaf1:swp1--spine1:swp1", "link", "speed_mismatch"),
])
def test_every_audit_has_an_incident_kind_on_its_own_element_kind(tmp_path, audit, element, element_kind, kind):
    state = StateStore(tmp_path / "state.sqlite")
    incidents = IncidentManager(state, resolve_after=1)
    f = AuditFinding(audit=audit, severity="major", element=element, element_kind=element_kind, message="m",
                     remediation="r", evidence={"x": 1})
    assert can_escalate(f)
    [opened] = incidents.apply([to_finding(f, T0)], T0)
    assert (opened.incident.kind, opened.incident.element_kind, opened.incident.dedup_key) == (
        kind, element_kind, f"{element_kind}:{element}")
    # persisted and read back with its kinds (a restart)
    [again] = IncidentManager(state, resolve_after=1).open_incidents()
    assert (again.kind, again.element_kind) == (kind, element_kind)
    state.close()


def test_no_data_keeps_standing_findings_and_levels_filter(tmp_path):
    state = StateStore(tmp_path / "state.sqlite")
    history = AuditHistory(state.database)
    runner = AuditRunner(AuditsConfig(mtu={"open_incidents": "never"}, errors={"open_incidents": "critical"}), history)
    snap = mtu_fault_snapshot(T0)
    snap.rates[("spine1", "swp1")] = snap.rates[("spine1", "swp1")].model_copy(update={"in_errors_ps": 10.0})
    report = runner.run(snap, ["mtu", "errors"])
    assert [r.status for r in report.results] == ["findings", "findings"]
    assert runner.standing(T0) == []  # mtu never, errors (major) below critical
    runner = AuditRunner(AuditsConfig(), history)
    assert sorted(f.kind for f in runner.standing(T0)) == ["corrupting_link", "mtu_mismatch"]
    snap.samples, snap.rates = {}, {}
    runner.run(snap, ["mtu", "errors"])  # no data: unknown is not fixed
    assert sorted(f.kind for f in runner.standing(T0)) == ["corrupting_link", "mtu_mismatch"]
    state.close()


def test_probe_loss_is_reported_but_left_to_the_correlators_own_incident(tmp_path):
    """A fault's first window can look like silent loss (the probes see it before the counters do);
    a run at that moment must not hold a corrupting_link incident open until the next run (an hour)."""
    state = StateStore(tmp_path / "state.sqlite")
    history = AuditHistory(state.database)
    runner = AuditRunner(AuditsConfig(), history)
    feed = IncidentFeed(IncidentManager(state, resolve_after=2), runner.standing)
    link = "leaf1:swp2--spine1:swp1"
    live = to_finding(AuditFinding(audit="errors", severity="major", element=link, element_kind="link",
                                   message="m", remediation="r"), T0)  # stands in for the correlator's finding
    [opened] = feed.apply([live], T0)
    snap = clean_snapshot()
    snap.lossy_links = {link: {"loss_pct": 25.0, "sent": 800, "lost": 200}}
    report = runner.run(snap, ["errors"])
    [finding] = report.results[0].findings
    assert finding.element == link and not finding.escalates and not can_escalate(finding)
    assert runner.standing(T0 + W) == []
    assert feed.apply([], T0 + W) == []  # the loss is gone: the correlator stops reporting it
    [resolved] = feed.apply([], T0 + 2 * W)
    assert (resolved.event, resolved.incident.id) == ("resolved", opened.incident.id)
    # errored frames counted by the switch still stand between runs
    snap.rates[("spine1", "swp1")] = snap.rates[("spine1", "swp1")].model_copy(update={"in_errors_ps": 10.0})
    runner.run(snap, ["errors"])
    assert [(f.kind, f.element) for f in runner.standing(T0 + 3 * W)] == [("corrupting_link", link)]
    state.close()


def test_history_keeps_the_newest(open_state):
    state = open_state()
    history = AuditHistory(state.database, keep=2)
    runner = AuditRunner(AuditsConfig(), history)
    ids = [runner.run(clean_snapshot(), ["cabling"]).id for _ in range(3)]
    assert ids == [1, 2, 3] and [r.id for r in history.list()] == [3, 2] and history.get(1) is None
    assert [r.id for r in history.list(audit="cabling")] == [3, 2] and history.last_results()["cabling"][0] == 3
    state.close()


def test_a_history_file_of_before_is_moved_in(tmp_path):
    """A process's own audits.sqlite of before: its reports, oldest first, with new ids; renamed after."""
    old_state = StateStore(tmp_path / "old.sqlite")  # its audit tables are those that file had
    old = AuditHistory(old_state.database)
    made = [AuditRunner(AuditsConfig(), old).run(mtu_fault_snapshot(T0 + i * W), ["mtu"]) for i in range(2)]
    old_state.close()
    (tmp_path / "old.sqlite").rename(tmp_path / "audits.sqlite")
    state = StateStore(tmp_path / "state.sqlite")
    history = AuditHistory(state.database)
    AuditRunner(AuditsConfig(), history).run(clean_snapshot(), ["cabling"])  # one of its own already
    assert history.import_file(tmp_path / "audits.sqlite") == 2
    assert not (tmp_path / "audits.sqlite").exists() and (tmp_path / "audits.sqlite.imported").exists()
    moved = history.list(audit="mtu")
    assert [r.id for r in moved] == [3, 2] and [r.started_ns for r in moved] == [r.started_ns for r in made[::-1]]
    assert [len(r.findings) for r in moved] == [1, 1] and history.last_results()["mtu"][0] == 3
    assert history.import_file(tmp_path / "audits.sqlite") == 0  # once
    state.close()


@pytest.mark.parametrize("doc, where", [
    ("audits: {errors: {ber_threshold: 2}}", "audits.errors.ber_threshold"),
    ("audits: {cabling: {cron: '61 * * * *'}}", "audits.cabling.cron"),
    ("audits: {mtu: {open_incidents: sometimes}}", "audits.mtu.open_incidents"),
    ("audits: {clock: {max_age: soon}}", "audits.clock.max_age"),
    ("audits: {config_drift: {ignore: ['(']}}", "audits.config_drift.ignore"),
    ("audits: {ecmp_balance: {skew: 3}}", "audits.ecmp_balance.skew"),
    ("audits: {fancy: {}}", "audits.fancy"),
])
def test_invalid_audit_config_names_the_field(doc, where):
    with pytest.raises(ConfigError) as e:
        parse_config(doc)
    assert where in str(e.value)


def test_scheduled_jobs_run_and_store_reports(tmp_path):
    cfg = config(tmp_path, start_delay=0.2, interval=3600, mtu={"interval": 0.5}, clock={"enabled": False})
    with TestClient(create_app(Service(cfg))) as c:
        jobs = {j.id for j in c.app.state.service.scheduler.get_jobs()}
        assert {f"audit-{n}" for n in ALL if n != "clock"} <= jobs and "audit-clock" not in jobs
        deadline = time.monotonic() + 10
        while len(c.get("/audits/reports", params={"audit": "mtu"}, headers=auth("read")).json()) < 2:
            assert time.monotonic() < deadline, "the mtu audit did not run twice on its schedule"
            time.sleep(0.1)
        assert c.get("/audits/reports", headers=auth("read")).json()[0]["trigger"] == "schedule"


def test_cli_list_run_report_against_a_real_server(tmp_path):
    service = Service(config(tmp_path))
    url, server, thread = serve_in_thread(create_app(service))
    try:
        runner = CliRunner()
        env = {"NMS_URL": url, "NMS_TOKEN": TOKENS["admin"], "COLUMNS": "200"}
        out = runner.invoke(cli, ["audit", "run", "cabling", "--json"], env=env)
        assert out.exit_code == 0, out.output
        report = json.loads(out.stdout)
        assert report["results"][0]["status"] == "no_data"
        out = runner.invoke(cli, ["audit", "report", "--format", "md"], env=env)
        assert out.exit_code == 0 and out.stdout.startswith(f"# Fabric audit report {report['id']}")
        out = runner.invoke(cli, ["audit", "report", str(report["id"]), "--format", "json"], env=env)
        assert json.loads(out.stdout)["id"] == report["id"]
        out = runner.invoke(cli, ["audit", "list"], env=env)
        assert out.exit_code == 0 and "cabling" in out.stdout and "not enough data" in out.stdout
        assert runner.invoke(cli, ["audit", "report", "--format", "pdf"], env=env).exit_code == 2
        out = runner.invoke(cli, ["audit", "run"], env={**env, "NMS_TOKEN": TOKENS["read"]})
        assert out.exit_code == 1
    finally:
        server.should_exit = True
        thread.join(20)
