"""Agent commands kept in the state store (restart, results, expiry), host-bound tokens (/agents paths,
per-item ingest checks), the agent's outcome of each command and the control thread posting it,
and the `nms agents` CLI."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from hostprobe.agent import Agent
from hostprobe.client import Control
from nms.app.api import create_app
from nms.app.cli import app as cli
from nms.app.cli import client as cli_client
from nms.app.service import Service
from tests.helpers import TOKENS, api_client, auth, make_config, wait_until
from tests.test_hostprobe_service import T0, fabric

BOUND = "bound-agent-token-h1-1-0123456789"  # ingest, bound to h1-1
BOUND_ADMIN = "bound-admin-token-h1-1-0123456789"  # every scope, still bound to h1-1
REG = {"session": "0a", "probe_port": 33434, "nics": [{"name": "eth0", "address": "10.1.0.1"}]}


def config(tmp_path, **agents):
    tokens = [{"name": f"t-{scope}", "scopes": [scope], "token": token} for scope, token in TOKENS.items()]
    tokens += [{"name": "agent-h1-1", "scopes": ["ingest"], "host": "h1-1", "token": BOUND},
               {"name": "ops-h1-1", "scopes": ["admin"], "host": "h1-1", "token": BOUND_ADMIN}]
    return make_config(tmp_path, fabric=fabric(2, 2), api={"tokens": tokens},
                       agents={"peers_random": 1, "command_wait_max": 2, "command_ttl": "300s", **agents})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def client(tmp_path):
    with api_client(config(tmp_path)) as c:
        yield c


def send(c, host: str, kind: str = "reprobe_paths", **args) -> dict:
    r = c.post(f"/agents/{host}/commands", json={"kind": kind, "args": args}, headers=auth("act"))
    assert r.status_code == 200, r.text
    return r.json()


def poll(c, host: str, after: int = 0, token: str = TOKENS["ingest"]) -> dict:
    r = c.get(f"/agents/{host}/commands?after={after}&wait=0", headers=bearer(token))
    assert r.status_code == 200, r.text
    return r.json()


def listing(c, **params) -> list[dict]:
    r = c.get("/agents/commands", params=params, headers=auth("read"))
    assert r.status_code == 200, r.text
    return r.json()


def test_commands_survive_a_restart_and_ids_keep_rising(tmp_path):
    with TestClient(create_app(Service(config(tmp_path)))) as c:
        assert c.post("/agents/h1-1/register", json=REG, headers=auth("ingest")).status_code == 200
        first, second = send(c, "h1-1", "set_rate", rate=50), send(c, "h1-1")
        got = poll(c, "h1-1")
        assert [x["id"] for x in got["commands"]] == [first["id"], second["id"]]
        assert all(x["status"] == "delivered" and x["delivered_ns"] >= x["issued_ns"] for x in got["commands"])
        away = send(c, "h2-1", "set_rate", rate=20)  # h2-1 has no agent yet
        later = send(c, "h1-1")  # issued after h1-1's last poll
        instance = got["instance"]
    with TestClient(create_app(Service(config(tmp_path)))) as c:  # the service restarts on the same data dir
        status = {x["id"]: x["status"] for x in listing(c)}
        assert status == {first["id"]: "delivered", second["id"]: "delivered", away["id"]: "pending",
                          later["id"]: "pending"}
        assert c.post("/agents/h1-1/register", json=REG, headers=auth("ingest")).json()["instance"] != instance
        # the agent keeps its cursor: it gets what was issued while the service was away, nothing twice
        again = poll(c, "h1-1", after=second["id"])
        assert [x["id"] for x in again["commands"]] == [later["id"]] and again["last_id"] == later["id"]
        assert poll(c, "h1-1", after=later["id"])["commands"] == []
        # an agent that starts on h2-1 (cursor 0) gets the command issued before either came up
        c.post("/agents/h2-1/register", json={**REG, "nics": []}, headers=auth("ingest"))
        assert [(x["id"], x["args"]) for x in poll(c, "h2-1")["commands"]] == [(away["id"], {"rate": 20})]
        newest = send(c, "h2-2")
        assert newest["id"] > later["id"] and newest["status"] == "pending"  # ids are never reused


def test_results_show_in_the_listing(client):
    client.post("/agents/h1-1/register", json=REG, headers=auth("ingest"))
    ok, bad = send(client, "h1-1", "set_rate", rate=40), send(client, "h1-1", "set_rate", rate=40)
    poll(client, "h1-1")
    url = "/agents/h1-1/commands/{}/result"
    r = client.post(url.format(ok["id"]), json={"status": "done", "message": "probing at 40 exchanges/s per path",
                                                "details": {"rate": 40}}, headers=auth("ingest"))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and r.json()["result_ns"] >= r.json()["delivered_ns"] >= ok["issued_ns"]
    client.post(url.format(bad["id"]), json={"status": "failed", "message": "prober busy"}, headers=auth("ingest"))
    shown = client.get(f"/agents/h1-1/commands/{ok['id']}", headers=auth("read")).json()
    assert (shown["status"], shown["message"], shown["details"], shown["by"]) == (
        "done", "probing at 40 exchanges/s per path", {"rate": 40}, "t-act")
    assert [(x["id"], x["status"], x["message"]) for x in listing(client, host="h1-1")] == [
        (bad["id"], "failed", "prober busy"), (ok["id"], "done", "probing at 40 exchanges/s per path")]
    assert [x["id"] for x in listing(client, status="done")] == [ok["id"]]
    assert listing(client, status="pending") == [] and len(listing(client, limit=1)) == 1
    # finished commands are not sent again, even to an agent that restarts (cursor 0)
    assert poll(client, "h1-1")["commands"] == []
    # the first outcome stands; unknown commands, another host's command, bad bodies
    assert client.post(url.format(ok["id"]), json={"status": "failed"}, headers=auth("ingest")).status_code == 409
    assert client.post(url.format(999), json={"status": "done"}, headers=auth("ingest")).status_code == 404
    other = send(client, "h1-2")
    assert client.post(url.format(other["id"]), json={"status": "done"}, headers=auth("ingest")).status_code == 404
    assert client.get(f"/agents/h1-1/commands/{other['id']}", headers=auth("read")).status_code == 404
    for body in ({"status": "done", "message": "x" * 1025}, {"status": "done", "details": {"x": "y" * 5000}},
                 {"status": "expired"}, {"status": "done", "extra": 1}):
        assert client.post(f"/agents/h1-2/commands/{other['id']}/result", json=body,
                           headers=auth("ingest")).status_code == 422, body
    nan = client.post(
        f"/agents/h1-2/commands/{other['id']}/result",
        content=b'{"status": "done", "details": {"x": NaN}}',
        headers={**auth("ingest"), "Content-Type": "application/json"},
    )
    assert nan.status_code == 422 and "no NaN" in nan.text  # it could be stored but never be read back as JSON
    for args in (b'{"rate": NaN}', b'{"x": Infinity}'):
        r = client.post("/agents/h1-1/commands", content=b'{"kind": "set_rate", "args": %s}' % args,
                        headers={**auth("act"), "Content-Type": "application/json"})
        assert r.status_code == 422 and "no NaN" in r.text, r.text
    assert client.post(url.format(ok["id"]), json={"status": "done"}, headers=auth("read")).status_code == 403
    assert client.get("/agents/commands?status=bogus", headers=auth("read")).status_code == 422
    assert client.get("/agents/commands", headers=auth("ingest")).status_code == 403


def test_commands_expire_when_no_agent_takes_them(client):
    waiting = send(client, "h2-1", "set_rate", rate=5)
    client.post("/agents/h1-1/register", json=REG, headers=auth("ingest"))
    taken = send(client, "h1-1")
    poll(client, "h1-1")  # delivered, no result yet
    reg = client.app.state.agents
    later = time.time_ns() + 301 * 10**9  # the TTL is 300 s: move the service's clock past it
    reg.clock = lambda: later
    shown = client.get(f"/agents/h2-1/commands/{waiting['id']}", headers=auth("read")).json()
    assert shown["status"] == "expired" and shown["result_ns"] == waiting["issued_ns"] + 300 * 10**9
    assert "no agent received it within 300 s" in shown["message"]
    client.post("/agents/h2-1/register", json={**REG, "nics": []}, headers=auth("ingest"))
    assert poll(client, "h2-1")["commands"] == []  # too late: never delivered
    assert poll(client, "h1-1")["commands"] == []  # delivered ones are not sent again past the TTL either
    assert {x["id"]: x["status"] for x in listing(client)} == {waiting["id"]: "expired", taken["id"]: "delivered"}


def test_pending_cap_and_history_per_host(open_state):  # on SQLite and on PostgreSQL
    state = open_state()
    ids = [state.add_commands(["h"], "reprobe_paths", {}, "t", T0 + i, pending_max=3, keep=5)[0].id for i in range(7)]
    state.add_commands(["other"], "reprobe_paths", {}, "t", T0, pending_max=3, keep=5)
    kept = state.list_commands(host="h")
    assert [c.id for c in kept] == ids[::-1][:5]  # the newest 5
    assert [c.status for c in kept] == ["pending"] * 3 + ["expired"] * 2
    assert "more than 3 commands pending" in kept[-1].message
    assert len(state.list_commands(host="other")) == 1 and state.last_command_id() == ids[-1] + 1
    state.close()


async def test_a_command_another_process_issues_wakes_the_long_poll_at_once(open_state):
    """Two processes on one state store: the API worker holds an agent's long-poll; the correlate member
    issues its command (a focus, a steer). Followed (`follow_commands`, as the service does every 0.25 s
    with a shared state), the long-poll returns it within a follow; not followed, it waits its full time."""
    from nms.app.agent_registry import AgentRegistry
    from nms.config.models import AgentsConfig, FabricConfig

    fab = FabricConfig.model_validate(fabric(2, 2))
    worker_state, member_state = open_state(), open_state()
    try:
        worker = AgentRegistry(fab, AgentsConfig(), worker_state)
        member = AgentRegistry(fab, AgentsConfig(), member_state)
        host = fab.hosts[0].name

        async def held_poll(follow: bool, wait: float) -> tuple[list, float]:
            if follow:
                worker.share_commands()
            stop = asyncio.Event()

            async def follower():
                while follow and not stop.is_set():
                    await worker.follow_commands()
                    await asyncio.sleep(0.25)

            following = asyncio.create_task(follower())
            started = time.monotonic()
            polling = asyncio.create_task(worker.wait(host, worker_state.last_command_id(), wait))
            await asyncio.sleep(0.3)  # the poll is held
            await member.issue([host], "reprobe_paths", {}, "correlator")
            found = await polling
            stop.set()
            await following
            return found, time.monotonic() - started - 0.3

        found, took = await held_poll(follow=False, wait=2.0)
        assert took >= 1.5 and found == []  # never woken: the agent would get it at its next poll
        found, took = await held_poll(follow=True, wait=10.0)
        assert [c.kind for c in found] == ["reprobe_paths"] and took < 1.0, took
    finally:
        worker_state.close()
        member_state.close()


async def test_an_agent_registered_with_one_api_worker_is_known_to_every_member(open_state, monkeypatch):
    """A shared state: the agent registers with the API worker; the correlate member's registry knows it
    (its host actuator may steer it), its peers get its RDMA QP from any worker, and its last_seen
    follows (written in a batch)."""
    from nms.app import agent_registry
    from nms.app.actuators.host import HostRerouteActuator
    from nms.app.agent_registry import AgentRegistry
    from nms.config.models import AgentsConfig, FabricConfig
    from nms.records import Action

    monkeypatch.setattr(agent_registry, "REGISTERED_READ_S", 0.0)
    fab = FabricConfig.model_validate(fabric(1, 2))
    worker_state, member_state = open_state(), open_state()
    try:
        worker, member = (AgentRegistry(fab, AgentsConfig(), s) for s in (worker_state, member_state))
        for r in (worker, member):
            r.share_registrations()
        host, peer = fab.hosts[0].name, fab.hosts[1].name
        nic = fab.hosts[0].nics[0]
        assert member.registered() == {}
        worker.register(host, {"session": "ab", "nics": [{"name": nic.name, "address": nic.address, "qpn": 0x123}]},
                        "ingest")
        assert list(member.registered()) == [host] and member.agents == {}  # known, not registered here
        [entry] = [p for p in member.peers(peer) if p["host"] == host]
        assert entry["agent"] and entry["nics"][0]["qpn"] == 0x123
        action = Action(id=1, kind="host_reroute", element="leaf1:swp1--spine1:swp1", element_kind="link",
                        targets=[host], requested_by="controller", created_ns=T0, updated_ns=T0)
        assert await HostRerouteActuator(member).read(action) == {"hosts": {host: {"agent": True}}}
        first = member.registered()[host].last_seen_ns
        worker.clock = lambda: first + 5 * 10**9
        worker.seen(host)
        assert member.registered()[host].last_seen_ns == first  # not written yet
        assert worker.write_seen() == 1 and worker.write_seen() == 0
        assert member.registered()[host].last_seen_ns == first + 5 * 10**9
    finally:
        worker_state.close()
        member_state.close()


def test_a_bound_token_only_acts_for_its_host(client):
    assert client.post("/agents/h1-1/register", json=REG, headers=bearer(BOUND)).status_code == 200
    assert poll(client, "h1-1", token=BOUND)["commands"] == []
    for method, path in (("POST", "/agents/h1-2/register"), ("GET", "/agents/h1-2/peers"),
                         ("GET", "/agents/h2-1/commands"), ("POST", "/agents/h1-2/commands/1/result"),
                         ("POST", "/agents/nowhere/register")):
        r = client.request(method, path, json={**REG, "status": "done"}, headers=bearer(BOUND))
        assert r.status_code == 403, (path, r.text)
        assert "bound to host 'h1-1'" in r.json()["detail"] and "may not act for host" in r.json()["detail"]
    cmd = send(client, "h1-1")
    poll(client, "h1-1", token=BOUND)
    r = client.post(f"/agents/h1-1/commands/{cmd['id']}/result", json={"status": "done"}, headers=bearer(BOUND))
    assert r.status_code == 200 and r.json()["status"] == "done"
    # scopes do not widen a binding: fleet-wide routes and other hosts stay closed
    assert client.get(f"/agents/h1-1/commands/{cmd['id']}", headers=bearer(BOUND_ADMIN)).status_code == 200
    for method, path in (("GET", "/agents"), ("GET", "/agents/commands"), ("POST", "/agents/commands"),
                         ("POST", "/agents/h1-2/commands")):
        r = client.request(method, path, json={"kind": "reprobe_paths"}, headers=bearer(BOUND_ADMIN))
        assert r.status_code == 403, (path, r.text)
        assert "may use only /agents/h1-1/..." in r.text or "may not act for host 'h1-2'" in r.text, r.text
    metrics = client.get("/metrics", headers=auth("read")).text
    assert 'nms_auth_failures_total{reason="host"} 9.0' in metrics
    # an unbound ingest token may still register and poll as any host
    assert client.post("/agents/h2-2/register", json=REG, headers=auth("ingest")).status_code == 200


def _items() -> dict[str, list[tuple[dict, bool]]]:
    """Per ingest kind: (item, kept for a token bound to h1-1)."""
    path = {"src_nic": "eth0", "dst_nic": "eth0", "path_id": "abc"}
    window = {**path, "window_start": T0, "sent": 10, "received": 10}
    event = {**path, "ts": T0, "state": "down", "reason": "silence"}
    edge = {"method": "ntp", "window_start": T0, "window_s": 2.0, "offset_ns": 5.0, "drift_ppb": 0.0, "bound_ns": 30.0,
            "pure_pairs": 3}
    point = {"measurement": "agent_stats", "fields": {"x": 1}, "ts": T0}
    return {
        "probe_windows": [({**window, "src_host": "h1-1", "dst_host": "h2-1"}, True),
                          ({**window, "src_host": "h2-1", "dst_host": "h1-1"}, False),
                          ({**window, "src_host": "h1-1", "dst_host": "h1-2", "path_id": "def"}, True)],
        "path_events": [({**event, "src_host": "h1-2", "dst_host": "h1-1"}, False),
                        ({**event, "src_host": "h1-1", "dst_host": "h1-2"}, True)],
        "host_nic_samples": [({"host": "h1-1", "nic": "eth0", "ts": T0, "rx_bytes": 1}, True),
                             ({"host": "h2-2", "nic": "eth0", "ts": T0, "rx_bytes": 1}, False)],
        "clock_edges": [({**edge, "host_a": "h1-1", "host_b": "h2-1"}, True),
                        ({**edge, "host_a": "h2-1", "host_b": "h1-1"}, False)],
        "clock_solutions": [({"host": "h1-1", "window_start": T0, "offset_ns": 1.0, "drift_ppb": 0.0, "bound_ns": 1.0},
                             False)],
        "port_samples": [({"device": "leaf1", "port": "swp1", "ts": T0, "in_octets": 1}, False)],
        "port_rates": [({"device": "leaf1", "port": "swp1", "ts": T0, "interval_s": 10.0, "in_bps": 1.0}, False)],
        "points": [({**point, "tags": {"host": "h1-1"}}, True), ({**point, "tags": {"host": "h2-1"}}, False),
                   ({**point, "tags": {}}, False)],
    }


def test_a_bound_token_ingests_only_its_hosts_records(client):
    for kind, items in _items().items():
        r = client.post(f"/ingest/{kind}", json={"items": [i for i, _ in items]}, headers=bearer(BOUND))
        kept = [n for n, (_, ok) in enumerate(items) if ok]
        got = r.json()
        assert r.status_code == (200 if kept else 422), (kind, r.text)
        assert got["accepted"] == len(kept) and [e["index"] for e in got["rejected"]] == [
            n for n in range(len(items)) if n not in kept], (kind, got)
        reasons = " ".join(e["errors"][0] for e in got["rejected"])
        if kind in ("probe_windows", "path_events"):
            assert "src_host: 'h2-1' is not 'h1-1', the host this token is bound to" in reasons or "'h1-2'" in reasons
        elif kind == "clock_solutions":
            assert "computed by the service" in reasons
        elif kind.startswith("port_"):
            assert "switch data" in reasons
        elif kind == "points":
            assert "tags.host: 'h2-1' is not 'h1-1'" in reasons and "tags.host: missing" in reasons
    rows = client.post("/telemetry/query", json={"measurement": "probe_window", "start": 0, "end": T0 + 1},
                       headers=auth("read")).json()["series"]
    assert sorted(s["tags"]["src_host"] for s in rows) == ["h1-1", "h1-1"]  # only its own were stored


def test_a_bound_token_may_not_write_job_metadata(client):
    job = {"id": "job-1", "hosts": ["h1-1"], "start": T0}
    r = client.post("/jobs", json=job, headers=bearer(BOUND))
    assert r.status_code == 403 and "bound to host 'h1-1'" in r.json()["detail"]
    assert client.post("/jobs", json=job, headers=auth("ingest")).status_code == 201
    assert client.delete("/jobs/job-1", headers=bearer(BOUND)).status_code == 403
    assert client.get("/jobs/job-1", headers=auth("read")).status_code == 200  # still there


def test_an_unbound_ingest_token_keeps_todays_behaviour(client):
    for kind, items in _items().items():
        r = client.post(f"/ingest/{kind}", json={"items": [i for i, _ in items]}, headers=auth("ingest"))
        assert r.json() == {"accepted": len(items), "rejected": []}, (kind, r.text)


# --- the agent side ----------------------------------------------------------------------------------------


def test_the_agent_reports_each_commands_outcome():
    calls = []
    prober = SimpleNamespace(trace=lambda: calls.append("trace"), set_rate=lambda r: calls.append(("rate", r)))
    agent = SimpleNamespace(stats=defaultdict(int), prober=prober)
    run = lambda command: Agent._command(agent, command)  # noqa: E731
    assert run({"id": 1, "kind": "reprobe_paths"}) == ("done", "tracing every path again")
    assert run({"id": 2, "kind": "set_rate", "args": {"rate": 40}}) == ("done", "probing at 40 exchanges/s per path")
    status, message = run({"id": 3, "kind": "set_rate", "args": {"rate": -1}})
    assert status == "failed" and "bad rate -1" in message
    status, message = run({"id": 4, "kind": "reboot"})
    assert status == "failed" and "unknown command 'reboot'" in message
    assert run({"id": 5, "kind": "refresh_peers"})[0] == "done"
    prober.trace = lambda: 1 / 0
    status, message = run({"id": 6, "kind": "reprobe_paths"})
    assert status == "failed" and "ZeroDivisionError" in message
    assert calls == ["trace", ("rate", 40.0)] and agent.stats["commands"] == 6 and agent.stats["commands_failed"] == 3


class StubService:
    """The service as the control thread sees it, scripted: command answers, restarts, an outage."""

    def __init__(self):
        self.instance, self.last_id, self.down = "one", 0, False
        self.answers: queue.Queue = queue.Queue()
        self.afters: list[int] = []
        self.posted: list[tuple[int, dict]] = []
        self.registered_at: list[int] = []  # polls made before each registration

    def register(self, info):
        self.registered_at.append(len(self.afters))
        return {"instance": self.instance, "peers": [], "command_wait_max": 1}

    def peers(self):
        return {"peers": []}

    def commands(self, after, wait):
        self.afters.append(after)
        try:
            commands = self.answers.get(timeout=0.05)
        except queue.Empty:
            commands = []
        return {"instance": self.instance, "last_id": self.last_id, "commands": commands}

    def post_result(self, command_id, body):
        if self.down:
            raise httpx.ConnectError("service away")
        self.posted.append((command_id, body))
        return httpx.Response(409 if command_id == 99 else 200)


def _until(check, timeout=5.0):
    wait_until(check, timeout, 0.01, what="the control thread")


def test_the_control_thread_posts_results_and_keeps_its_cursor(tmp_path):
    service, inbox = StubService(), queue.Queue()
    control = Control(service, {}, 3600, tmp_path, inbox)

    def probe_loop():  # what Agent._drain_inbox does: outcome to control.result, never blocking
        while True:
            kind, command = inbox.get()
            if kind == "command":
                control.result(command["id"], "done" if command["id"] != 7 else "failed", f"did {command['id']}")

    threading.Thread(target=probe_loop, daemon=True).start()
    control.start()
    try:
        service.last_id = 5
        service.answers.put([{"id": 5, "kind": "reprobe_paths", "args": {}}])
        _until(lambda: service.posted)
        assert service.posted == [(5, {"status": "done", "message": "did 5"})]
        _until(lambda: service.afters[-1] == 5)
        service.instance = "two"  # the service restarted: register again, cursor kept
        _until(lambda: len(service.registered_at) == 2 and len(service.afters) > service.registered_at[1])
        assert service.afters[service.registered_at[1]] == 5
        service.last_id = 2  # ... with its state reset: poll from 0
        _until(lambda: service.afters[-1] == 0)
        service.last_id, service.down = 7, True  # results wait while the service is away
        service.answers.put([{"id": 7, "kind": "set_rate", "args": {"rate": 0}}])
        _until(lambda: service.afters[-1] == 7)
        time.sleep(0.2)
        assert len(service.posted) == 1
        service.down = False
        _until(lambda: len(service.posted) == 2)
        assert service.posted[1] == (7, {"status": "failed", "message": "did 7"})
        service.last_id = 99  # a refused result (409) is dropped, not retried forever
        service.answers.put([{"id": 99, "kind": "reprobe_paths", "args": {}}])
        _until(lambda: len(service.posted) == 3)
        time.sleep(0.2)
        assert len(service.posted) == 3 and not control._unsent
    finally:
        control.stop()
        control.join(5)


# --- `nms agents` ------------------------------------------------------------------------------------------


class _Via:
    """The CLI's HTTP client, sending through the test app."""

    def __init__(self, client, headers):
        self.client, self.headers = client, headers

    def request(self, method, path, **kwargs):
        return self.client.request(method, path, headers=self.headers, **kwargs)


