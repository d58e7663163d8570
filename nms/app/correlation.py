"""The correlation loop of the service: feeds the correlator (correlator/) the records it ingests and
polls, runs one step per window, and turns the findings into incidents.

A step runs as soon as the first probe windows of a new second (or path events) arrive, SETTLE_S
later so the other agents' batches of that second make it too (stragglers wait for the next step:
one step per window, so "N clean windows" stays N seconds); without arrivals, every
`correlator.interval` (1.5 intervals while agents report, so a late batch does not cost a step).

Records reach the correlator from two places: agents' POST /ingest batches (probe windows, path
events, probe paths, host NIC samples; via Service.on_ingest) and the switch collectors' polls
(port samples and rates, link events, LLDP, interface addresses; via Poller.on_records). The step
itself runs in a worker thread; the reconciled topology is taken on the event loop first, because
the poller mutates what it is built from there.

While the state store does not answer (PostgreSQL down), the correlator steps on (with the jobs known
last) and each window's findings wait in memory, UNWRITTEN_MAX windows at most; once it answers they
are written in order before the current window, UNWRITTEN_BUDGET_S of them a step, so a fault that
began, or began and ended, during the outage has its incident with the times it really had.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel

from correlator.engine import Correlator
from correlator.incidents import IncidentManager
from correlator.job_impact import SlowdownJoin
from nms.config import NmsConfig
from nms.records import FabricTopology, Finding, IncidentEvent, Job
from nms.state import StateStore, StateUnavailable

log = logging.getLogger(__name__)

TOPOLOGY_EVERY_NS = 5 * 10**9  # LLDP and oper state change at polling pace, not per step
SETTLE_S = 0.15  # after the first agent's windows of a second, wait this long for the others'
MIN_GAP_S = 0.25  # never two steps closer than this
UNWRITTEN_MAX = 3600  # windows kept while the state store is down (an hour at 1 s); beyond, the oldest go
UNWRITTEN_BUDGET_S = 0.5  # a step writes waiting windows for this long at most (then the current one waits)


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
        self.job_slowdowns: Callable[[], list] | None = None  # active NCCL job slowdowns (correlator/jobs_nccl.py)
        self._join_slowdowns = SlowdownJoin()
        self._topology_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrival: asyncio.Event | None = None
        self._arrived_at = float("-inf")
        self._newest_window = 0  # window_start of the newest probe window that triggered a step
        self._lock = threading.Lock()  # one step at a time
        self._records = Counter("nms_correlator_records", "records handed to the correlator", ["source"],
                                registry=registry)
        self._duration = Histogram("nms_correlator_step_seconds", "time per correlator step",
                                   buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=registry)
        self._findings = Gauge("nms_correlator_findings", "findings in the last step", registry=registry)
        self._events = Counter("nms_incident_events", "incident events", ["event"], registry=registry)
        self._focus: tuple[list[str], dict[str, list[str]]] = ([], {})
        self._focus_lock = threading.Lock()  # not the step's: taking them must not wait for a step
        self._jobs: list[Job] = []  # as last read from the state store
        self._unwritten: deque[tuple[int, list[Finding]]] = deque()  # (window, findings) not yet in the state
        self._dropping = False
        self._dropped = Counter("nms_correlator_unwritten_dropped_windows", "correlator windows dropped "
                                "unwritten after UNWRITTEN_MAX waited for the state store", registry=registry)

    def add(self, records: Iterable, source: str) -> None:
        """Hand records to the correlator (any thread); agents' windows and path events trigger a step."""
        records = list(records)
        self.correlator.add(records)
        self._records.labels(source).inc(len(records))
        if not records or self._loop is None:
            return
        if source == "probe_windows":
            newest = max(r.window_start for r in records)
            if newest <= self._newest_window:
                return
            self._newest_window = newest
        elif source != "path_events":
            return
        self._arrived_at = time.monotonic()
        self._loop.call_soon_threadsafe(self._arrival.set)

    async def next_step(self) -> None:
        """Return when the next step is due (on the event loop)."""
        if self._loop is None:
            self._loop, self._arrival = asyncio.get_running_loop(), asyncio.Event()
        interval = self.config.correlator.interval
        reporting = time.monotonic() - self._arrived_at < 5 * interval
        try:
            await asyncio.wait_for(self._arrival.wait(), (1.5 if reporting else 1.0) * interval)
            await asyncio.sleep(SETTLE_S)
        except TimeoutError:
            pass
        self._arrival.clear()

    def wait_idle(self) -> None:
        """Block until a step in flight has finished (shutdown: the state store closes next)."""
        with self._lock:
            pass

    def refresh_topology(self, build: Callable[[], FabricTopology], now_ns: int) -> None:
        """Hand the correlator the reconciled topology, at most every TOPOLOGY_EVERY_NS (call on the loop)."""
        if now_ns - self._topology_ns >= TOPOLOGY_EVERY_NS:
            self._topology_ns = now_ns
            self.correlator.set_topology(build())

    def _write_windows(self) -> list[IncidentEvent]:
        """The windows waiting to be written, oldest first (only this step's but after an outage).
        StateUnavailable when none could be written: they wait for the next step."""
        events: list[IncidentEvent] = []
        written, deadline = 0, time.perf_counter() + UNWRITTEN_BUDGET_S
        while self._unwritten and (not written or time.perf_counter() < deadline):
            window_ns, findings = self._unwritten[0]
            try:
                events += self.incidents.apply(findings, window_ns)
            except StateUnavailable:
                if not written:
                    raise
                break
            self._unwritten.popleft()
            written += 1
        if written > 1:
            log.info("the state store answers: %d correlator windows written late, %d still waiting", written,
                     len(self._unwritten))
        if not self._unwritten:
            self._dropping = False
        return events

    def take_focus(self) -> tuple[list[str], dict[str, list[str]]]:
        """The suspected links and the paths per host to probe faster that the steps since the last
        call asked for (Correlator.focus_requests); the service sends them to the agents."""
        with self._focus_lock:
            out, self._focus = self._focus, ([], {})
        return out

    def step(self, now_ns: int | None = None) -> list[IncidentEvent]:
        """One window: findings -> incident events (opened, updated, resolved)."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            started = time.perf_counter()
            try:
                self._jobs = self.state.list_jobs(active_at=now_ns)
            except StateUnavailable:
                pass  # judged with the jobs known last; the window waits to be written (the module's doc)
            findings = self.correlator.step(now_ns, self._jobs)
            if self.job_slowdowns is not None:
                findings = self._join_slowdowns(findings, self.job_slowdowns(), now_ns,
                                                self.incidents.open_incidents())
            links, paths = self.correlator.focus_requests(now_ns)
            if paths:  # kept until the service takes them (take_focus), merged with any not taken yet
                with self._focus_lock:
                    waiting = self._focus[1]
                    self._focus = (self._focus[0] + links, {h: sorted({*waiting.get(h, ()), *paths.get(h, ())})
                                                            for h in {*waiting, *paths}})
            if len(self._unwritten) >= UNWRITTEN_MAX:
                self._unwritten.popleft()
                if not self._dropping:
                    self._dropping = True
                    log.error("the state store has not answered for %d correlator windows: the oldest are dropped "
                              "unwritten (nms_correlator_unwritten_dropped_windows counts them)", UNWRITTEN_MAX)
                self._dropped.inc()
            self._unwritten.append((now_ns, findings))
            events = self._write_windows()
            duration = time.perf_counter() - started
        self._duration.observe(duration)
        self._findings.set(len(findings))
        for e in events:
            self._events.labels(e.event).inc()
            log.info("incident %d %s: %s on %s", e.incident.id, e.event, e.incident.kind, e.incident.element)
        self.last = StepStats(ts=now_ns, duration_s=duration, findings=len(findings), events=len(events),
                              open_incidents=len(self.incidents.open_incidents()))
        return events
