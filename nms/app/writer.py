"""The `write` role (docs/cluster.md): the telemetry streams -> the store, in batches.

Every member joins one durable consumer per stream (`writer`), so the members share the messages.
A batch (up to cluster.write.batch_messages messages) is decoded, written, and flushed (in InfluxDB
or the store's on-disk spool) before its messages are acknowledged: a writer killed mid-batch leaves
them unacknowledged, and JetStream delivers them again after ack_wait. A batch written twice does
not double a point: its points carry the records' own timestamps and tags, and InfluxDB overwrites a
point with the same series and timestamp.

Points the store refuses at write (a field type conflict) go to its quarantine with the reason
(`nms store quarantine`); a message that is no telemetry batch is logged and terminated: it stays
in the stream (until its retention) and is never redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import FAMILIES, decode, family_subjects, stream_name
from nms.bus import Bus, BusError, BusUnavailable, Consumer, Message
from nms.config.models import BusConfig, WriterConfig
from nms.store import Point, StoreError, TimeSeriesStore

log = logging.getLogger(__name__)

DURABLE = "writer"
RETRY_DELAY_S = 2.0  # a batch the store did not take is delivered again after this
STOP_GRACE_S = 5.0  # the most a stop waits for a cancelled task to end


class BusWriter:
    def __init__(self, bus: Bus, bus_cfg: BusConfig, cfg: WriterConfig, store: TimeSeriesStore,
                 registry: CollectorRegistry) -> None:
        self.bus = bus
        self.prefix = bus_cfg.prefix
        self.cfg = cfg
        self.store = store
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.messages = Counter("nms_writer_messages", "telemetry messages handled by this writer, by outcome",
                                ["family", "result"], registry=registry)
        self.points = Counter("nms_writer_points", "points written by this writer, by outcome", ["result"],
                              registry=registry)

    async def start(self) -> None:
        for family in FAMILIES:
            consumer = await self.bus.consumer(stream_name(self.prefix, family), DURABLE,
                                               family_subjects(self.prefix, family), self.cfg.ack_wait,
                                               max_pending=self.cfg.batch_messages * 16)
            self._tasks.append(asyncio.create_task(self._run(family, consumer), name=f"writer-{family}"))
        log.info("writer: consuming %s as %r", ", ".join(stream_name(self.prefix, f) for f in FAMILIES), DURABLE)

    async def stop(self, timeout: float = 10.0) -> None:
        """Let the batches in hand finish (or be left unacknowledged), then stop."""
        self._stopping.set()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=timeout)
        if not await end_tasks(pending, STOP_GRACE_S):
            log.warning("writer: %d consumer task(s) did not end within %g s of being cancelled", len(pending),
                        STOP_GRACE_S)
        self._tasks.clear()

    async def _run(self, family: str, consumer: Consumer) -> None:
        while not self._stopping.is_set():
            try:
                batch = await consumer.fetch(self.cfg.batch_messages, self.cfg.fetch_timeout)
            except BusUnavailable as e:
                log.warning("writer: %s: %s; retrying", family, e)
                await self._pause(1.0)
                continue
            if batch:
                try:
                    await self.handle(family, batch)
                except Exception:  # the loop must outlive any one batch; its messages come back
                    log.exception("writer: a %s batch of %d messages failed", family, len(batch))
                    await self._nak(batch)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def handle(self, family: str, batch: list[Message]) -> None:
        """Decode, write and flush one batch, then acknowledge it (or have it delivered again)."""
        points: list[Point] = []
        good: list[Message] = []
        for msg in batch:
            try:
                _, records = decode(msg.subject, msg.data)
            except BusError as e:
                log.error("writer: message dropped from delivery (it stays in the stream): %s", e)
                self.messages.labels(family, "undecodable").inc()
                await msg.term()
                continue
            points.extend(record.to_point() for record in records)
            good.append(msg)
        if not good:
            return
        try:
            result = await asyncio.to_thread(self.store.write, points)
        except StoreError as e:
            log.warning("writer: the store did not take %d points (%s); delivered again in %g s",
                        len(points), e, RETRY_DELAY_S)
            await self._nak(good)
            return
        if result.rejected:
            self._keep_refused([(points[i], reason) for i, reason in result.rejected])
        if not await asyncio.to_thread(self.store.flush, self.cfg.flush_timeout):
            log.warning("writer: the store did not flush %d points within %g s; delivered again",
                        result.accepted, self.cfg.flush_timeout)
            await self._nak(good)
            return
        for msg in good:
            await msg.ack()
        again = sum(1 for m in good if m.deliveries > 1)
        if again:
            log.info("writer: %d %s messages delivered again (a writer died or the store was slow) stored; "
                     "a point written twice overwrites itself", again, family)
        self.points.labels("stored").inc(result.accepted)
        self.messages.labels(family, "stored").inc(len(good) - again)
        self.messages.labels(family, "stored_again").inc(again)

    def _keep_refused(self, refused: list[tuple[Point, str]]) -> None:
        self.points.labels("refused").inc(len(refused))
        kept = self.store.keep_refused(refused)
        if kept < len(refused):
            for point, reason in refused[:10]:
                log.error("writer: %s point at %d refused and not kept: %s", point.measurement, point.ts, reason)

    async def _nak(self, batch: list[Any]) -> None:
        for msg in batch:
            with contextlib.suppress(Exception):  # unacknowledged, it comes back after ack_wait anyway
                await msg.nak(RETRY_DELAY_S)
