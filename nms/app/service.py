"""The service process: telemetry store, state, scheduler; the API (nms.app.api) runs on top."""

from __future__ import annotations

import asyncio
import logging
import time

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from nms.app.metrics import ServiceMetrics
from nms.app.plugins import open_store
from nms.app.polling import Poller
from nms.config import NmsConfig
from nms.state import StateStore
from nms.store import TimeSeriesStore

log = logging.getLogger(__name__)


class Service:
    def __init__(self, config: NmsConfig, store: TimeSeriesStore | None = None):
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else open_store(config)
        self.state = StateStore(config.data_dir / "state.sqlite")
        self.metrics = ServiceMetrics()
        self.metrics.watch_store(self.store.stats, self.store.name)
        self.scheduler: AsyncIOScheduler | None = None
        self.started_at = time.time()
        self.poller = Poller(config, self.store, self.metrics.registry)  # switch collectors, by entry point

    async def start(self) -> None:
        """Start the scheduler on the running event loop: store retention and one polling job per
        (collector, device)."""
        self.scheduler = AsyncIOScheduler(
            timezone="UTC", job_defaults={"misfire_grace_time": int(self.config.scheduler.misfire_grace),
                                          "coalesce": True, "max_instances": 1})
        retention = getattr(self.store, "retention_s", None)
        if retention:
            self.scheduler.add_job(self._prune, "interval", seconds=self.config.scheduler.retention_interval,
                                   id="store-retention", args=[retention])
        if self.config.polling.enabled:
            self.poller.schedule(self.scheduler)
        self.scheduler.start()
        log.info("service started: store=%s, api on %s:%d", self.store.name,
                 self.config.api.host, self.config.api.port)

    async def _prune(self, retention_s: float) -> None:
        cutoff = time.time_ns() - int(retention_s * 1e9)
        try:
            deleted = await asyncio.to_thread(self.store.prune, cutoff)
            self.metrics.scheduler_runs.labels("store-retention", "ok").inc()
            log.info("retention: deleted %d rows older than %.0f s", deleted, retention_s)
        except Exception:
            self.metrics.scheduler_runs.labels("store-retention", "error").inc()
            log.exception("retention run failed")

    async def stop(self) -> None:
        """Clean shutdown: stop scheduling, flush the store (or spool it), close state."""
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        await self.poller.close()
        await asyncio.to_thread(self.store.close)
        self.state.close()
        log.info("service stopped; store flushed")