def test_cli(client, monkeypatch):
    def init(self, url, token, timeout=30.0, verify=True):
        self.url, self._http = url, _Via(client, {"Authorization": f"Bearer {token}"} if token else {})

    monkeypatch.setattr(cli_client.ApiClient, "__init__", init)
    runner = CliRunner(env={"COLUMNS": "200"})
    nms = lambda *args, token=TOKENS["admin"]: runner.invoke(cli, [*args, "--token", token])  # noqa: E731
    client.post("/agents/h1-1/register", json=REG, headers=auth("ingest"))
    out = nms("agents", "list")
    assert out.exit_code == 0 and "h1-1" in out.output and "eth0=10.1.0.1" in out.output and "1 agents" in out.output
    out = nms("agents", "send", "h1-1", "set_rate", "--rate", "40")
    assert out.exit_code == 0, out.output
    assert "to h1-1: pending" in out.output
    first = poll(client, "h1-1")["commands"][0]
    assert first["args"] == {"rate": 40.0} and first["by"] == "t-admin"

    def agent():  # answers the next command it gets
        got = client.get(f"/agents/h1-1/commands?after={first['id']}&wait=2", headers=auth("ingest")).json()
        for c in got["commands"]:
            client.post(f"/agents/h1-1/commands/{c['id']}/result", json={"status": "failed", "message": "no paths yet"},
                        headers=auth("ingest"))

    answering = threading.Thread(target=agent)
    answering.start()
    out = nms("agents", "send", "h1-1", "reprobe_paths", "--wait", "5")
    answering.join(5)
    assert out.exit_code == 1 and "failed" in out.output and "no paths yet" in out.output, out.output
    out = nms("agents", "commands", "--host", "h1-1")
    assert out.exit_code == 0 and "delivered" in out.output and "failed" in out.output
    out = nms("agents", "commands", "--status", "failed", "--json")
    assert out.exit_code == 0 and '"message": "no paths yet"' in out.output and '"delivered"' not in out.output
    out = nms("agents", "show", "h1-1", str(first["id"]))
    assert out.exit_code == 0 and '"status": "delivered"' in out.output and '"rate": 40.0' in out.output
    out = nms("agents", "send", "h1-1,h1-2", "refresh_peers")
    assert out.exit_code == 0 and "to h1-1: pending" in out.output and "to h1-2: pending" in out.output
    out = nms("agents", "commands", token=TOKENS["ingest"])
    assert out.exit_code == 1 and "403" in out.output


