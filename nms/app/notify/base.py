"""The notifier contract: a sink turns an IncidentEvent into one HTTP request and reads the answer.

A sink class is found by its `kind` through the `nms.notifiers` entry-point group (see
pyproject.toml); a third party ships one as a class with the same shape in its own package.
Sinks are pure: no I/O, no clocks except the `now` they are given, so payloads are testable as is.
Secrets (HMAC key, routing key, password, a URL's user info or query) are used only to build the
request; `secrets()` lists them so that the dispatcher can scrub any text it logs or stores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit, urlunsplit

from nms import __version__
from nms.config.models import NotificationSink
from nms.records import IncidentEvent

USER_AGENT = f"fabric-nms/{__version__}"
SEVERITY_RANK = {"warning": 0, "minor": 1, "major": 2, "critical": 3}
Verdict = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    auth: tuple[str, str] | None = field(default=None, repr=False)  # HTTP basic auth


def incident_key(site: str, incident_id: int) -> str:
    """The stable key of one incident on every sink (PagerDuty dedup_key, ServiceNow message_key):
    trigger, updates, acknowledge and resolve of an incident all carry it."""
    return f"nms:{site}:{incident_id}"


def iso_utc(ns: int, millis: bool = True) -> str:
    """RFC 3339 / ISO 8601 UTC, e.g. 2023-11-14T22:13:20.123Z."""
    dt = datetime.fromtimestamp(ns // 10**9, tz=UTC)
    if millis:
        return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{(ns // 10**6) % 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def json_body(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def element_node(element: str) -> str:
    """The device an element belongs to: a link `a:p--b:q` -> a, a NIC `host:nic` -> host."""
    return element.split("--", 1)[0].split(":", 1)[0]


class Sink:
    """Base of the built-in sinks. Subclasses set `kind` and implement `render`."""

    kind: ClassVar[str] = ""
    content_type: ClassVar[str] = "application/json"

    def __init__(self, config: NotificationSink, site: str, external_url: str | None = None):
        self.config = config
        self.name = config.name
        self.site = site
        self.external_url = external_url

    @classmethod
    def from_config(cls, config: NotificationSink, site: str, external_url: str | None = None) -> Sink:
        return cls(config, site, external_url)

    # --- what subclasses provide ---------------------------------------------------------------

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        raise NotImplementedError

    def verdict(self, status: int, body: bytes) -> Verdict:
        """How to read an answer: 2xx delivered; 408, 429 and 5xx retried; other 4xx permanent."""
        if 200 <= status < 300:
            return "delivered"
        if status in (408, 429) or status >= 500:
            return "retry"
        return "failed"

    # --- shared ---------------------------------------------------------------------------------

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Content-Type": self.content_type, "User-Agent": USER_AGENT, **extra}

    def post(self, doc: Any, auth: tuple[str, str] | None = None, **headers: str) -> HttpRequest:
        return HttpRequest("POST", self.config.url, self.headers(**headers), json_body(doc), auth)

    def secrets(self) -> list[str]:
        """Every string that must never be logged, stored or shown."""
        out = []
        if self.config.secret is not None:
            out.append(self.config.secret.get_secret_value())
        parts = urlsplit(self.config.url)
        if parts.password:
            out.append(parts.password)
        if parts.query:
            out += [parts.query] + [kv.split("=", 1)[-1] for kv in parts.query.split("&")]
        return [s for s in out if len(s) >= 4]

    def public_url(self) -> str:
        """The URL without user info, query or fragment: safe to show."""
        parts = urlsplit(self.config.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def accepts(self, event: IncidentEvent) -> bool:
        """The sink's filters: min_severity and kinds."""
        inc = event.incident
        if SEVERITY_RANK[inc.severity] < SEVERITY_RANK[self.config.min_severity]:
            return False
        return not self.config.kinds or inc.kind in self.config.kinds
