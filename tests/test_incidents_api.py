"""/incidents on a real Service: list, filters, get, history, ack and its auth (TestClient); the
Server-Sent Events stream on a real uvicorn server with incidents applied from another thread; and
`nms incidents` list/show/ack/watch against real servers (threaded uvicorn, and `nms serve`)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate
from typer.testing import CliRunner

from correlator.incidents import IncidentManager
from nms.app.api import create_app
from nms.app.api import incidents as incidents_api
from nms.app.cli import app as cli
from nms.app.service import Service
from nms.records import IncidentEvent
from nms.state import StateStore
from tests.helpers import TOKENS, api_client, auth, make_config, serve_in_thread, sigint_as_in_a_terminal
from tests.test_hostprobe_service import fabric
from tests.test_incidents import LINK, T0, W, finding, paths

BOUND = "bound-admin-token-h1-1-0123456789"  # every scope, bound to host h1-1
OTHER = "leaf2:swp3--spine1:swp2"


def config(tmp_path):
    tokens = [{"name": f"t-{scope}", "scopes": [scope], "token": token} for scope, token in TOKENS.items()]
    tokens.append({"name": "ops-h1-1", "scopes": ["admin"], "host": "h1-1", "token": BOUND})
    # the tests drive the incident manager with their own windows: the service's correlator loop (or,
    # without it, the audits' incident job) would resolve their incidents on its clock, mid-test on a
    # slow machine
    return make_config(tmp_path, fabric=fabric(1, 1), api={"tokens": tokens}, polling={"enabled": False},
                       correlator={"enabled": False}, audits={"enabled": False},
                       thresholds={"resolve_after_clean_windows": 2})


@pytest.fixture
def client(tmp_path):
    with api_client(config(tmp_path)) as c:
        yield c


def populate(manager: IncidentManager) -> tuple[int, int, int]:
    """A resolved link_down (jobs train-1), an open congestion (train-2) and an open nic_down."""
    [down] = manager.apply([finding(jobs=["train-1"], paths=paths(3), evidence={"down_paths": 3})], T0)
    [cong, nic] = manager.apply([finding(kind="congestion", element=OTHER, severity="minor", jobs=["train-2"]),
                                 finding(kind="nic_down", element="h1-1:eth0", element_kind="nic")], T0 + W)
    manager.apply([finding(kind="congestion", element=OTHER, severity="minor", jobs=["train-2"]),
                   finding(kind="nic_down", element="h1-1:eth0", element_kind="nic")], T0 + 2 * W)  # down resolves
    return down.incident.id, cong.incident.id, nic.incident.id


def ids(c, **params) -> list[int]:
    r = c.get("/incidents", params=params, headers=auth("read"))
    assert r.status_code == 200, r.text
    return [i["id"] for i in r.json()]


def test_list_filters_get_and_history(client):
    down, cong, nic = populate(client.app.state.service.incidents)
    assert ids(client) == [nic, cong, down]
    assert ids(client, state="open") == [nic, cong] and ids(client, state="resolved") == [down]
    assert ids(client, kind="congestion") == [cong] and ids(client, job="train-1") == [down]
    assert ids(client, element="spine1") == [cong, down] and ids(client, element="h1-1") == [nic]
    assert ids(client, until=T0) == [down] and ids(client, since=T0 + 3 * W) == [nic, cong]
    rfc3339 = "2023-11-14T22:13:22Z"  # T0 + 2 s
    assert ids(client, since=rfc3339) == [nic, cong, down] and ids(client, since="2023-11-14T22:13:23Z") == [nic, cong]
    assert ids(client, limit=1) == [nic]
    for bad in ({"state": "closed"}, {"kind": "gremlins"}, {"since": "yesterday"}, {"limit": 0},
                {"since": T0 + W, "until": T0}, {"stat": "open"}):
        assert client.get("/incidents", params=bad, headers=auth("read")).status_code == 422, bad

    one = client.get(f"/incidents/{down}", headers=auth("read")).json()
    assert (one["kind"], one["element"], one["state"], one["jobs"], one["evidence"], len(one["paths"])) == (
        "link_down", LINK, "resolved", ["train-1"], {"down_paths": 3}, 3)
    assert one["resolved_ns"] == T0 + 2 * W and one["clean_windows"] == 2
    assert client.get("/incidents/999", headers=auth("read")).status_code == 404
    assert client.get("/incidents/nope", headers=auth("read")).status_code == 422
    events = client.get(f"/incidents/{down}/events", headers=auth("read")).json()
    assert [(e["event"], e["ts"]) for e in events] == [("opened", T0), ("resolved", T0 + 2 * W)]
    assert events[0]["id"] < events[1]["id"] and events[1]["incident"]["state"] == "resolved"
    assert client.get("/incidents/999/events", headers=auth("read")).status_code == 404


def test_ack_and_its_auth(client):
    down, cong, _ = populate(client.app.state.service.incidents)
    url = f"/incidents/{cong}/ack"
    for path in ("/incidents", f"/incidents/{cong}", f"/incidents/{cong}/events", "/incidents/stream"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers=auth("ingest")).status_code == 403, path
    assert client.post(url).status_code == 401
    assert client.post(url, headers=auth("read")).status_code == 403
    assert client.post(url, headers=auth("ingest")).status_code == 403
    bound = client.post(url, headers={"Authorization": f"Bearer {BOUND}"})
    assert bound.status_code == 403 and "bound to host" in bound.json()["detail"]
    assert client.post(url, json={"comment": "x", "extra": 1}, headers=auth("act")).status_code == 422
    assert client.post(url, json={"comment": "x" * 1025}, headers=auth("act")).status_code == 422

    r = client.post(url, json={"comment": "on it"}, headers=auth("act"))
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["acknowledged_by"] == "t-act" and first["acknowledged_ns"] > 0 and first["state"] == "open"
    again = client.post(url, headers=auth("admin")).json()  # no body; the first ack stands
    assert (again["acknowledged_by"], again["acknowledged_ns"]) == ("t-act", first["acknowledged_ns"])
    history = client.get(f"/incidents/{cong}/events", headers=auth("read")).json()
    assert [(e["event"], e["comment"]) for e in history] == [("opened", None), ("acknowledged", "on it")]
    assert client.post(f"/incidents/{down}/ack", headers=auth("admin")).json()["acknowledged_by"] == "t-admin"
    assert client.post("/incidents/999/ack", headers=auth("act")).status_code == 404


def test_openapi_documents_the_incident_routes(client):
    spec = client.get("/openapi.json").json()
    validate(spec)
    paths_ = [p for p in spec["paths"] if p.startswith("/incidents")]
    assert paths_.index("/incidents/stream") < paths_.index("/incidents/{incident_id}")
    stream = spec["paths"]["/incidents/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    ack = spec["paths"]["/incidents/{incident_id}/ack"]["post"]
    assert {"401", "403", "404"} <= set(ack["responses"]) and ack["tags"] == ["incidents"]


def test_the_stream_of_a_service_that_is_not_running_ends_after_the_snapshot(tmp_path):
    service = Service(config(tmp_path))
    with TestClient(create_app(service, manage_lifecycle=False)) as c:
        down, cong, nic = populate(service.incidents)
        r = c.get("/incidents/stream", params={"state": "open"}, headers=auth("read"))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        snapshot = [json.loads(line[6:])["id"] for line in r.text.splitlines() if line.startswith("data: ")]
        assert snapshot == [cong, nic] and r.text.count("event: snapshot") == 2
        r = c.get("/incidents/stream", headers={**auth("read"), "Last-Event-ID": "0"})  # the whole history
        assert [line for line in r.text.splitlines() if line.startswith("event: ")] == [
            "event: opened", "event: opened", "event: opened", "event: resolved"]
        assert c.get("/incidents/stream", headers={**auth("read"), "Last-Event-ID": "x"}).status_code == 422
    service.state.close()
    service.store.close()


# --- the event stream on a real server ------------------------------------------------------------------


@pytest.fixture
def live(tmp_path):
    service = Service(config(tmp_path))
    app = create_app(service)
    url, server, thread = serve_in_thread(app)
    yield SimpleNamespace(url=url, service=service, server=server, thread=thread)
    server.should_exit = True
    thread.join(20)
    assert not thread.is_alive(), "the server did not stop (a stream kept it up?)"


class Sse:
    """Reads /incidents/stream in a thread: each event as a dict of its fields, comments as str,
    None at the end of the stream."""

    def __init__(self, url: str, token: str, params: dict | None = None, headers: dict | None = None):
        self.items: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.status: int | None = None
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream", **(headers or {})}
        self.thread = threading.Thread(target=self._run, args=(url, params or {}, headers), daemon=True)
        self.thread.start()

    def _run(self, url, params, headers):
        try:
            with httpx.stream("GET", f"{url}/incidents/stream", params=params, headers=headers,
                              timeout=httpx.Timeout(5, read=30)) as r:
                self.status, self.content_type = r.status_code, r.headers.get("content-type")
                fields: dict = {}
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.startswith(":"):
                        self.items.put(line)
                    elif line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                    elif fields:
                        self.items.put(fields)
                        fields = {}
        finally:
            self.items.put(None)

    def next(self, timeout: float = 10):
        return self.items.get(timeout=timeout)

    def events(self, n: int, timeout: float = 10) -> list[dict]:
        out = []
        while len(out) < n:
            item = self.next(timeout)
            assert item is not None, f"stream ended after {out}"
            if isinstance(item, dict):
                out.append(item)
        return out


def test_stream_delivers_events_in_order(live):
    manager = live.service.incidents
    [before] = manager.apply([finding(kind="congestion", element=OTHER, severity="minor")], T0)
    sse = Sse(live.url, TOKENS["read"], params={"state": "open"})
    assert sse.next() == ": incident events"  # subscribed: what follows is live
    assert sse.status == 200 and sse.content_type.startswith("text/event-stream")
    [snap] = sse.events(1)
    assert snap["event"] == "snapshot" and "id" not in snap and json.loads(snap["data"])["id"] == before.incident.id

    def correlator():  # windows from a worker thread, as the service runs them
        still = finding(kind="congestion", element=OTHER, severity="minor")
        for i, findings in enumerate(([finding(), still], [finding(severity="major"), still]), 1):
            manager.apply(findings, T0 + i * W)

    worker = threading.Thread(target=correlator)
    worker.start()
    worker.join(10)
    opened, updated = sse.events(2)
    link_id = json.loads(opened["data"])["incident"]["id"]
    ack = httpx.post(f"{live.url}/incidents/{link_id}/ack", json={"comment": "optic swap"},
                     headers={"Authorization": f"Bearer {TOKENS['act']}"})
    assert ack.status_code == 200, ack.text
    [acked] = sse.events(1)
    threading.Thread(target=lambda: [manager.apply([], T0 + i * W) for i in (3, 4)]).start()
    resolved = sse.events(2)
    got = [opened, updated, acked, *resolved]
    assert [e["event"] for e in got] == ["opened", "updated", "acknowledged", "resolved", "resolved"]
    event_ids = [int(e["id"]) for e in got]
    assert event_ids == sorted(event_ids) and len(set(event_ids)) == 5
    parsed = [IncidentEvent.model_validate_json(e["data"]) for e in got]
    assert parsed[1].incident.severity == "major" and parsed[2].incident.acknowledged_by == "t-act"
    assert {p.incident.id for p in parsed[3:]} == {before.incident.id, link_id}
    assert all(p.incident.state == "resolved" for p in parsed[3:])
    # history agrees with the stream
    history = httpx.get(f"{live.url}/incidents/{link_id}/events", headers={"Authorization": f"Bearer {TOKENS['read']}"})
    assert [e["id"] for e in history.json()] == [i for e, i in zip(got, event_ids)
                                                 if json.loads(e["data"])["incident"]["id"] == link_id]

    # a client that reconnects with Last-Event-ID gets what it missed first, with the same ids
    again = Sse(live.url, TOKENS["read"], headers={"Last-Event-ID": str(event_ids[1])})
    replay = again.events(3)
    assert [int(e["id"]) for e in replay] == event_ids[2:]
    sse.stop.set()
    again.stop.set()


def test_stream_keep_alive_disconnect_and_shutdown(live, monkeypatch):
    monkeypatch.setattr(incidents_api, "KEEPALIVE_S", 0.3)
    monkeypatch.setattr(incidents_api, "TICK_S", 0.1)
    manager = live.service.incidents
    assert Sse(live.url, TOKENS["ingest"]).next() is None  # 403: no stream
    idle = Sse(live.url, TOKENS["read"])
    assert idle.next() == ": incident events"
    assert idle.next(5) == ": keep-alive"
    # a client that goes away is unsubscribed
    leaver = Sse(live.url, TOKENS["admin"])
    assert leaver.next() == ": incident events"
    assert len(manager._subscribers) == 2
    leaver.stop.set()
    deadline = time.monotonic() + 10
    while len(manager._subscribers) != 1:
        assert time.monotonic() < deadline, "the gone client's subscription was not closed"
        time.sleep(0.05)
    # a stopping server ends the streams (it does not wait for them)
    live.server.should_exit = True
    while (item := idle.next(10)) is not None:
        assert item == ": keep-alive"
    live.thread.join(10)
    assert not live.thread.is_alive()


# --- the CLI ----------------------------------------------------------------------------------------------


def test_cli_list_show_ack(live):
    down, cong, nic = populate(live.service.incidents)
    runner = CliRunner(env={"COLUMNS": "250"})

    def nms(*args, token=TOKENS["admin"]):
        return runner.invoke(cli, ["incidents", *args, "--url", live.url, "--token", token])

    out = nms("list", token=TOKENS["read"])
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if "│" in line and ("open" in line or "resolved" in line)]
    assert [int(r.split("│")[1]) for r in rows] == [nic, cong, down]
    assert "congestion" in rows[1] and OTHER in rows[1] and "minor" in rows[1] and "train-2" in rows[1]
    assert "lasted 2s" in rows[2] and "3 incident(s)" in out.output
    out = nms("list", "--state", "open", "--json")
    assert [i["id"] for i in json.loads(out.stdout)] == [nic, cong]
    out = nms("list", "--job", "train-1", "--json")
    assert [i["id"] for i in json.loads(out.stdout)] == [down]

    out = nms("ack", str(cong), "--comment", "reroute in progress", token=TOKENS["act"])
    assert out.exit_code == 0 and f"incident {cong} acknowledged by t-act" in out.output, out.output
    out = nms("ack", str(down), token=TOKENS["read"])
    assert out.exit_code == 1 and "403" in out.output
    out = nms("ack", "999")
    assert out.exit_code == 1 and "404" in out.output

    out = nms("show", str(cong))
    assert out.exit_code == 0, out.output
    assert f"incident {cong} open: congestion on link {OTHER}" in out.output
    assert "acknowledged" in out.output and "by t-act: reroute in progress" in out.output
    out = nms("show", str(down))
    assert '"down_paths": 3' in out.output and "paths (3)" in out.output and "resolved" in out.output
    shown = json.loads(nms("show", str(down), "--json").stdout)
    assert shown["incident"]["id"] == down and [e["event"] for e in shown["events"]] == ["opened", "resolved"]


def _nms_process(*args: str, url: str, token: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("NMS_TOKEN", "NMS_URL")}
    env.update(NMS_URL=url, NMS_TOKEN=token, COLUMNS="200")
    return subprocess.Popen([sys.executable, "-m", "nms", *args], env=env, stdout=subprocess.PIPE,
                            preexec_fn=sigint_as_in_a_terminal,
                            stderr=subprocess.PIPE, text=True)


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def test_cli_watch_follows_the_stream_until_ctrl_c(live):
    manager = live.service.incidents
    [before] = manager.apply([finding(kind="congestion", element=OTHER, severity="minor")], T0)
    proc = _nms_process("incidents", "watch", "--open", "--json", url=live.url, token=TOKENS["read"])
    try:
        lines = _lines(proc.stdout)
        snap = json.loads(lines.get(timeout=30))  # the snapshot comes first: the stream is up
        assert snap["event"] == "snapshot" and snap["incident"]["id"] == before.incident.id
        threading.Thread(target=lambda: (manager.apply([finding()], T0 + W),
                                         manager.acknowledge(before.incident.id, "noc"))).start()
        first, second = json.loads(lines.get(timeout=10)), json.loads(lines.get(timeout=10))
        assert (first["event"], first["incident"]["element"]) == ("opened", LINK)
        assert (second["event"], second["incident"]["acknowledged_by"]) == ("acknowledged", "noc")
        assert second["id"] > first["id"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()

    text = _nms_process("incidents", "watch", url=live.url, token=TOKENS["read"])
    try:
        lines = _lines(text.stdout)
        deadline = time.monotonic() + 30
        while not manager._subscribers:  # connected (no snapshot asked for, nothing printed yet)
            assert time.monotonic() < deadline and text.poll() is None, text.stderr.read()
            time.sleep(0.05)
        manager.apply([finding(severity="major")], T0 + 2 * W)
        line = lines.get(timeout=10)
        assert "updated" in line and "major" in line and "link_down" in line and LINK in line, line
    finally:
        text.send_signal(signal.SIGINT)
        assert text.wait(10) == 0
    refused = _nms_process("incidents", "watch", url=live.url, token=TOKENS["ingest"])
    assert refused.wait(30) == 1 and "403" in refused.stderr.read()


def test_nms_serve_continues_the_incidents_it_had(tmp_path):
    """The service's own wiring: incidents in the data directory are there after a (re)start."""
    from tests.test_cli_service import READ_TOKEN, TOKEN, nms, start_server

    state = StateStore(tmp_path / "data" / "state.sqlite")
    down, cong, nic = populate(IncidentManager(state, resolve_after=2))
    state.close()
    srv = start_server(tmp_path)
    try:
        out = nms("incidents", "list", "--state", "open", "--json", url=srv["url"], token=READ_TOKEN)
        assert out.returncode == 0, out.stderr
        assert [i["id"] for i in json.loads(out.stdout)] == [nic, cong]
        out = nms("incidents", "ack", str(nic), url=srv["url"], token=TOKEN)
        assert out.returncode == 0 and "acknowledged by admin" in out.stdout, out.stderr
        out = nms("incidents", "show", str(nic), "--json", url=srv["url"], token=READ_TOKEN)
        assert [e["event"] for e in json.loads(out.stdout)["events"]] == ["opened", "acknowledged"]
    finally:
        srv["proc"].send_signal(signal.SIGTERM)
        srv["proc"].wait(30)
