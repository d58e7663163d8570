"""Durable, retrying delivery against a real HTTP receiver: retries, Retry-After, permanent
failures, dedup across submits and restarts, ordering, isolation of a slow sink, filters, secrets,
and the /notifications API."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from email.utils import formatdate

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nms.app.api import create_app
from nms.app.notify.dispatcher import retry_after_s
from nms.app.service import Service
from tests._notify import T0, event, incident, notifications, until
from tests.helpers import auth, make_config

JSON = {"Content-Type": "application/json"}




def hook(rx, path="/hook", name="hook", **kw) -> dict:
    return {"name": name, "kind": "webhook", "url": rx.url(path), **kw}


async def test_retries_500_then_delivers(make, rx):
    rx.script["/hook"] = [(500, {}, b"oops", 0.0), (502, {}, b"", 0.0), (200, JSON, b"{}", 0.0)]
    notifier = make(notifications([hook(rx)]))
    await notifier.start()
    notifier.submit(event("opened"))
    d = await until(lambda: notifier.deliveries(state="delivered"))
    assert d[0].attempts == 3 and d[0].last_status == 200 and d[0].delivered_ns is not None
    reqs = rx.at("/hook")
    assert len(reqs) == 3
    assert len({r.json()["delivery_id"] for r in reqs}) == 1  # one delivery, retried
    assert reqs[2].t - reqs[1].t >= 0.05  # backoff doubled: ~0.1 s after the second try


async def test_429_retry_after_is_honoured(make, rx):
    rx.script["/hook"] = [(429, {"Retry-After": "1"}, b"slow down", 0.0), (200, JSON, b"{}", 0.0)]
    notifier = make(notifications([hook(rx)], backoff_initial=0.01))
    await notifier.start()
    notifier.submit(event("opened"))
    await until(lambda: notifier.deliveries(state="delivered"))
    first, second = rx.at("/hook")
    assert 0.95 <= second.t - first.t < 2.0


async def test_retry_after_is_capped(make, rx):
    rx.script["/hook"] = [(503, {"Retry-After": "3600"}, b"", 0.0), (200, JSON, b"{}", 0.0)]
    notifier = make(notifications([hook(rx)], max_retry_after=0.3))
    await notifier.start()
    notifier.submit(event("opened"))
    await until(lambda: notifier.deliveries(state="delivered"))
    first, second = rx.at("/hook")
    assert 0.25 <= second.t - first.t < 1.5


def test_retry_after_forms():
    now = time.time()
    assert retry_after_s("7", now) == 7.0
    assert retry_after_s(" 0 ", now) == 0.0
    assert 28 <= retry_after_s(formatdate(now + 30, usegmt=True), now) <= 31
    assert retry_after_s(formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None and retry_after_s("-5", now) is None


async def test_400_is_a_permanent_failure(make, rx):
    rx.script["/hook"] = [(400, JSON, b'{"error": "invalid  payload:\n field x"}', 0.0)]
    notifier = make(notifications([hook(rx)]))
    await notifier.start()
    notifier.submit(event("opened"))
    [d] = await until(lambda: notifier.deliveries(state="failed"))
    assert d.attempts == 1 and d.last_status == 400 and d.next_attempt_ns is None
    assert d.last_error.startswith("HTTP 400") and "invalid payload: field x" in d.last_error
    await asyncio.sleep(0.2)
    assert len(rx.at("/hook")) == 1


async def test_gives_up_after_max_attempts(make, rx):
    rx.script["/hook"] = [(503, {}, b"busy", 0.0)]
    notifier = make(notifications([hook(rx)], max_attempts=3, backoff_initial=0.01))
    await notifier.start()
    notifier.submit(event("opened"))
    [d] = await until(lambda: notifier.deliveries(state="failed"))
    assert d.attempts == 3 and d.last_status == 503 and "3 attempts" in d.last_error
    assert len(rx.at("/hook")) == 3


async def test_connection_refused_is_retried(make):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    notifier = make(notifications([{"name": "dead", "kind": "webhook", "url": f"http://127.0.0.1:{port}/x"}],
                                  max_attempts=2, backoff_initial=0.01))
    await notifier.start()
    notifier.submit(event("opened"))
    [d] = await until(lambda: notifier.deliveries(state="failed"))
    assert d.attempts == 2 and d.last_status is None and "Connect" in d.last_error


async def test_same_event_twice_is_sent_once_updates_each_once(make, rx):
    notifier = make(notifications([hook(rx)]))
    inc = incident(1)
    up1 = event("updated", inc.model_copy(update={"updates": 1, "updated_ns": T0 + 1}))
    up2 = event("updated", inc.model_copy(update={"updates": 2, "updated_ns": T0 + 2}))
    for ev in (event("opened", inc), event("opened", inc), up1, up1, up2, event("resolved", inc),
               event("resolved", inc)):
        notifier.submit(ev)
    await notifier.start()
    notifier.submit(event("opened", inc))
    await until(lambda: len(notifier.deliveries(state="delivered")) == 4)
    await asyncio.sleep(0.2)
    sent = [(r.json()["event"], r.json()["incident"]["updates"]) for r in rx.at("/hook")]
    assert sent == [("opened", 0), ("updated", 1), ("updated", 2), ("resolved", 0)]


async def test_restart_resumes_pending_and_never_resends_delivered(make, rx):
    failing = {"on": True}

    def responder(path, body):
        if json.loads(body)["incident"]["id"] == 2 and failing["on"]:
            return 500, {}, b"down", 0.0
        return 200, JSON, b"{}", 0.0

    rx.responder = responder
    config = notifications([hook(rx)], backoff_initial=0.3, backoff_max=0.3)
    first = make(config)
    await first.start()
    first.submit(event("opened", incident(1)))
    first.submit(event("opened", incident(2)))
    await until(lambda: first.deliveries(state="delivered") and first.deliveries(incident_id=2)[0].attempts >= 1)
    await first.stop()

    failing["on"] = False
    second = make(config)  # same SQLite file
    second.submit(event("opened", incident(1)))  # the incident manager replays after a restart
    second.submit(event("opened", incident(2)))
    await second.start()
    await until(lambda: len(second.deliveries(state="delivered")) == 2)
    await asyncio.sleep(0.2)
    ids = [r.json()["incident"]["id"] for r in rx.at("/hook")]
    assert ids.count(1) == 1 and ids.count(2) == 2  # 2: one failed try before, one after the restart
    assert len(second.deliveries()) == 2


async def test_resolve_never_overtakes_its_trigger(make, rx):
    rx.script["/hook"] = [(500, {}, b"", 0.0), (500, {}, b"", 0.0), (200, JSON, b"{}", 0.0)]
    notifier = make(notifications([hook(rx)], backoff_initial=0.02))
    inc = incident(9)
    notifier.submit(event("opened", inc))
    notifier.submit(event("resolved", inc))
    await notifier.start()
    await until(lambda: len(notifier.deliveries(state="delivered")) == 2)
    events = [r.json()["event"] for r in rx.at("/hook")]
    assert events == ["opened", "opened", "opened", "resolved"]


async def test_slow_sink_does_not_delay_a_fast_one(make, rx):
    rx.script["/slow"] = [(200, JSON, b"{}", 1.0)]
    notifier = make(notifications([hook(rx, "/slow", "slow"), hook(rx, "/fast", "fast")]))
    await notifier.start()
    started = time.monotonic()
    for i in range(1, 4):
        notifier.submit(event("opened", incident(i)))
    await until(lambda: len(notifier.deliveries(sink="fast", state="delivered")) == 3)
    assert time.monotonic() - started < 0.8  # the slow sink takes 1 s per request
    assert len(notifier.deliveries(sink="slow", state="pending")) == 3
    await until(lambda: len(notifier.deliveries(sink="slow", state="delivered")) == 3, timeout=5)


async def test_filters_and_follow_up_of_a_sent_incident(make, rx):
    sink = hook(rx, min_severity="major", kinds=["link_down", "congestion"])
    notifier = make(notifications([sink]))
    await notifier.start()
    notifier.submit(event("opened", incident(1, severity="warning")))  # below min_severity
    notifier.submit(event("opened", incident(2, kind="nic_down")))  # not one of the kinds
    crit = incident(3, severity="critical")
    notifier.submit(event("opened", crit))
    # it calmed down to a warning before it resolved: the resolve still follows its trigger
    notifier.submit(event("resolved", crit.model_copy(update={"severity": "warning"})))
    await until(lambda: len(notifier.deliveries(state="delivered")) == 2)
    await asyncio.sleep(0.1)
    assert [(r.json()["incident"]["id"], r.json()["event"]) for r in rx.at("/hook")] == [(3, "opened"), (3, "resolved")]


async def test_submit_from_other_threads(make, rx):
    notifier = make(notifications([hook(rx)]))
    await notifier.start()
    threads = [threading.Thread(target=notifier.submit, args=(event("opened", incident(i)),)) for i in range(1, 21)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    await until(lambda: len(notifier.deliveries(state="delivered", limit=100)) == 20)
    assert sorted(r.json()["incident"]["id"] for r in rx.at("/hook")) == list(range(1, 21))


async def test_submit_never_raises(make, rx):
    notifier = make(notifications([hook(rx)]))
    notifier.submit(None)  # type: ignore[arg-type]  # garbage from a buggy caller: logged, not raised
    await notifier.stop()
    notifier.submit(event("opened"))  # after stop: logged, not raised


SECRETS = {"hmac": "hmac-secret-5f1d2c3b4a", "pd": "PDROUTINGKEY0123456789abcdefABCD", "sn": "sn-pass-8b7a6c5d4e",
           "token": "querytoken-77aa88bb99", "user": "userinfo-pass-123abc", "slack": "SLACKWEBHOOKSECRETXYZ"}


def echo(path, body):  # a receiver that rejects and echoes the request body (routing key included)
    return 400, {}, b"rejected: " + body, 0.0


async def test_secrets_never_in_logs_rows_or_api(tmp_path, rx, caplog):
    caplog.set_level(logging.DEBUG)
    rx.responder = echo
    sinks = [
        hook(rx, "/signed", "signed", secret=SECRETS["hmac"]),
        {"name": "pd", "kind": "pagerduty", "url": rx.url("/pd"), "secret": SECRETS["pd"]},
        {"name": "snow", "kind": "servicenow", "url": rx.url("/sn"), "username": "u", "secret": SECRETS["sn"]},
        {"name": "q", "kind": "webhook", "url": rx.url(f"/q?token={SECRETS['token']}")},
        {"name": "ui", "kind": "webhook", "url": f"http://nms:{SECRETS['user']}@127.0.0.1:{rx.port}/ui"},
        {"name": "chat", "kind": "slack", "url": rx.url(f"/services/T1/B2/{SECRETS['slack']}")},
    ]
    config = make_config(tmp_path, site="lab", notifications={"sinks": sinks, "backoff_initial": 0.01})
    service = Service(config)
    with TestClient(create_app(service)) as client:
        service.notifier.submit(event("opened"))  # from this thread, the app's loop runs in another
        assert client.get("/notifications/deliveries").status_code == 401

        def failed():
            r = client.get("/notifications/deliveries", params={"state": "failed"}, headers=auth("read"))
            return r.json() if len(r.json()) == len(sinks) else None

        rows = await until(failed)
        assert {r["sink"] for r in rows} == {s["name"] for s in sinks}
        assert all(r["last_status"] == 400 and r["last_error"].startswith("HTTP 400") for r in rows)
        pd_row = next(r for r in rows if r["sink"] == "pd")
        assert "routing_key" in pd_row["last_error"] and "***" in pd_row["last_error"]  # echoed, scrubbed
        one = client.get("/notifications/deliveries", params={"incident": 1, "sink": "pd"}, headers=auth("read"))
        assert [r["sink"] for r in one.json()] == ["pd"]
        assert client.get("/notifications/deliveries", params={"incident": 2}, headers=auth("read")).json() == []
        sinks_out = client.get("/notifications/sinks", headers=auth("read"))
        assert sinks_out.status_code == 200
        by_name = {s["name"]: s for s in sinks_out.json()}
        assert by_name["q"]["url"] == rx.url("/q") and by_name["ui"]["url"] == rx.url("/ui")
        assert by_name["chat"]["url"] == f"http://127.0.0.1:{rx.port}/…"
        assert by_name["pd"]["failed"] == 1 and by_name["pd"]["kind"] == "pagerduty"
        metrics = client.get("/metrics", headers=auth("read")).text
        assert 'nms_notification_deliveries{sink="pd",state="failed"} 1.0' in metrics
        assert 'nms_notification_attempts_total{result="failed",sink="pd"} 1.0' in metrics
        texts = [sinks_out.text, json.dumps(rows), metrics, caplog.text,
                 client.get("/openapi.json").text, repr(config.notifications)]
        texts += [repr(d) for d in service.notifier.deliveries()]
    db = b"".join(p.read_bytes() for p in tmp_path.glob("state.sqlite*"))  # the outbox's table, its WAL too
    assert b"CREATE TABLE deliveries" in db
    for name, secret in SECRETS.items():
        for text in texts:
            assert secret not in text, name
        assert secret.encode() not in db, name
    # the receiver did get them: they were used, not lost
    assert SECRETS["pd"] in rx.at("/pd")[0].body.decode()
    assert any(SECRETS["token"] in r.path for r in rx.requests)


def test_sinks_api_needs_read_scope(tmp_path):
    service = Service(make_config(tmp_path))
    with TestClient(create_app(service)) as client:
        assert client.get("/notifications/sinks").status_code == 401
        assert client.get("/notifications/sinks", headers=auth("ingest")).status_code == 403
        assert client.get("/notifications/sinks", headers=auth("read")).json() == []
        assert (
            client.get("/notifications/deliveries", params={"state": "bogus"}, headers=auth("read")).status_code == 422
        )


async def test_stop_ends_the_worker_even_when_a_wake_up_comes_with_the_cancel(make, rx):
    """The worker waits in asyncio.wait_for with a timeout (RESCAN_S); on Python 3.11 a cancel that
    comes in the same loop iteration as a wake-up can be dropped by it, and a stop that only cancelled
    then waited for ever (2 of 6 runs of the notification tests hung in a fresh-clone run)."""
    for _ in range(50):
        notifier = make(notifications([hook(rx)]))
        await notifier.start()
        await asyncio.sleep(0)
        notifier._poke()  # a wake-up in flight as stop() cancels
        stopping = asyncio.ensure_future(notifier.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        assert done, "stop() did not end"


async def test_attempt_cut_by_shutdown_stays_pending_and_resumes(make, rx):
    rx.script["/hook"] = [(200, JSON, b"{}", 2.0), (200, JSON, b"{}", 0.0)]
    first = make(notifications([hook(rx)]))
    await first.start()
    first.submit(event("opened"))
    await until(lambda: rx.at("/hook"))
    await first.stop(grace=0.1)  # the receiver is still sleeping on it
    second = make(notifications([hook(rx)]))
    [d] = second.deliveries()
    assert d.state == "pending" and d.attempts == 0
    await second.start()
    [d] = await until(lambda: second.deliveries(state="delivered"))
    assert d.attempts == 1 and len(rx.at("/hook")) == 2  # at least once: the receiver dedups on delivery_id


THIRD_PARTY = """
from nms.app.notify.base import Sink


