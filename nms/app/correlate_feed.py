"""A `correlate` member that does not run `api` takes its telemetry from the bus (docs/cluster.md).

It joins one durable consumer per telemetry stream, named after its group (cluster.correlate.group),
and hands every batch to the same entry point the API uses in a process that runs both roles
(Service.on_ingest: clock sync, NCCL jobs, the correlator). A message is acknowledged only after that
returned: the correlator has it in its pending context. A member killed before acknowledging leaves
the messages to be delivered again (after ack_wait) to the group's next member, which starts with an
empty context, so nothing is counted twice there. The correlator ADDS a window's sent/received to its
path's one-second slot (correlator/context.py), so a message delivered again to the member that
already took it would count twice: such a message (same stream position) is acknowledged, not handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from nms.app.correlate_partitions import owned, partitions
from nms.app.poll_shard import default_member
from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import FAMILIES, decode, family_subjects, stream_name
from nms.bus import Bus, BusError, BusUnavailable, Consumer, Message
from nms.config.models import BusConfig, CorrelateFeedConfig, FabricConfig

log = logging.getLogger(__name__)

REMEMBERED = 100_000  # stream positions handed, per stream (a redelivery comes within ack_wait)
STOP_GRACE_S = 5.0


class CorrelateFeed:
    def __init__(self, bus: Bus, bus_cfg: BusConfig, cfg: CorrelateFeedConfig, fabric: FabricConfig,
                 on_ingest: Callable[[str, list], list], registry: CollectorRegistry) -> None:
        self.bus, self.cfg, self.on_ingest = bus, cfg, on_ingest
        self.prefix = bus_cfg.prefix
        self.member = cfg.member or default_member()
        self.partitions = partitions(fabric, cfg.partitions)
        # no membership of correlate members yet (docs/cluster.md): this member is the only one
        self.owned = owned(self.partitions, (), self.member)
        self._handed: dict[str, OrderedDict[int, None]] = {f: OrderedDict() for f in FAMILIES}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.messages = Counter("nms_correlate_feed_messages", "telemetry messages taken from the bus by the "
                                "correlator, by outcome", ["family", "result"], registry=registry)
        Gauge("nms_correlate_owned_partitions", "fabric partitions this correlate member owns",
              registry=registry).set(len(self.owned))

    async def start(self) -> None:
        for family in FAMILIES:
            consumer = await self.bus.consumer(stream_name(self.prefix, family), self.cfg.group,
                                               family_subjects(self.prefix, family), self.cfg.ack_wait,
                                               max_pending=self.cfg.batch_messages * 16)
            self._tasks.append(asyncio.create_task(self._run(family, consumer), name=f"correlate-feed-{family}"))
        log.info("correlate feed: consuming the telemetry streams as %r; member %s owns %d of %d partitions "
                 "(split by %s)", self.cfg.group, self.member, len(self.owned), len(self.partitions),
                 self.cfg.partitions)

    async def stop(self) -> None:
        self._stopping.set()
        if self._tasks and not await end_tasks(self._tasks, STOP_GRACE_S):
            log.warning("correlate feed: consumer task(s) did not end within %g s", STOP_GRACE_S)
        self._tasks.clear()

    async def _run(self, family: str, consumer: Consumer) -> None:
        while not self._stopping.is_set():
            try:
                batch = await consumer.fetch(self.cfg.batch_messages, self.cfg.fetch_timeout)
            except BusUnavailable as e:
                log.warning("correlate feed: %s: %s; retrying", family, e)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 1.0)
                continue
            for msg in batch:
                try:
                    await self.handle(family, msg)
                except Exception:  # the loop outlives one message; unacknowledged, it comes back
                    log.exception("correlate feed: a %s message failed", family)

    async def handle(self, family: str, msg: Message) -> None:
        """Hand one message's records to the correlator's entry point, then acknowledge it."""
        handed = self._handed[family]
        if msg.deliveries > 1 and msg.seq in handed:
            self.messages.labels(family, "already_taken").inc()
            await msg.ack()
            return
        try:
            kind, records = decode(msg.subject, msg.data)
        except BusError as e:
            log.error("correlate feed: message dropped from delivery (it stays in the stream): %s", e)
            self.messages.labels(family, "undecodable").inc()
            await msg.term()
            return
        await asyncio.to_thread(self.on_ingest, kind, records)
        handed[msg.seq] = None
        if len(handed) > REMEMBERED:
            handed.popitem(last=False)
        await msg.ack()
        self.messages.labels(family, "taken" if msg.deliveries == 1 else "taken_again").inc()
