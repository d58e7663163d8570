"""Every list command at 80 columns, against a real Service (in process) holding long, realistic
identifiers: each kind, element, id, job id and host shows whole on one line, nothing is cut to "…",
no line is wider than the terminal; relative times and a short severity by default, --wide every column
with exact times; --json as before."""

from __future__ import annotations

import json
import re
import time

import pytest
from _act_fabric import addresses, topology, uplink
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from nms.app.api import create_app
from nms.app.cli import app as cli
from nms.app.cli import client as cli_client
from nms.app.service import Service
from nms.records import Finding
from tests.helpers import TOKENS, auth, make_config
from tests.test_agent_commands import REG, _Via
from tests.test_hostprobe_service import fabric

LINK = "leaf1:swp3--spine1:swp1"
UPLINK = uplink("leaf1", 1)  # an element the action planner knows
JOB_IDS = ["lab-allreduce-1", "3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f"]
KINDS = ["link_down", "corrupting_link", "congestion"]
ELEMENTS = {"link_down": LINK, "corrupting_link": "leaf2:swp31--spine2:swp12", "congestion": "leaf2:swp3--spine1:swp2"}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


@pytest.fixture
def service(tmp_path):
    cfg = make_config(tmp_path, fabric=fabric(1, 1), polling={"enabled": False}, correlator={"enabled": False},
                      actions={"enabled": True})
    svc = Service(cfg)
    svc.actions.context = lambda: (topology(4), addresses(4))
    return svc


@pytest.fixture
def nms(service, monkeypatch):
    with TestClient(create_app(service)) as client:
        def init(self, url, token, timeout=30.0, verify=True):
            self.url, self._http = url, _Via(client, {"Authorization": f"Bearer {token}"} if token else {})

        monkeypatch.setattr(cli_client.ApiClient, "__init__", init)
        _populate(service, client)
        runner = CliRunner(env={"COLUMNS": "80"})
        yield lambda *args: runner.invoke(
            cli, [*args, *(["--token", TOKENS["admin"]] if args[0] != "dashboards" else [])]
        )


def _populate(service, client) -> None:
    now = time.time_ns()
    for job_id in JOB_IDS:
        r = client.post("/jobs", headers=auth("admin"), json={
            "id": job_id, "name": "all-reduce benchmark on the lab fabric", "hosts": ["h1-1"],
            "start": now - 3 * 3600 * 10**9})
        assert r.status_code in (200, 201), r.text
    findings = [Finding(kind=kind, element=ELEMENTS[kind],
                        element_kind="link", ts=now - 300 * 10**9, confidence=0.9,
                        severity={"link_down": "critical", "corrupting_link": "major"}.get(kind, "warning"),
                        summary=f"{kind} on the link between leaf1 and spine1, seen by 12 of 12 probe paths",
                        paths=[], jobs=JOB_IDS)
                for kind in KINDS]
    assert len(service.incidents.apply(findings, now - 300 * 10**9)) == 3
    r = client.post("/actions", headers=auth("act"), json={"element": UPLINK, "kind": "drain_link", "dry_run": True})
    assert r.status_code in (200, 201), r.text
    assert client.post("/agents/h1-1/register", json=REG, headers=auth("ingest")).status_code == 200
    assert client.post("/agents/h1-1/commands", json={"kind": "set_rate", "args": {"rate": 40}},
                       headers=auth("admin")).status_code in (200, 201)
    assert client.post("/audits/run", json={}, headers=auth("admin")).status_code == 200


def fits(out, *identifiers: str, columns: int = 80) -> list[str]:
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines, out.output
    assert "…" not in out.stdout, "cut short:\n" + out.stdout
    assert max(len(line) for line in lines) <= columns, "wider than the terminal:\n" + out.stdout
    for ident in identifiers:
        assert any(re.search(rf"(?<![\w:.-]){re.escape(ident)}(?![\w:.-])", line) for line in lines), \
            f"{ident!r} not whole on one line:\n" + out.stdout
    return lines


LIST_COMMANDS = [
    (["incidents", "list"], [*ELEMENTS.values(), *KINDS]),
    (["jobs", "list"], JOB_IDS),
    (["actions", "list"], [UPLINK, "drain_link"]),
    (["agents", "list"], ["h1-1"]),
    (["agents", "commands"], ["h1-1", "set_rate"]),
    (["audit", "list"], []),
    (["audit", "report", "--list"], []),
    (["clock"], []),
    (["topology"], ["leaf1", "h1-1"]),
    (["devices"], []),
    (["dashboards", "list"], []),
    (["store", "status"], []),
]


@pytest.mark.parametrize("wide", [False, True], ids=["default", "wide"])
def test_every_list_command_at_80_columns(nms, wide):
    for args, identifiers in LIST_COMMANDS:
        if wide and args[0] == "store":
            continue  # a two-column table: no --wide
        out = nms(*args, *(["--wide"] if wide else []))
        if wide:  # every column: as wide as they need, never cut
            assert out.exit_code == 0 and "…" not in out.stdout, (args, out.output)
            for ident in identifiers:
                assert ident in out.stdout, (args, ident, out.stdout)
        else:
            fits(out, *identifiers)


def test_incidents_default_is_short_wide_is_full(nms):
    lines = fits(nms("incidents", "list"), *KINDS, LINK)
    row = next(line for line in lines if "link_down" in line)
    assert "crit" in row and "critical" not in row and "5m ago" in row and not ISO.search(row), row
    assert "3 incident(s)" in nms("incidents", "list").output
    wide = nms("incidents", "list", "--wide").stdout
    row = next(line for line in wide.splitlines() if "link_down" in line)
    assert "critical" in row and ISO.search(row) and "lab-allreduce-1," + JOB_IDS[1] in row, wide
    assert [i["kind"] for i in json.loads(nms("incidents", "list", "--json").stdout)] == KINDS[::-1]


def test_jobs_default_relative_wide_exact(nms):
    lines = fits(nms("jobs", "list"), *JOB_IDS)
    assert any("3h ago" in line and JOB_IDS[1] in line for line in lines), "\n".join(lines)
    wide = nms("jobs", "list", "--wide").stdout
    assert ISO.search(wide) and "all-reduce benchmark on the lab fabric" in wide, wide
    assert sorted(j["id"] for j in json.loads(nms("jobs", "list", "--json").stdout)) == sorted(JOB_IDS)
