"""The correlation loop of the service: feeds the correlator (correlator/) the records it ingests and
polls, runs one step per `correlator.interval`, and turns the findings into incidents.

Records reach the correlator from two places: agents' POST /ingest batches (probe windows, path
events, probe paths, host NIC samples; via Service.on_ingest) and the switch collectors' polls
(port samples and rates, link events, LLDP, interface addresses; via Poller.on_records). The step
itself runs in a worker thread; the reconciled topology is taken on the event loop first, because
the poller mutates what it is built from there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel

from correlator import Correlator
from nms.app.incidents import IncidentManager
from nms.config import NmsConfig
from nms.records import FabricTopology, IncidentEvent
from nms.state import StateStore

log = logging.getLogger(__name__)

TOPOLOGY_EVERY_NS = 5 * 10**9  # LLDP and oper state change at polling pace, not per step


class StepStats(BaseModel):
    ts: int
    duration_s: float
    findings: int
    events: int
    open_incidents: int


class CorrelationService:
    def __init__(self, config: NmsConfig, state: StateStore, incidents: IncidentManager, registry):
        self.config = config
        self.state = state
        self.incidents = incidents
        self.correlator = Correlator(config.fabric, config.thresholds, config.correlator)
        self.last: StepStats | None = None
        self._topology_ns = 0
        self._lock = threading.Lock()  # one step at a time (the scheduler's max_instances also says so)
        self._records = Counter("nms_correlator_records", "records handed to the correlator", ["source"],
                                registry=registry)
        self._duration = Histogram("nms_correlator_step_seconds", "time per correlator step",
                                   buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=registry)
        self._findings = Gauge("nms_correlator_findings", "findings in the last step", registry=registry)
        self._events = Counter("nms_incident_events", "incident events", ["event"], registry=registry)

    def add(self, records: Iterable, source: str) -> None:
        records = list(records)
        self.correlator.add(records)
        self._records.labels(source).inc(len(records))

    def refresh_topology(self, build: Callable[[], FabricTopology], now_ns: int) -> None:
        """Hand the correlator the reconciled topology, at most every TOPOLOGY_EVERY_NS (call on the loop)."""
        if now_ns - self._topology_ns >= TOPOLOGY_EVERY_NS:
            self._topology_ns = now_ns
            self.correlator.set_topology(build())

    def step(self, now_ns: int | None = None) -> list[IncidentEvent]:
        """One window: findings -> incident events (opened, updated, resolved)."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            started = time.perf_counter()
            jobs = self.state.list_jobs(active_at=now_ns)
            findings = self.correlator.step(now_ns, jobs)
            events = self.incidents.apply(findings, now_ns)
            duration = time.perf_counter() - started
        self._duration.observe(duration)
        self._findings.set(len(findings))
        for e in events:
            self._events.labels(e.event).inc()
            log.info("incident %d %s: %s on %s", e.incident.id, e.event, e.incident.kind, e.incident.element)
        self.last = StepStats(ts=now_ns, duration_s=duration, findings=len(findings), events=len(events),
                              open_incidents=len(self.incidents.open_incidents()))
        return events
