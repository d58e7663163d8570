"""Durable, retrying delivery of incident events to the configured sinks.

`submit(event)` (any thread, never raises) queues one delivery per accepting sink in the outbox
(the state store's, shared by a cluster's members: nms/app/notify/outbox.py) and wakes the worker.
The worker (on the service's asyncio loop) sends the head of every (sink, incident) chain that is
due: in order per chain (a resolve never overtakes its trigger), concurrently across chains, with a
per-sink connection pool and concurrency limit (a slow or dead sink only delays itself). Connection
errors, timeouts, 408, 429 and 5xx are retried with exponential backoff (backoff_initial doubling up
to backoff_max, +-20 % jitter); a Retry-After on 429/503 (seconds or HTTP date, capped at
max_retry_after) sets the next attempt instead; other 4xx fail at once; max_attempts tries then
failed. Deliveries still pending at shutdown (also one cancelled mid-flight) are sent after a
restart, or by another member: at least once, receivers dedup on the incident key. A member claims
a delivery before each attempt (for the sink's timeout plus CLAIM_MARGIN_S), so two members never
send one attempt; the worker also looks every RESCAN_S for deliveries other members queued or left
behind. Secrets never reach logs, rows or API output: every error text is scrubbed of them.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import re
import time
from collections.abc import Iterator
from datetime import UTC

import httpx
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel

from nms.app.notify.base import Sink
from nms.app.notify.outbox import Outbox
from nms.app.plugins import load_plugin
from nms.app.tasks import end_tasks
from nms.config.models import NotificationsConfig
from nms.records import IncidentEvent, NotificationDelivery

log = logging.getLogger(__name__)
NOTIFIER_GROUP = "nms.notifiers"
PER_SINK_CONCURRENCY = 4
KEEP_FINISHED_S = 30 * 86400.0
EXCERPT = 200
CLAIM_MARGIN_S = 30.0
RESCAN_S = 5.0
STOP_GRACE_S = 5.0


class SinkInfo(BaseModel):
    name: str
    kind: str
    url: str  # without credentials, query or (slack) the secret path
    min_severity: str
    kinds: list[str]
    pending: int = 0
    delivered: int = 0
    failed: int = 0


def retry_after_s(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


class _RedactHttpx(logging.Filter):
    """httpx logs every request's URL (INFO "HTTP Request: POST <url> ..."); a sink URL can carry
    a credential (Slack's path, a token in the query, user info). Scrub those from its records."""

    secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if any(s in text for s in self.secrets):
                for secret in sorted(self.secrets, key=len, reverse=True):
                    text = text.replace(secret, "***")
                record.msg, record.args = text, None
        return True


_REDACT = _RedactHttpx()
logging.getLogger("httpx").addFilter(_REDACT)


class _Gauges(Collector):
    def __init__(self, outbox: Outbox):
        self._outbox = outbox

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("nms_notification_deliveries", "notification deliveries by sink and state",
                                   labels=["sink", "state"])
        try:
            for (sink, state), n in sorted(self._outbox.counts().items()):
                family.add_metric([sink, state], n)
        except Exception:  # closed at shutdown
            pass
        yield family


class Notifier:
    def __init__(self, config: NotificationsConfig, outbox: Outbox, site: str,
                 registry: CollectorRegistry | None = None):
        self.config = config
        self.site = site
        self._sinks: dict[str, Sink] = {
            s.name: load_plugin(NOTIFIER_GROUP, s.kind).from_config(s, site, config.external_url) for s in config.sinks}
        for sink in self._sinks.values():
            _REDACT.secrets.update(sink.secrets())
        self._outbox = outbox
        self._attempts = None
        if registry is not None:
            self._attempts = Counter("nms_notification_attempts", "notification send attempts by result "
                                     "(delivered, retry, failed)", ["sink", "result"], registry=registry)
            registry.register(_Gauges(self._outbox))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._inflight: set[int] = set()
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._closed = False
        self._stopping = False

    # --- producer side (any thread) -------------------------------------------------------------

    def submit(self, event: IncidentEvent) -> None:
        """Queue `event` for every sink that takes it (not a child's: `IncidentEvent.notifies`).
        Thread-safe, quick, never raises."""
        try:
            if not self._sinks or not event.notifies:  # a child's page is its parent's (docs/correlator.md)
                return
            if self._closed:
                log.warning("notifier stopped: %s of incident %d not queued", event.event, event.incident.id)
                return
            sinks = [(name, sink.kind, sink.accepts(event)) for name, sink in self._sinks.items()]
            if self._outbox.add(event, sinks, time.time_ns()):
                self._poke()
        except Exception as exc:
            log.error("could not queue notifications for an incident event: %s", type(exc).__name__)

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # loop closed
            pass

    # --- reading ---------------------------------------------------------------------------------

    def deliveries(self, incident_id: int | None = None, state: str | None = None, sink: str | None = None,
                   limit: int = 100) -> list[NotificationDelivery]:
        return self._outbox.list(incident_id=incident_id, state=state, sink=sink, limit=limit)

    def sinks(self) -> list[SinkInfo]:
        counts = self._outbox.counts()
        return [SinkInfo(name=name, kind=s.kind, url=s.public_url(), min_severity=s.config.min_severity,
                         kinds=list(s.config.kinds), **{st: counts.get((name, st), 0)
                                                        for st in ("pending", "delivered", "failed")})
                for name, s in self._sinks.items()]

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        # a shared outbox holds other members' sinks too (a member may have none configured): only a
        # process's own outbox can tell a sink that is no longer configured
        stale = 0 if self._outbox.shared else self._outbox.fail_unknown_sinks(set(self._sinks))
        if stale:
            log.warning("%d pending notifications for sinks no longer configured marked failed", stale)
        self._outbox.prune(time.time_ns() - int(KEEP_FINISHED_S * 1e9))
        for name, sink in self._sinks.items():
            self._clients[name] = httpx.AsyncClient(
                timeout=sink.config.timeout, verify=sink.config.verify_tls, follow_redirects=False,
                limits=httpx.Limits(max_connections=PER_SINK_CONCURRENCY))
            self._limits[name] = asyncio.Semaphore(PER_SINK_CONCURRENCY)
        if self._sinks:
            self._runner = asyncio.create_task(self._run(), name="notifier")
            log.info("notifier started: %d sinks (%s)", len(self._sinks), ", ".join(self._sinks))

    async def stop(self, grace: float = 2.0) -> None:
        """Stop sending: attempts in flight get `grace` seconds, then are cancelled and stay pending."""
        if self._closed:
            return
        # the worker also sees the flag: its wait_for (a timeout at least every RESCAN_S) may drop a cancel
        # that comes with a wake-up on Python 3.11 (nms/app/tasks.py), and it would then loop on
        self._stopping = True
        if self._runner is not None:
            if self._wake is not None:
                self._wake.set()
            if not await end_tasks([self._runner], STOP_GRACE_S):
                log.warning("notifier: the worker did not stop within %g s", STOP_GRACE_S)
            self._runner = None
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace)
            if late and not await end_tasks(late, STOP_GRACE_S):
                log.warning("notifier: %d attempt(s) did not stop within %g s", len(late), STOP_GRACE_S)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        self._closed = True
        self._loop = self._wake = None

    # --- the worker --------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            now = time.time_ns()
            soonest = now + int(RESCAN_S * 1e9)  # what other members queue or leave behind
            try:
                heads = self._outbox.heads(now)
            except Exception as exc:
                log.error("notification outbox unreadable: %s", type(exc).__name__)
                heads = []
                soonest = now + 10**9
            for delivery, body in heads:
                if delivery.id in self._inflight or delivery.sink not in self._sinks:
                    continue
                due = delivery.next_attempt_ns or 0
                if due > now:
                    soonest = min(soonest, due)
                    continue
                lease = self._sinks[delivery.sink].config.timeout + CLAIM_MARGIN_S
                try:
                    if not self._outbox.claim(delivery.id, now, now + int(lease * 1e9)):
                        continue  # another member sends it
                except Exception as exc:
                    log.error("notification outbox: claim failed: %s", type(exc).__name__)
                    continue
                self._inflight.add(delivery.id)
                task = asyncio.create_task(self._attempt(delivery, body))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            timeout = max(0.0, (soonest - time.time_ns()) / 1e9)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _attempt(self, d: NotificationDelivery, body: str) -> None:
        sink = self._sinks[d.sink]
        try:
            async with self._limits[d.sink]:
                await self._send(sink, d, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not the network: fail it rather than loop on it
            log.error("notification %d to %s: unexpected %s", d.id, d.sink, type(exc).__name__)
            try:
                self._finish(sink, d, "failed", time.time_ns(), None, f"internal error: {type(exc).__name__}")
            except Exception:
                pass
        finally:
            self._inflight.discard(d.id)
            if self._wake is not None:
                self._wake.set()

    async def _send(self, sink: Sink, d: NotificationDelivery, body: str) -> None:
        started = time.time_ns()
        status, excerpt, error, retry_after = None, "", None, None
        try:
            request = sink.render(IncidentEvent.model_validate_json(body), d.id, started)
        except Exception as exc:
            return self._finish(sink, d, "failed", started, None, f"cannot render: {type(exc).__name__}: {exc}")
        try:
            async with asyncio.timeout(sink.config.timeout):
                async with self._clients[d.sink].stream(request.method, request.url, headers=request.headers,
                                                        content=request.body, auth=request.auth) as response:
                    status = response.status_code
                    raw = b""
                    async for chunk in response.aiter_bytes():
                        raw += chunk
                        if len(raw) >= 4 * EXCERPT:
                            break
                    retry_after = response.headers.get("retry-after")
            verdict = sink.verdict(status, raw)
            excerpt = re.sub(r"\s+", " ", raw[: 4 * EXCERPT].decode("utf-8", "replace")).strip()
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            verdict, status = "retry", None
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if verdict != "delivered" and error is None:
            error = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
        delay = None
        if verdict == "retry":
            if d.attempts + 1 >= self.config.max_attempts:
                verdict, error = "failed", f"gave up after {d.attempts + 1} attempts; last: {error}"
            else:
                if status in (429, 503):
                    delay = retry_after_s(retry_after, time.time())
                    if delay is not None:
                        delay = min(delay, self.config.max_retry_after)
                if delay is None:
                    delay = self.config.backoff_initial * 2 ** d.attempts * random.uniform(0.8, 1.2)
                    delay = min(delay, self.config.backoff_max)
        self._finish(sink, d, verdict, started, status, error, delay)

    def _finish(self, sink: Sink, d: NotificationDelivery, verdict: str, started: int, status: int | None,
                error: str | None, delay: float | None = None) -> None:
        now = time.time_ns()
        if error is not None:
            error = self._scrub(sink, error)[:EXCERPT]
        state = "pending" if verdict == "retry" else verdict
        self._outbox.record(d.id, state=state, attempts=d.attempts + 1, last_attempt_ns=started,
                            next_attempt_ns=now + int(delay * 1e9) if delay is not None else None,
                            delivered_ns=now if verdict == "delivered" else None, last_status=status,
                            last_error=error)
        if self._attempts is not None:
            self._attempts.labels(d.sink, verdict).inc()
        if verdict == "delivered":
            log.debug("notification %d (%s of incident %d) delivered to %s", d.id, d.event, d.incident_id, d.sink)
        elif verdict == "retry":
            log.info("notification %d (%s of incident %d) to %s: attempt %d failed (%s), retry in %.1f s",
                     d.id, d.event, d.incident_id, d.sink, d.attempts + 1, error, delay)
        else:
            log.warning("notification %d (%s of incident %d) to %s failed: %s",
                        d.id, d.event, d.incident_id, d.sink, error)

    @staticmethod
    def _scrub(sink: Sink, text: str) -> str:
        for secret in sorted(sink.secrets(), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text
