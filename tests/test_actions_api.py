"""/actions on a real Service (TestClient): the auth matrix, who is recorded, filters, the audit
log, refusals; `nms actions` against it."""

from __future__ import annotations

import pytest
from _act_fabric import addresses, topology, uplink
from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.service import Service
from tests.helpers import TOKENS, api_client, auth, make_config
from tests.test_hostprobe_service import fabric

BOUND = "bound-admin-token-h1-1-0123456789"


def config(tmp_path, **actions):
    tokens = [{"name": f"t-{scope}", "scopes": [scope], "token": token} for scope, token in TOKENS.items()]
    tokens.append({"name": "ops-h1-1", "scopes": ["admin"], "host": "h1-1", "token": BOUND})
    return make_config(tmp_path, fabric=fabric(1, 1), api={"tokens": tokens}, polling={"enabled": False},
                       correlator={"enabled": False}, actions={"enabled": True, **actions})


@pytest.fixture
def service(tmp_path):
    svc = Service(config(tmp_path))
    svc.actions.context = lambda: (topology(4), addresses(4))  # the planner's view of a 4-spine fabric
    return svc


@pytest.fixture
def client(service):
    with api_client(service) as c:
        yield c


def test_auth_matrix(client):
    body = {"element": uplink("leaf1", 1), "kind": "host_reroute", "dry_run": True}
    assert client.get("/actions").status_code == 401
    assert client.post("/actions", json=body).status_code == 401
    for scope, code in (("read", 200), ("ingest", 403), ("act", 403), ("admin", 200)):
        assert client.get("/actions", headers=auth(scope)).status_code == code, scope
    for scope, code in (("read", 403), ("ingest", 403), ("act", 200), ("admin", 200)):
        assert client.post("/actions", json=body | {"element": uplink("leaf1", 1 + len(scope) % 4)},
                           headers=auth(scope)).status_code == code, scope
    bound = {"Authorization": f"Bearer {BOUND}"}
    assert client.post("/actions", json=body, headers=bound).status_code == 403  # host-bound: never acts
    for verb in ("approve", "reject", "rollback"):
        assert client.post(f"/actions/1/{verb}", headers=auth("read")).status_code == 403
        assert client.post(f"/actions/1/{verb}", headers=bound).status_code == 403


def test_requests_approvals_and_the_audit_log(client):
    r = client.post("/actions", json={"element": uplink("leaf1", 1), "kind": "drain_link", "dry_run": True},
                    headers=auth("act"))
    assert r.status_code == 200, r.text
    (dry,) = r.json()
    assert dry["dry_run"] and dry["state"] == "proposed" and dry["requested_by"] == "t-act"
    assert dry["targets"] == ["leaf1"]
    # a real request: host_reroute needs every target's agent; none registered here -> failed, with why
    (failed,) = client.post("/actions", json={"element": uplink("leaf2", 2), "kind": "host_reroute"},
                            headers=auth("admin")).json()
    assert failed["state"] == "failed" and failed["approved_by"] == "t-admin"
    assert failed["result"].startswith("no agent registered on h1, h2, h3, h4")
    events = client.get(f"/actions/{failed['id']}/events", headers=auth("read")).json()
    assert [(e["event"], e["by"]) for e in events] == [("proposed", "t-admin"), ("approved", "t-admin"),
                                                       ("failed", "t-admin")]
    assert events[-1]["note"].startswith("no agent registered")
    # reject the dry run; rollback refused for what is not applied; unknown ids are 404
    rej = client.post(f"/actions/{dry['id']}/reject", json={"reason": "not now"}, headers=auth("act"))
    assert rej.status_code == 200 and rej.json()["state"] == "rejected"
    assert client.get(f"/actions/{dry['id']}/events", headers=auth("read")).json()[-1]["note"] == "not now"
    r = client.post(f"/actions/{failed['id']}/rollback", headers=auth("act"))
    assert r.status_code == 409 and "only applied actions" in r.json()["detail"]
    assert client.post("/actions/999/approve", headers=auth("act")).status_code == 404
    assert client.get("/actions/999", headers=auth("read")).status_code == 404
    assert client.post("/actions", json={"incident_id": 5}, headers=auth("act")).status_code == 404
    # every event is also an action_event point for dashboards
    r = client.post("/telemetry/query", json={"measurement": "action_event", "start": 0, "end": 2**62},
                    headers=auth("read"))
    rows = [dict(zip(s["columns"], v)) | s["tags"] for s in r.json()["series"] for v in s["values"]]
    assert sorted((x["id"], x["event"]) for x in rows) == [(dry["id"], "proposed"), (dry["id"], "rejected"),
                                                           (failed["id"], "approved"), (failed["id"], "failed"),
                                                           (failed["id"], "proposed")]
    # filters
    assert [a["id"] for a in client.get("/actions?state=rejected", headers=auth("read")).json()] == [dry["id"]]
    assert [a["id"] for a in client.get("/actions?kind=host_reroute", headers=auth("read")).json()] == [failed["id"]]


