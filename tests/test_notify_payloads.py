"""Notification sinks against a real HTTP receiver: the payload shape of every kind."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time

from nms.app.notify import NOTIFIER_GROUP
from nms.app.plugins import load_plugin
from tests._notify import T0, event, incident, notifications, until

KINDS = ["webhook", "pagerduty", "slack", "alertmanager", "servicenow"]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")




def test_every_kind_is_an_entry_point():
    for kind in KINDS:
        cls = load_plugin(NOTIFIER_GROUP, kind)
        assert cls.kind == kind


async def send(make, rx, sink: dict, *events, n: int | None = None, **cfg):
    notifier = make(notifications([sink], **cfg))
    await notifier.start()
    for ev in events:
        notifier.submit(ev)
    await until(lambda: len(rx.at(sink["url"].split(str(rx.port))[1])) >= (n or len(events)))
    await until(lambda: not notifier.deliveries(state="pending"))
    return notifier


def verify(secret: str, headers: dict, body: bytes) -> bool:
    ts = headers["x-nms-timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get("x-nms-signature", ""))


async def test_webhook_signed_json(make, rx):
    secret = "whsec-0123456789abcdef"
    ev = event("opened")
    notifier = await send(make, rx, {"name": "hook", "kind": "webhook", "url": rx.url("/hook"), "secret": secret}, ev)
    [req] = rx.at("/hook")
    doc = req.json()
    assert doc["event"] == "opened" and doc["site"] == "lab" and doc["sink"] == "hook"
    assert doc["incident"]["id"] == 1 and doc["incident"]["kind"] == "link_down" and doc["ts"] == ev.ts
    [delivery] = notifier.deliveries()
    assert doc["delivery_id"] == delivery.id == int(req.headers["x-nms-delivery"])
    assert delivery.state == "delivered" and delivery.last_status == 200
    assert abs(int(req.headers["x-nms-timestamp"]) - time.time()) < 10
    assert req.headers["content-type"] == "application/json"
    assert verify(secret, req.headers, req.body)
    assert not verify("wrong-secret-0123456789", req.headers, req.body)
    assert not verify(secret, req.headers, req.body.replace(b"critical", b"warning"))  # tampered body
    assert not verify(secret, {**req.headers, "x-nms-timestamp": "1"}, req.body)  # replayed with another ts


async def test_webhook_without_secret_is_unsigned(make, rx):
    await send(make, rx, {"name": "hook", "kind": "webhook", "url": rx.url("/plain")}, event("opened"))
    [req] = rx.at("/plain")
    assert "x-nms-signature" not in req.headers and req.json()["event"] == "opened"


async def test_pagerduty_events_v2(make, rx):
    rx.script["/pd"] = [(202, {"Content-Type": "application/json"},
                         b'{"status":"success","message":"Event processed","dedup_key":"x"}', 0.0)]
    key = "R0UT1NGKEY0123456789abcdef012345"
    inc = incident(7, severity="major", jobs=["j1", "j2"])
    notifier = await send(make, rx, {"name": "pd", "kind": "pagerduty", "url": rx.url("/pd"), "secret": key},
                          event("opened", inc), event("acknowledged", inc), event("resolved", inc),
                          external_url="https://nms.example.net")
    trigger, ack, resolve = [r.json() for r in rx.at("/pd")]
    assert trigger["routing_key"] == key and trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == ack["dedup_key"] == resolve["dedup_key"] == "nms:lab:7"
    assert ack["event_action"] == "acknowledge" and resolve["event_action"] == "resolve"
    p = trigger["payload"]
    assert set(p) >= {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
    assert isinstance(p["summary"], str) and 0 < len(p["summary"]) <= 1024
    assert p["source"] == "leaf1:swp1--spine1:swp1" and p["severity"] == "error" and p["class"] == "link_down"
    assert ISO.match(p["timestamp"]) and p["group"] == "lab"
    cd = p["custom_details"]
    assert cd["evidence"] == {"oper_status": "down", "loss_pct": 100.0} and cd["jobs"] == ["j1", "j2"]
    assert cd["paths_count"] == 2
    assert trigger["client"] == "fabric-nms" and trigger["client_url"] == "https://nms.example.net/incidents/7"
    assert all(d.state == "delivered" and d.last_status == 202 for d in notifier.deliveries())


async def test_pagerduty_summary_is_capped(make, rx):
    long = incident(summary="x" * 1024)
    await send(make, rx, {"name": "pd", "kind": "pagerduty", "url": rx.url("/pd"), "secret": "k" * 32},
               event("opened", long))
    assert len(rx.at("/pd")[0].json()["payload"]["summary"]) == 1024


async def test_slack_incoming_webhook(make, rx):
    inc = incident(3)
    await send(make, rx, {"name": "chat", "kind": "slack", "url": rx.url("/services/T000/B000/XXXXSECRET")},
               event("opened", inc), event("resolved", inc))
    opened, resolved = [r.json() for r in rx.at("/services/T000/B000/XXXXSECRET")]
    assert "link_down" in opened["text"] and "leaf1:swp1--spine1:swp1" in opened["text"]
    header = opened["blocks"][0]
    assert header["type"] == "header" and header["text"]["type"] == "plain_text"
    assert all(w in header["text"]["text"] for w in ("OPENED", "link_down", "critical"))
    flat = str(opened["blocks"])
    assert "leaf1:swp1--spine1:swp1" in flat and "train-llama-70b" in flat and "link leaf1" in flat
    assert "resolved" in resolved["text"].lower() and "RESOLVED" in resolved["blocks"][0]["text"]["text"]


async def test_alertmanager_webhook_v4(make, rx):
    inc = incident(11, severity="minor")
    await send(make, rx, {"name": "am", "kind": "alertmanager", "url": rx.url("/am")},
               event("opened", inc), event("resolved", inc), external_url="https://nms.example.net")
    firing, resolved = [r.json() for r in rx.at("/am")]
    for doc, status in ((firing, "firing"), (resolved, "resolved")):
        assert doc["version"] == "4" and doc["status"] == status and doc["receiver"] == "am"
        assert isinstance(doc["groupKey"], str) and doc["truncatedAlerts"] == 0
        assert doc["externalURL"] == "https://nms.example.net"
        assert doc["groupLabels"]["alertname"] == "link_down"
        [alert] = doc["alerts"]
        assert alert["status"] == status
        assert alert["labels"] == {"alertname": "link_down", "element": "leaf1:swp1--spine1:swp1",
                                   "element_kind": "link", "severity": "minor", "site": "lab", "incident_id": "11"}
        assert doc["commonLabels"] == alert["labels"] and doc["commonAnnotations"] == alert["annotations"]
        assert alert["annotations"]["summary"].startswith("link leaf1")
        assert ISO.match(alert["startsAt"]) and alert["generatorURL"] == "https://nms.example.net/incidents/11"
        assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    assert firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert ISO.match(resolved["alerts"][0]["endsAt"]) and resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    assert firing["alerts"][0]["fingerprint"] == resolved["alerts"][0]["fingerprint"]
    assert firing["groupKey"] == resolved["groupKey"]


async def test_servicenow_event(make, rx):
    inc = incident(5, severity="critical")
    notifier = await send(make, rx, {"name": "snow", "kind": "servicenow", "url": rx.url("/api/global/em/jsonv2"),
                                     "username": "nms-integration", "secret": "sn-password-123456"},
                          event("opened", inc), event("updated", inc.model_copy(update={"updates": 1,
                                                                                        "updated_ns": T0 + 5})),
                          event("resolved", inc))
    reqs = rx.at("/api/global/em/jsonv2")
    opened, updated, resolved = [r.json()["records"][0] for r in reqs]
    assert base64.b64decode(reqs[0].headers["authorization"].split()[1]) == b"nms-integration:sn-password-123456"
    assert opened["source"] == "fabric-nms" and opened["node"] == "leaf1" and opened["type"] == "link_down"
    assert opened["resource"] == "leaf1:swp1--spine1:swp1" and opened["metric_name"] == "link_down"
    assert opened["message_key"] == updated["message_key"] == resolved["message_key"] == "nms:lab:5"
    assert opened["severity"] == "1" and resolved["severity"] == "0"
    assert resolved["resolution_state"] == "Closing"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", opened["time_of_event"])
    assert opened["time_of_event"] == "2023-11-14 22:13:20"
    info = json.loads(opened["additional_info"])
    assert info["incident_id"] == 5 and info["paths_count"] == 2 and info["jobs"] == ["train-llama-70b"]
    assert len(notifier.deliveries(state="delivered")) == 3


async def test_servicenow_without_credentials_sends_no_auth(make, rx):
    await send(make, rx, {"name": "snow", "kind": "servicenow", "url": rx.url("/em")}, event("opened"))
    assert "authorization" not in rx.at("/em")[0].headers
