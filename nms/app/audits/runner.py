"""Runs audits (scheduled and on demand), keeps their reports, holds their standing findings for
the incident feed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

from nms.app.audits import CHECKS
from nms.app.audits.escalation import can_escalate, to_finding
from nms.app.audits.history import AuditHistory
from nms.app.audits.model import SEVERITY_RANK, AuditFinding, AuditReport, AuditResult, Snapshot
from nms.app.audits.snapshot import SnapshotSource, complete, from_poller
from nms.config.models import AuditsConfig
from nms.records import Finding

log = logging.getLogger(__name__)


class UnknownAudit(ValueError):
    pass


class AuditRunner:
    def __init__(self, config: AuditsConfig, history: AuditHistory):
        self.config = config
        self.history = history
        self._run_lock = threading.Lock()  # one run at a time: reports and standing findings in order
        # per audit: the findings of its latest run that had data (a run without data changes nothing:
        # unknown is not fixed); restored from the history so a restart does not resolve incidents
        self._standing: dict[str, list[AuditFinding]] = {
            audit: r.findings for audit, (_, r) in history.last_results().items() if r.status in ("clean", "findings")}

    def names(self, name: str | None = None) -> list[str]:
        """The audits a run covers: `name`, or every enabled one."""
        if name is not None:
            if name not in CHECKS:
                raise UnknownAudit(f"no audit {name!r}; audits: {', '.join(CHECKS)}")
            return [name]
        return [n for n in CHECKS if self.config.settings(n).enabled]

    def incident_level(self, name: str) -> str:
        return self.config.settings(name).open_incidents or self.config.open_incidents

    def schedule_text(self, name: str) -> str:
        s = self.config.settings(name)
        return f"cron {s.cron}" if s.cron else f"every {s.interval or self.config.interval:g} s"

    # --- running --------------------------------------------------------------------------------

    def run(self, snap: Snapshot, names: list[str], trigger: str = "manual") -> AuditReport:
        """Run `names` on one snapshot (blocking: a worker thread), store the report."""
        with self._run_lock:
            started = time.time_ns()
            results = [self._one(name, snap) for name in names]
            report = self.history.add(AuditReport(trigger=trigger, started_ns=started, finished_ns=time.time_ns(),
                                                  results=results))
            for r in results:
                if r.status in ("clean", "findings"):
                    self._standing[r.audit] = r.findings
        for r in results:
            log.info("audit %s (report %d): %s, %d finding(s)%s", r.audit, report.id, r.status, len(r.findings),
                     f": {r.reason}" if r.reason else "")
        return report

    def _one(self, name: str, snap: Snapshot) -> AuditResult:
        began = time.perf_counter()
        try:
            out = CHECKS[name](snap, self.config.settings(name))
        except Exception as e:  # one broken check never hides the others
            log.exception("audit %s failed", name)
            out = AuditResult(audit=name, status="error", reason=f"{type(e).__name__}: {e}")
        return out.model_copy(update={"duration_s": round(time.perf_counter() - began, 4)})

    async def run_on(self, source: SnapshotSource, names: list[str], trigger: str = "manual") -> AuditReport:
        """Snapshot the source (the poller's part on the loop), then check in a worker thread."""
        snap = from_poller(source)
        max_age = self.config.probe_coverage.max_age

        def work() -> AuditReport:
            return self.run(complete(snap, source, max_age), names, trigger)

        return await asyncio.to_thread(work)

    def schedule(self, scheduler, source: SnapshotSource, runs) -> None:
        """One APScheduler job per enabled audit (interval or cron), first runs after start_delay;
        each run counted in `runs` (a Counter labelled job, outcome)."""
        from apscheduler.triggers.cron import CronTrigger

        first = datetime.now(UTC) + timedelta(seconds=self.config.start_delay)
        for name in self.names():
            s = self.config.settings(name)
            trigger = (CronTrigger.from_crontab(s.cron, timezone="UTC") if s.cron else None)
            kwargs = ({"trigger": trigger} if trigger else
                      {"trigger": "interval", "seconds": s.interval or self.config.interval, "next_run_time": first})
            scheduler.add_job(self._scheduled, id=f"audit-{name}", args=[source, runs, name], **kwargs)

    async def _scheduled(self, source: SnapshotSource, runs, name: str) -> None:
        try:
            await self.run_on(source, [name], "schedule")
        except Exception:
            runs.labels(f"audit-{name}", "error").inc()
            log.exception("scheduled audit %s failed", name)
            return
        runs.labels(f"audit-{name}", "ok").inc()

    # --- escalation -----------------------------------------------------------------------------

    def standing(self, window_ns: int) -> list[Finding]:
        """The standing findings that open incidents, as correlator Findings of this window."""
        out = []
        for audit, findings in list(self._standing.items()):
            level = self.incident_level(audit)
            if level == "never" or not self.config.settings(audit).enabled:
                continue
            out += [to_finding(f, window_ns) for f in findings
                    if can_escalate(f) and SEVERITY_RANK[f.severity] >= SEVERITY_RANK[level]]
        return out
