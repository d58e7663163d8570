"""Generic signed JSON webhook (kind `webhook`).

Body: the IncidentEvent (`event`, `ts`, `incident`) plus `site`, `sink`, `delivery_id` (stable
across retries of one delivery: receivers may dedup on it) and `key` (the incident's stable key).

Signature, when the sink has a `secret`: `X-NMS-Timestamp: <unix seconds>` and
`X-NMS-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>`. A receiver
recomputes the HMAC over the timestamp header, a dot and the raw body bytes, compares in constant
time, and rejects timestamps too far from its clock (replay). Each attempt is signed afresh.
Without a secret the request is unsigned (no signature header).
"""

from __future__ import annotations

import hashlib
import hmac

from nms.app.notify.base import HttpRequest, Sink, incident_key, json_body
from nms.records import IncidentEvent


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookSink(Sink):
    kind = "webhook"

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        doc = {**event.model_dump(mode="json"), "site": self.site, "sink": self.name,
               "delivery_id": delivery_id, "key": incident_key(self.site, event.incident.id)}
        body = json_body(doc)
        ts = str(now_ns // 10**9)
        headers = self.headers(**{"X-NMS-Timestamp": ts, "X-NMS-Delivery": str(delivery_id),
                                  "X-NMS-Event": event.event})
        if self.config.secret is not None:
            headers["X-NMS-Signature"] = sign(self.config.secret.get_secret_value(), ts, body)
        return HttpRequest("POST", self.config.url, headers, body)
