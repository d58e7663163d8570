"""The service process: telemetry store, state, scheduler; the API (nms.app.api) runs on top."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from correlator.actions.manager import ActionManager
from correlator.incidents import FOLLOW_S, IncidentManager
from correlator.jobs_nccl import NcclJobs
from nms.app.actuators.registry import build_actuators
from nms.app.agent_registry import COMMANDS_FOLLOW_S, SEEN_WRITE_S, AgentRegistry
from nms.app.audits.escalation import IncidentFeed
from nms.app.audits.history import AuditHistory
from nms.app.audits.runner import AuditRunner
from nms.app.audits.snapshot import SnapshotSource
from nms.app.clock_service import ClockService
from nms.app.correlate_feed import CorrelateFeed
from nms.app.correlate_partitions import owned_findings
from nms.app.correlation import MIN_GAP_S, CorrelationService
from nms.app.dashboards.incident_points import IncidentPoints
from nms.app.membership import default_member
from nms.app.metrics import ServiceMetrics
from nms.app.notify import Notifier
from nms.app.notify.outbox import Outbox
from nms.app.plugins import open_bus, open_store
from nms.app.poll_shard import PollShard
from nms.app.polled import PolledPublisher
from nms.app.polled_view import PolledView
from nms.app.polling import Poller
from nms.app.roles import parse_roles
from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import TelemetryPublisher, stream_specs
from nms.app.writer import BusWriter
from nms.config import NmsConfig
from nms.signing import CommandSigner
from nms.state import StateStore, StateUnavailable
from nms.store import TimeSeriesStore

log = logging.getLogger(__name__)


class Service:
    def __init__(self, config: NmsConfig, store: TimeSeriesStore | None = None, roles: frozenset[str] | None = None):
        self.config = config
        # what this process runs (nms.app.roles); all of it by default
        self.roles = roles if roles is not None else parse_roles("all", config.cluster.bus is not None)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else open_store(config)
        self.state = StateStore.open(config.state, config.data_dir)  # SQLite (default) or PostgreSQL
        self.metrics = ServiceMetrics()
        self.metrics.watch_store(self.store.stats, self.store.name)
        self.metrics.member_info(os.environ.get("NMS_CLUSTER_MEMBER") or socket.gethostname(), self.roles)
        self.scheduler: AsyncIOScheduler | None = None
        self._correlating: asyncio.Task | None = None
        self._state_outages: dict[str, float] = {}  # job -> when it first met StateUnavailable (monotonic)
        self._acting: set[asyncio.Task] = set()  # action ticks started by a correlator window
        self.started_at = time.time()
        self.poller = Poller(config, self.store, self.metrics.registry)  # switch collectors, by entry point
        self.clock = ClockService(config.clock, self.store, self.metrics)  # network-effect clock sync
        self.clock.solves_here = "correlate" in self.roles
        self.incidents = IncidentManager(self.state, config.thresholds.resolve_after_clean_windows,
                                         window_ns=int(config.correlator.interval * 1e9))
        # incident events -> sinks, durable retries; the outbox is the state store's (one for a cluster)
        outbox = Outbox(self.state.database, default_member())
        outbox.import_file(config.data_dir / "notifications.sqlite")  # a process's own outbox of before
        self.notifier = Notifier(config.notifications, outbox, config.site, self.metrics.registry)
        self.incidents.add_listener(self.notifier.submit)
        self.incidents.add_listener(IncidentPoints(self.store))  # incident_event points for dashboards
        # fabric audits (nms/app/audits): their standing findings join every window's incidents
        history = AuditHistory(self.state.database, config.audits.history)  # the state store's (one for a cluster)
        history.import_file(config.data_dir / "audits.sqlite")  # a process's own history of before
        self.audits = AuditRunner(config.audits, history)
        self.incident_feed = IncidentFeed(self.incidents, self.audits.standing)
        # host agents (the API's /agents) and their commands, signed for the agents to verify (docs/actions.md)
        self.agents = AgentRegistry(config.fabric, config.agents, self.state)
        self.agents.signer = CommandSigner(config.data_dir)
        if self.state.backend == "postgresql":  # shared: every member knows the agents any API worker has
            self.agents.share_registrations()
        # incidents -> actions (correlator/actions/; actuators: nms/app/actuators/): planned, decided by
        # policy, applied, rolled back
        actuators = build_actuators(self.agents, self.poller, config.agents.command_ttl)
        self.actions = ActionManager(config.actions, config.fabric, self.state, actuators,
                                     self._action_context, self.store, self.metrics.registry,
                                     window_ns=int(config.correlator.interval * 1e9), port_loads=self._port_loads)
        self.incidents.add_listener(self.actions.on_incident)
        # jobs, collective bandwidth and slowdowns from the NCCL plugin's records (correlator/jobs_nccl.py)
        self.nccl_jobs = NcclJobs(self.state, lambda perfs: self.store.write([p.to_point() for p in perfs]))
        self.nccl_jobs.detects_here = "correlate" in self.roles  # else it serves what the correlating member shares
        self.agents.qp_targets = self.nccl_jobs.qp_targets  # the agents trace their QPs' paths
        self.correlation = None  # telemetry -> findings -> incidents, one step per correlator.interval
        if config.correlator.enabled:
            self.correlation = CorrelationService(config, self.state, self.incident_feed, self.metrics.registry)
            self.correlation.job_slowdowns = self._job_slowdowns
        # what the audits read: the poller's view, the inventory, the store, the clock, the correlator's findings
        self.audit_source = SnapshotSource(config.fabric, self.poller, self.store,
                                           clock=self.clock if config.clock.enabled else None,
                                           feed=self.incident_feed if self.correlation is not None else None)
        # a cluster (docs/cluster.md): ingest publishes on the bus, `write` members store what it carries
        bus_cfg = config.cluster.bus
        bus_roles = {"api", "write", "poll", "correlate"}
        self.bus = open_bus(bus_cfg) if bus_cfg is not None and self.roles & bus_roles else None
        self.publisher = (TelemetryPublisher(self.bus, bus_cfg, self.metrics.registry)
                          if self.bus is not None and bus_cfg is not None and "api" in self.roles else None)
        # `poll` members hand their switch records to the correlate members on the bus (nms/app/polled.py)
        self.polled = None
        if self.bus is not None and bus_cfg is not None and "poll" in self.roles and config.polling.enabled:
            publisher = self.publisher or TelemetryPublisher(self.bus, bus_cfg, self.metrics.registry)
            self.polled = PolledPublisher(publisher, lambda device: self.poller.recent.addresses.get(device, ()),
                                          self.metrics.registry, config.cluster.poll.member or default_member())
            self.poller.on_status = self.polled.submit_status
        self.writer = (BusWriter(self.bus, bus_cfg, config.cluster.write, self.store, self.metrics.registry)
                       if self.bus is not None and bus_cfg is not None and "write" in self.roles else None)
        # a `correlate` member without `api` takes the telemetry from the bus (with `api`, on_ingest has it)
        self.correlate_feed = (CorrelateFeed(self.bus, bus_cfg, config.cluster.correlate, config.fabric, self.on_ingest,
                                             self.metrics.registry, config.correlator.context)
                               if self.bus is not None and bus_cfg is not None and "correlate" in self.roles
                               and "api" not in self.roles else None)
        if self.correlate_feed is not None:
            self.correlate_feed.on_owned = self._own_partitions
        # the switches other members poll, in this member's API and topology (nms/app/polled_view.py)
        self.polled_view = None
        if self.bus is not None and bus_cfg is not None and self.roles & {"api", "correlate"}:
            in_process = self.correlation is not None and "correlate" in self.roles and self.correlate_feed is None
            self.polled_view = PolledView(self.bus, bus_cfg, self.poller, self.metrics.registry,
                                          self._to_correlator if in_process else None, config.cluster.correlate.replay)
        self.poller.on_records = self._polled
        # `poll` members share the switches (nms/app/poll_shard.py); without a bus, this process polls all
        self.poll_shard = (PollShard(self.bus, bus_cfg, config.cluster.poll, self.poller, self.metrics.registry)
                           if self.bus is not None and bus_cfg is not None and "poll" in self.roles
                           and config.polling.enabled else None)

    def _to_correlator(self, records: list) -> None:
        self.correlation.add(records, "collectors")  # type: ignore[union-attr]

    def _polled(self, records: list) -> None:
        """A poll's records (the poller stores them): to this process's correlator when it takes its
        telemetry in-process, and on the bus for correlate members that take theirs from it."""
        if self.polled is not None:
            self.polled.submit(records)
        if self.correlation is not None and "correlate" in self.roles and self.correlate_feed is None:
            self.correlation.add(records, "collectors")

    def _own_partitions(self, parts: set[str]) -> None:
        """A sharded correlate member's partitions changed: open incidents only for elements they own,
        and continue (and resolve) only those elements' open incidents (the others' owners do)."""
        owner = self.correlate_feed.split.owner  # type: ignore[union-attr]
        self.incident_feed.owned = lambda findings: owned_findings(findings, owner, parts)
        taken, given = self.incidents.hold(lambda i: owner(i.element_kind, i.element) in parts)
        for what, incidents in (("continues", taken), ("hands over", given)):
            if incidents:
                log.info("correlate member %s %s %d open incident(s): %s", self.correlate_feed.member,  # type: ignore[union-attr]
                         what, len(incidents), ", ".join(str(i.id) for i in incidents[:20]))

    def _action_context(self):
        """The planner's view: the topology and the switches' interface addresses (for avoid_hops)."""
        addresses = [a for found in self.poller.recent.addresses.values() for a in found]
        return self.poller.topology(), addresses

    def _port_loads(self) -> dict[tuple[str, str], float]:
        """(device, port) -> inbound utilization from the poller's latest rates (host_reroute's hop loads)."""
        return {key: r.in_utilization for key, r in self.poller.recent.rates.items() if r.in_utilization is not None}

    def on_ingest(self, kind: str, records: list) -> list:
        """Validated records of POST /ingest/<kind>, before they are stored: the records to store
        (the same number, in order). Clock edges feed the clock solve; probe windows get
        clock-corrected delays; everything goes to the correlator. A failure here never loses the
        batch: it is stored as it came. A process without the correlate role stores them as they came."""
        if "correlate" not in self.roles:
            return records
        if self.config.clock.enabled:
            try:
                if kind == "clock_edges":
                    self.clock.add_edges(records)
                elif kind == "probe_windows":
                    records = self.clock.correct(records)
            except Exception:
                log.exception("clock sync hook failed for %d %s", len(records), kind)
        if kind.startswith("nccl_"):
            try:
                self.nccl_jobs.add(records)
                self.nccl_jobs.flush()
            except Exception:
                log.exception("NCCL job tracking failed for %d %s", len(records), kind)
        if self.correlation is not None:
            try:
                self.correlation.add(records, kind)
            except Exception:
                log.exception("correlator feed failed for %d %s", len(records), kind)
        return records

    def _job_slowdowns(self) -> list:
        """Settled collectives assembled, then the active slowdowns (for the correlator's join)."""
        try:
            self.nccl_jobs.flush()
        except Exception:  # the fabric's own findings must not wait on this
            log.exception("assembling NCCL collectives failed")
        active, cleared = self.nccl_jobs.slowdowns()
        try:  # for the API workers of a cluster (GET /jobs/{id}/slowdowns); written again while it fails
            self.nccl_jobs.share_slowdowns(active, cleared)
        except StateUnavailable as e:
            log.debug("job slowdowns not shared: %s", e)
        return active

    async def start(self) -> None:
        """Start the scheduler on the running event loop: store retention, one polling job per
        (collector, device), the clock solve every clock.window_s; each only where its role runs here.
        With a bus: connect, create its streams, start the writer."""
        if self.bus is not None:
            await self.bus.connect()
            await self.bus.ensure_streams(stream_specs(self.config.cluster.bus))  # type: ignore[arg-type]
        if self.writer is not None:
            await self.writer.start()
        if self.correlate_feed is not None:
            await self.correlate_feed.start()
        if self.polled_view is not None:
            await self.polled_view.start()
        correlate = "correlate" in self.roles
        self.scheduler = AsyncIOScheduler(
            timezone="UTC", job_defaults={"misfire_grace_time": int(self.config.scheduler.misfire_grace),
                                          "coalesce": True, "max_instances": 1})
        retention = getattr(self.store, "retention_s", None)
        if retention:
            self.scheduler.add_job(self._prune, "interval", seconds=self.config.scheduler.retention_interval,
                                   id="store-retention", args=[retention])
        if correlate and self.config.correlator.incident_retention:
            self.scheduler.add_job(self._prune_incidents, "interval", seconds=self.config.scheduler.retention_interval,
                                   id="incident-retention", args=[self.config.correlator.incident_retention])
        if self.poll_shard is not None:
            await self.poll_shard.start(self.scheduler)
        elif "poll" in self.roles and self.config.polling.enabled:
            self.poller.schedule(self.scheduler)
        if correlate and self.config.clock.enabled:
            self.scheduler.add_job(self.solve_clock, "interval", seconds=self.config.clock.window_s, id="clock-solve")
        if "api" in self.roles and self.state.backend == "postgresql":
            # the state is shared: the incident stream shows what every member commits (an API worker opens
            # nothing itself), read back in order, instead of this process's own events as it emits them
            self.incidents.share_stream()
            self.scheduler.add_job(self._follow_incidents, "interval", seconds=FOLLOW_S, id="incident-stream")
            # commands other members issue (focus, steering) reach the agents that long-poll here at once;
            # the agents registered here are known to every member (a correlate member's host actuator)
            self.agents.share_commands()
            self.scheduler.add_job(self._threaded, "interval", seconds=SEEN_WRITE_S, id="agents-seen",
                                   args=["agents-seen", self.agents.write_seen])
            self.scheduler.add_job(self._follow_commands, "interval", seconds=COMMANDS_FOLLOW_S, id="agent-commands")
        if correlate and self.config.audits.enabled:
            self.audits.schedule(self.scheduler, self.audit_source, self.metrics.scheduler_runs)
            if self.correlation is None:  # no correlator windows: the audits' incidents get their own
                self.scheduler.add_job(self._audit_incidents, "interval", seconds=self.config.correlator.interval,
                                       id="audit-incidents")
        if correlate and self.config.actions.enabled:
            self.scheduler.add_job(self.actions.tick, "interval", seconds=self.config.correlator.interval,
                                   id="actions")
        self.scheduler.start()
        if correlate and self.correlation is not None:
            self._correlating = asyncio.create_task(self._correlate_loop(), name="correlate")
        await self.notifier.start()
        log.info("service started: roles %s, store=%s%s", ",".join(sorted(self.roles)), self.store.name,
                 f", api on {self.config.api.host}:{self.config.api.port}" if "api" in self.roles else "")

    async def _threaded(self, job: str, fn, *args):
        """Run a scheduled job's work in a worker thread, counted per outcome; a failure is logged
        and never stops the scheduler. Returns fn's result, or None when it failed. A state store
        outage (PostgreSQL down) is one warning when a job first meets it and one info when the job
        runs again, not a traceback every run (the correlator steps every second)."""
        try:
            result = await asyncio.to_thread(fn, *args)
        except StateUnavailable as e:
            self.metrics.scheduler_runs.labels(job, "error").inc()
            if job not in self._state_outages:
                self._state_outages[job] = time.monotonic()
                log.warning("scheduled job %s: %s; it retries every run, logged again when the state store is back",
                            job, e.reason)
            return None
        except Exception:
            self.metrics.scheduler_runs.labels(job, "error").inc()
            log.exception("scheduled job %s failed", job)
            return None
        self.metrics.scheduler_runs.labels(job, "ok").inc()
        if (since := self._state_outages.pop(job, None)) is not None:
            log.info("scheduled job %s: the state store is back after %.0f s", job, time.monotonic() - since)
        return result

    async def _prune(self, retention_s: float) -> None:
        deleted = await self._threaded("store-retention", self.store.prune, time.time_ns() - int(retention_s * 1e9))
        if deleted is not None:
            log.info("retention: deleted %d rows older than %.0f s", deleted, retention_s)

    async def _prune_incidents(self, retention_s: float) -> None:
        deleted = await self._threaded("incident-retention", self.state.prune_incidents,
                                       time.time_ns() - int(retention_s * 1e9))
        if deleted:
            log.info("incident retention: deleted %d incidents resolved more than %.0f s ago", deleted, retention_s)

    async def _follow_commands(self) -> None:
        try:
            await self.agents.follow_commands()
        except StateUnavailable:  # the long-polls re-read the store at their next wake; the next run retries
            pass

    async def _follow_incidents(self) -> None:
        await self._threaded("incident-stream", self.incidents.follow)

    async def _audit_incidents(self) -> None:
        await self._threaded("audit-incidents", self.incident_feed.apply_standing, time.time_ns())

    async def solve_clock(self) -> None:
        """The clock job: solve the finished slots (nms.app.clock_service) in a worker thread."""
        await self._threaded("clock-solve", self.clock.solve_due)

    async def _correlate_loop(self) -> None:
        """One correlator step per window (nms.app.correlation), never two at once."""
        while True:
            started = time.monotonic()
            try:
                await self.correlation.next_step()
                await asyncio.sleep(max(0.0, MIN_GAP_S - (time.monotonic() - started)))
                await self.correlate()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one step
                log.exception("correlator loop failed; stepping again in a second")
                await asyncio.sleep(1.0)

    async def correlate(self) -> None:
        """The correlator job: the topology on the loop (the poller changes its inputs here), the step
        in a worker thread."""
        try:
            self.correlation.refresh_topology(self.poller.topology, time.time_ns())
        except Exception:
            log.exception("topology for the correlator failed; stepping on the previous one")
        await self._threaded("correlate", self.correlation.step)
        links, paths = self.correlation.take_focus()
        if paths:
            await self._focus(links, paths)
        if self.config.actions.enabled and self.actions.pending:  # act on this window's incidents now
            task = asyncio.create_task(self._act(), name="actions")
            self._acting.add(task)
            task.add_done_callback(self._acting.discard)

    async def _focus(self, links: list[str], paths: dict[str, list[str]]) -> None:
        """Ask the agents whose paths cross a link suspected of loss to probe those paths faster for a
        while (correlator.focus_rate, focus_s): the agents' `focus` command."""
        cfg = self.config.correlator
        args = {"rate": cfg.focus_rate, "for_s": cfg.focus_s}
        try:
            for host, ids in paths.items():
                await self.agents.issue([host], "focus", {**args, "paths": ids}, "correlator")
        except Exception as e:  # the state store may be away: focusing only speeds the test up
            log.warning("focus commands not sent: %s", e)
            return
        log.info("focus: %d paths of %d hosts probed at %g/s for %g s: loss suspected on %s",
                 sum(map(len, paths.values())), len(paths), cfg.focus_rate, cfg.focus_s, ", ".join(links))

    async def _act(self) -> None:
        try:
            await self.actions.tick()
        except Exception:
            log.exception("actions tick failed")

    async def stop(self) -> None:
        """Clean shutdown: stop scheduling and writing, flush the store (or spool it), close state and bus."""
        if self.writer is not None:
            await self.writer.stop()
        if self.correlate_feed is not None:
            await self.correlate_feed.stop()
        if self.polled_view is not None:
            await self.polled_view.stop()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._correlating is not None:
            # cancelled until it ended: a cancel that comes with a window's arrival can be dropped by
            # next_step's wait_for on Python 3.11 (nms/app/tasks.py), and the loop would step on
            if not await end_tasks([self._correlating], 10.0):
                log.warning("the correlator loop did not stop within 10 s")
            await asyncio.to_thread(self.correlation.wait_idle)  # a step's worker thread runs on
        if self.poll_shard is not None:
            await self.poll_shard.stop()
        await self.poller.close()
        if self.polled is not None:
            await self.polled.close()
        await self.notifier.stop()
        await asyncio.to_thread(self.store.close)
        if self.bus is not None:
            await self.bus.close()
        self.state.close()
        log.info("service stopped; store flushed")