class ChatOpsSink(Sink):
    kind = "chatops"

    def render(self, event, delivery_id, now_ns):
        inc = event.incident
        return self.post({"room": self.config.options["room"], "text": f"[{event.event}] {inc.summary}",
                          "delivery_id": delivery_id})
"""


async def test_a_third_party_notifier_is_found_by_its_entry_point(make, rx, tmp_path, monkeypatch):
    """A package that declares an `nms.notifiers` entry point is configured by its kind, with its
    own options (a real dist-info on sys.path: what `pip install` leaves behind)."""
    (tmp_path / "nms_chatops.py").write_text(THIRD_PARTY)
    info = tmp_path / "nms_chatops-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nms-chatops\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nms.notifiers]\nchatops = nms_chatops:ChatOpsSink\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sink = {"name": "ops", "kind": "chatops", "url": rx.url("/chat"), "options": {"room": "noc-fabric"}}
    notifier = make(notifications([sink]))
    await notifier.start()
    notifier.submit(event("opened"))
    [d] = await until(lambda: notifier.deliveries(state="delivered"))
    [req] = rx.at("/chat")
    assert req.json() == {"room": "noc-fabric", "text": f"[opened] {incident().summary}", "delivery_id": d.id}


def test_an_unknown_notifier_kind_names_the_field_and_what_is_installed():
    with pytest.raises(ValidationError) as e:
        notifications([{"name": "x", "kind": "teams", "url": "http://127.0.0.1:9/x"}])
    text = str(e.value)
    assert "sinks.0.kind" in text and "no notifier of kind 'teams'" in text and "pagerduty" in text
    with pytest.raises(ValidationError, match="options are for third-party notifiers"):
        notifications([{"name": "x", "kind": "webhook", "url": "http://127.0.0.1:9/x", "options": {"a": 1}}])
