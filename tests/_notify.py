"""Shared pieces of the notification tests: a real HTTP receiver on 127.0.0.1 that
records every request and answers as scripted, incident events, and a Notifier factory."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nms.app.notify import Notifier
from nms.app.notify.outbox import Outbox
from nms.config.models import NotificationsConfig
from nms.records import Incident, IncidentEvent
from nms.state import StateStore

T0 = 1_700_000_000 * 10**9


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes
    t: float  # time.monotonic() when it arrived

    def json(self):
        return json.loads(self.body)


# a responder: (path, body) -> (status, headers, body, delay seconds)
Responder = Callable[[str, bytes], tuple[int, dict[str, str], bytes, float]]


class Receiver:
    """ThreadingHTTPServer on an ephemeral port. Per path, `script[path]` is a list of answers
    (status, headers, body, delay) used in turn, the last one repeating; default 200 {}."""

    def __init__(self):
        self.requests: list[Seen] = []
        self.script: dict[str, list[tuple[int, dict, bytes, float]]] = {}
        self.responder: Responder | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                status, headers, answer, delay = receiver._answer(seen)
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def _answer(self, seen: Seen):
        with self._lock:
            self.requests.append(seen)
            if self.responder is not None:
                return self.responder(seen.path, seen.body)
            steps = self.script.get(seen.path)
            if not steps:
                return 200, {"Content-Type": "application/json"}, b"{}", 0.0
            return steps.pop(0) if len(steps) > 1 else steps[0]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if r.path.split("?")[0] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def incident(id: int = 1, **kw) -> Incident:
    doc = dict(id=id, dedup_key="link:leaf1:swp1--spine1:swp1", kind="link_down",
               element="leaf1:swp1--spine1:swp1", element_kind="link", severity="critical",
               summary="link leaf1:swp1--spine1:swp1 is down (both ends oper down)", confidence=0.97,
               evidence={"oper_status": "down", "loss_pct": 100.0}, paths=["h1:eth0>h2:eth0/3", "h2:eth0>h1:eth0/7"],
               jobs=["train-llama-70b"], opened_ns=T0, updated_ns=T0, last_seen_ns=T0)
    doc.update(kw)
    return Incident(**doc)


def event(kind: str, inc: Incident | None = None, ts: int | None = None, **kw) -> IncidentEvent:
    inc = inc or incident(**kw)
    if kind == "resolved" and inc.state != "resolved":
        inc = inc.model_copy(update={"state": "resolved", "resolved_ns": T0 + 60 * 10**9})
    if kind == "acknowledged" and inc.acknowledged_by is None:
        inc = inc.model_copy(update={"acknowledged_by": "noc-alice", "acknowledged_ns": T0 + 10**9})
    return IncidentEvent(event=kind, ts=ts if ts is not None else inc.updated_ns, incident=inc)


def notifications(sinks: list[dict], **kw) -> NotificationsConfig:
    doc = {"backoff_initial": 0.05, "backoff_max": 0.2, "max_attempts": 5, "sinks": sinks}
    doc.update(kw)
    return NotificationsConfig.model_validate(doc)


class Notifiers:
    """Creates notifiers on one state store file (each on its own connection, as a process restarted,
    or another member, has) and stops whatever is left at teardown."""

    def __init__(self, path: Path):
        self.path = path
        self.made: list[Notifier] = []
        self.states: list[StateStore] = []

    def __call__(self, config: NotificationsConfig, site: str = "lab", member: str = "member-1") -> Notifier:
        state = StateStore(self.path)
        self.states.append(state)
        n = Notifier(config, Outbox(state.database, member), site)
        self.made.append(n)
        return n

    async def close(self):
        for n in self.made:
            await n.stop()
        for state in self.states:
            state.close()


async def until(cond: Callable[[], object], timeout: float = 5.0, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)


@pytest.fixture(name="rx")
def notify_rx():
    """A real HTTP receiver on 127.0.0.1 that records requests."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(name="make")
async def notify_make(tmp_path):
    """Notifier factory on one outbox file; closes them all."""
    n = Notifiers(tmp_path / "state.sqlite")
    yield n
    await n.close()