# --- configuration: token hosts, the lab's per-host agent tokens, `nms token create --host` ----------------


def test_a_token_bound_to_a_host_outside_the_inventory_is_a_config_error(tmp_path):
    from nms.config import ConfigError

    tokens = [{"name": "agent-h9", "scopes": ["ingest"], "host": "h9", "token": BOUND}]
    with pytest.raises(ConfigError) as e:
        make_config(tmp_path, fabric=fabric(1, 1), api={"tokens": tokens})
    assert any("token 'agent-h9' is bound to host 'h9', which is not in fabric.hosts" in str(i) for i in e.value.issues)


def test_the_lab_gives_each_agent_its_own_bound_token(tmp_path):
    from lab import agent_procs as lab_agents
    from lab.inventory import agent_token_file, new_snmp_credentials, write_config
    from lab.state import LabDir
    from lab.topology import Spec, plan
    from nms.config import load_config

    topo, lab = plan(Spec()), LabDir(tmp_path / "lab")
    lab.run_dir.mkdir(parents=True)
    write_config(topo, lab, new_snmp_credentials())
    cfg = load_config(lab.config)  # the service's config, as `nms serve` reads it
    hosts = sorted(n.name for n in topo.by_role("host"))
    bound = {t.host: t for t in cfg.api.tokens if t.host is not None}
    assert sorted(bound) == hosts and all(t.scopes == ["ingest"] and t.name == f"agent-{h}" for h, t in bound.items())
    secrets = set()
    for host in hosts:  # each agent's config reads the file its host's service-side entry reads
        path = agent_token_file(lab, host)
        conf = lab_agents.config_dict(topo, lab, host, "http://198.18.0.1:8080", None)
        assert conf["service"]["token"] == f"${{file:{path}}}" and path.stat().st_mode & 0o077 == 0
        secrets.add(bound[host].token.get_secret_value())
        assert path.read_text().strip() == bound[host].token.get_secret_value()
    assert len(secrets) == len(hosts)


def test_token_create_with_a_host():
    runner = CliRunner()
    out = runner.invoke(cli, ["token", "create", "--name", "agent-h1", "--host", "h1"])
    assert out.exit_code == 0, out.output
    assert "scopes: [ingest]\n    host: h1\n    hash: sha256:" in out.output  # agent tokens default to ingest
    out = runner.invoke(cli, ["token", "create", "--name", "noc"])
    assert "scopes: [read]\n    hash: sha256:" in out.output and "host:" not in out.output
    bad = runner.invoke(cli, ["token", "create", "--name", "a", "--host", "not a name"])
    assert bad.exit_code == 2 and "host:" in bad.output
