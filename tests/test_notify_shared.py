"""The notification outbox in the state store (nms/app/notify/outbox.py), shared by a cluster's members:
two members on one outbox send every delivery once; the delivery a dead member had claimed is sent by
another once the claim lapsed; a process's outbox file of before is moved in at start and its pending
deliveries sent. On SQLite and on PostgreSQL (the `open_state` fixture), against a real HTTP receiver."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter

from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.notify import Notifier, dispatcher
from nms.app.notify.outbox import Outbox
from nms.app.service import Service
from tests._notify import event, incident, notifications, until
from tests.helpers import auth, make_config, wait_until


def _hook(rx) -> dict:
    return {"name": "hook", "kind": "webhook", "url": rx.url("/hook")}


async def test_two_members_on_one_outbox_send_each_delivery_once(open_state, rx, monkeypatch):
    monkeypatch.setattr(dispatcher, "RESCAN_S", 0.02)  # both look all the time: every head is contended
    states = [open_state(), open_state()]
    members = [Notifier(notifications([_hook(rx)]), Outbox(s.database, name), "lab")
               for s, name in zip(states, ("member-a", "member-b"))]
    try:
        for m in members:
            await m.start()
        for i in range(1, 31):
            members[i % 2].submit(event("opened", incident(i)))
            members[(i + 1) % 2].submit(event("opened", incident(i)))  # the same event from both: queued once
        await until(lambda: len(members[0].deliveries(state="delivered", limit=100)) == 30, timeout=20)
        sent = Counter(r.json()["incident"]["id"] for r in rx.at("/hook"))
        assert sent == Counter(range(1, 31))  # each once, none lost
        assert {d.attempts for d in members[1].deliveries(limit=100)} == {1}
    finally:
        for m in members:
            await m.stop()
        for s in states:
            s.close()


async def test_a_dead_members_claimed_delivery_is_sent_by_another_once_the_claim_lapsed(open_state, rx):
    state = open_state()
    dead = Outbox(state.database, "member-dead")
    [delivery_id] = dead.add(event("opened", incident(7)), [("hook", "webhook", True)], time.time_ns())
    lapses, lapses_mono = time.time_ns() + 10**9, time.monotonic() + 1.0
    assert dead.claim(delivery_id, time.time_ns(), lapses)  # claimed for an attempt, then the member died
    other = Notifier(notifications([_hook(rx)]), Outbox(state.database, "member-b"), "lab")
    try:
        await other.start()
        assert not Outbox(state.database, "member-c").claim(delivery_id, time.time_ns(), lapses)
        [sent] = await until(lambda: rx.at("/hook"), timeout=10)
        assert sent.t >= lapses_mono - 0.05 and sent.json()["incident"]["id"] == 7
        [d] = await until(lambda: other.deliveries(state="delivered"))
        assert d.attempts == 1
    finally:
        await other.stop()
        state.close()


async def test_a_member_without_a_sink_leaves_the_others_deliveries_alone(open_state, rx):
    """A process's own outbox fails the pending deliveries of a sink it no longer configures; a shared
    one must not: a member configured with other sinks (or none) may start while they wait."""
    state = open_state()
    member = Outbox(state.database, "member-a")
    [delivery_id] = member.add(event("opened", incident(3)), [("hook", "webhook", True)], time.time_ns())
    member.claim(delivery_id, time.time_ns(), time.time_ns() + 10 * 10**9)  # member-a sends it now
    other = Notifier(notifications([{"name": "chat", "kind": "webhook", "url": rx.url("/chat")}]),
                     Outbox(state.database, "member-b"), "lab")  # another sink, not `hook`
    try:
        await other.start()
        [d] = other.deliveries()
        expected = "pending" if member.shared else "failed"  # SQLite: one process, its sink is gone
        assert d.state == expected, (state.backend, d)
    finally:
        await other.stop()
        state.close()


_OLD_OUTBOX = (  # nms/app/notify/outbox.py before the outbox moved into the state store
    "CREATE TABLE deliveries (id INTEGER PRIMARY KEY AUTOINCREMENT, dedup TEXT NOT NULL UNIQUE, "
    "incident_id INTEGER NOT NULL, event TEXT NOT NULL, sink TEXT NOT NULL, sink_kind TEXT NOT NULL, "
    "state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created_ns INTEGER NOT NULL, "
    "last_attempt_ns INTEGER, next_attempt_ns INTEGER, delivered_ns INTEGER, last_status INTEGER, "
    "last_error TEXT, body TEXT NOT NULL)")


def test_an_outbox_file_of_before_is_moved_in_and_its_pending_deliveries_sent(tmp_path, rx):
    now = time.time_ns()
    old = sqlite3.connect(tmp_path / "notifications.sqlite")
    old.execute(_OLD_OUTBOX)
    for inc_id, state, delivered in ((1, "delivered", now - 10**9), (2, "pending", None)):
        body = event("opened", incident(inc_id)).model_dump_json()
        old.execute("INSERT INTO deliveries (dedup, incident_id, event, sink, sink_kind, state, attempts, created_ns, "
                    "next_attempt_ns, delivered_ns, body) VALUES (?, ?, 'opened', 'hook', 'webhook', ?, ?, ?, ?, ?, ?)",
                    (f"{inc_id}|opened|hook", inc_id, state, int(delivered is not None), now - 2 * 10**9, now - 10**9,
                     delivered, body))
    old.commit()
    old.close()
    service = Service(make_config(tmp_path, notifications={"sinks": [_hook(rx)]}))
    assert not (tmp_path / "notifications.sqlite").exists() and (tmp_path / "notifications.sqlite.imported").exists()
    with TestClient(create_app(service)) as client:
        wait_until(lambda: rx.at("/hook"), 10, 0.05, what="the pending delivery of before")
        rows = wait_until(lambda: [d for d in client.get("/notifications/deliveries", headers=auth("read")).json()
                                   if d["state"] == "delivered"][1:] and
                          client.get("/notifications/deliveries", headers=auth("read")).json(), 10, 0.05,
                          what="both delivered")
    assert [(d["incident_id"], d["state"]) for d in rows] == [(2, "delivered"), (1, "delivered")]
    assert [r.json()["incident"]["id"] for r in rx.at("/hook")] == [2]  # the delivered one is not sent again