def test_bad_requests_name_the_field(client):
    r = client.post("/actions", json={"element": uplink("leaf1", 1)}, headers=auth("act"))
    assert r.status_code == 422 and "kind is required" in r.text
    r = client.post("/actions", json={"element": "x", "incident_id": 1, "kind": "host_reroute"}, headers=auth("act"))
    assert r.status_code == 422
    r = client.post("/actions", json={"element": "x", "kind": "reboot"}, headers=auth("act"))
    assert r.status_code == 422 and "kind" in r.text
    # ids past SQLite's 64-bit integers: 422, not a 500 from the state store (the API fuzz found it)
    assert client.get(f"/actions?incident_id={2**63}", headers=auth("read")).status_code == 422
    assert client.post("/actions", json={"incident_id": 2**63}, headers=auth("act")).status_code == 422


def test_policy_off_is_409(tmp_path):
    svc = Service(config(tmp_path, policies={"drain_link": {"policy": "off"}}))
    svc.actions.context = lambda: (topology(4), addresses(4))
    with TestClient(create_app(svc)) as c:
        r = c.post("/actions", json={"element": uplink("leaf1", 1), "kind": "drain_link"}, headers=auth("act"))
        assert r.status_code == 409 and "policy for drain_link" in r.json()["detail"]
        assert 'nms_action_refusals_total{kind="drain_link",why="policy_off"} 1.0' in \
            c.get("/metrics", headers=auth("read")).text


def test_cli(client, monkeypatch):
    from typer.testing import CliRunner

    from nms.app.cli import app as cli
    from nms.app.cli import client as cli_client
    from tests.test_agent_commands import _Via

    def init(self, url, token, timeout=30.0, verify=True):
        self.url, self._http = url, _Via(client, {"Authorization": f"Bearer {token}"} if token else {})

    monkeypatch.setattr(cli_client.ApiClient, "__init__", init)
    runner = CliRunner(env={"COLUMNS": "200"})
    nms = lambda *args, token=TOKENS["act"]: runner.invoke(cli, [*args, "--token", token])  # noqa: E731
    out = nms("actions", "request", "--element", uplink("leaf1", 1), "--kind", "drain_link", "--dry-run")
    assert out.exit_code == 0 and "action 1 requested: proposed (dry run)" in out.output, out.output
    out = nms("actions", "list", token=TOKENS["read"])
    assert out.exit_code == 0 and "drain_link" in out.output and "│ leaf1 " in out.output and "1 action(s)" in \
        out.output
    out = nms("actions", "reject", "1", "--reason", "not during training")
    assert out.exit_code == 0 and "action 1 rejected: rejected" in out.output
    out = nms("actions", "show", "1", token=TOKENS["read"])
    assert out.exit_code == 0 and "audit log" in out.output and "not during training" in out.output
    assert "t-act" in out.output and '"ports"' in out.output
    out = nms("actions", "list", "--json", "--state", "rejected", token=TOKENS["read"])
    assert out.exit_code == 0 and '"approved_by": null' in out.output
    out = nms("actions", "approve", "1")
    assert out.exit_code == 1 and "409" in out.output and "not awaiting approval" in out.output
    out = nms("actions", "rollback", "1", token=TOKENS["read"])
    assert out.exit_code == 1 and "403" in out.output
