"""A `correlate` member that does not run `api` takes its telemetry from the bus, sharded by fabric
partition (docs/cluster.md).

Members of a group (cluster.correlate.group) keep a membership in `<prefix>_members_correlate`
(nms/app/membership.py) and split the partitions (nms/app/correlate_partitions.py) by rendezvous
hashing over the live members; each recomputes its share whenever the live set changes. Each member
reads every telemetry stream through its OWN durable consumer `<group>-<member>` and hands the
service's entry point (Service.on_ingest: clock sync, NCCL jobs, the correlator) only the records that
concern a partition it owns (Split.of_record); a message is acknowledged once that returned.

The correlator ADDS a window's sent/received to its path's one-second slot (correlator/context.py), so
no record may reach one correlator twice:
- a message delivered again to this member (an acknowledgement lost) is recognised by its stream
  position (the last REMEMBERED per stream) and acknowledged, not handed;
- a member that takes partitions re-reads the streams' retention from now - replay (an ephemeral
  consumer per stream) up to the position its live consumer reached, handing the records that concern
  a taken partition and none of the partitions whose records it had handed from that position (its
  share then, plus what earlier replays handed: `_handed_for`); live messages wait meanwhile and are
  handed with the new share after;
- a member starting (or restarting under the same name) deletes its old consumer and makes it anew from
  now - replay: it starts with an empty context, which that re-read fills; until every stream is read
  up to its end it holds no incident (on_owned(set())), so that no incident of its partitions is
  resolved for want of the findings its context does not yet give.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from nms.app.correlate_partitions import Split, owned
from nms.app.membership import Membership, default_member
from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import CORRELATED, VIEW_KINDS, decode, family_subjects, stream_name
from nms.bus import Bus, BusError, BusUnavailable, Consumer, Message
from nms.config.models import BusConfig, CorrelateFeedConfig, FabricConfig

log = logging.getLogger(__name__)

REMEMBERED = 100_000  # stream positions handed, per stream (a redelivery comes within ack_wait)
STOP_GRACE_S = 5.0
REPLAY_RETRY_S = 1.0  # a takeover's re-read of the streams, when the bus does not answer, is tried again after
HISTORY = 256  # ownership changes remembered per stream (older positions are past any replay)
# a member's consumer that nobody fetched from for this long is deleted by JetStream (a member killed
# without leaving). A live member fetches every fetch_timeout; an hour outlasts any NATS outage a member
# rides out while reconnecting (its partitions are taken by the others within 1.375 heartbeats anyway),
# and keeps default member names (<host>-<pid>, new at every start) from piling up consumers.
CONSUMER_IDLE_S = 3600.0


def _names(parts: set[str]) -> str:
    return "[" + ", ".join(sorted(parts)) + "]"


class CorrelateFeed(Membership):
    def __init__(self, bus: Bus, bus_cfg: BusConfig, cfg: CorrelateFeedConfig, fabric: FabricConfig,
                 on_ingest: Callable[[str, list], list], registry: CollectorRegistry, context_s: float = 10.0) -> None:
        errors = Counter("nms_correlate_membership_errors", "heartbeats or membership reads that failed",
                         registry=registry)
        super().__init__(bus, bus_cfg, "correlate", cfg.member or default_member(), cfg.heartbeat, errors, registry,
                         "correlate feed", "partitions", "correlating")
        self.cfg, self.on_ingest = cfg, on_ingest
        self.prefix = bus_cfg.prefix
        self.split = Split(fabric, cfg.partitions)
        self.partitions = self.split.parts
        self.owned: set[str] = set()
        self.consumer_name = f"{cfg.group}-{self.member}"
        self.replay_s = max(cfg.replay, context_s)
        # called in a worker thread with the owned partitions whenever they change (Service: the incidents)
        self.on_owned: Callable[[set[str]], None] | None = None
        self._handed: dict[str, OrderedDict[int, None]] = {f: OrderedDict() for f in CORRELATED}
        self._seen = dict.fromkeys(CORRELATED, 0)  # the newest stream position the live consumer took
        # per stream: (first position, the partitions whose records were handed from there on), rising
        self._handed_for: dict[str, list[tuple[int, frozenset[str]]]] = {f: [(0, frozenset())] for f in CORRELATED}
        self._handing = asyncio.Lock()  # one hand-over at a time: live messages wait for a takeover's replay
        self._tasks: list[asyncio.Task[None]] = []
        self._owning: set[asyncio.Task[None]] = set()
        self._caught_up: set[str] = set()  # the streams its live consumer has read to their end once
        self.messages = Counter("nms_correlate_feed_messages", "telemetry messages taken from the bus by the "
                                "correlator, by outcome", ["family", "result"], registry=registry)
        self.replayed = Counter("nms_correlate_replayed_records", "records re-read from the streams for "
                                "partitions taken", registry=registry)
        self.owned_gauge = Gauge("nms_correlate_owned_partitions", "fabric partitions this correlate member owns",
                                 registry=registry)

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "owned": sorted(self.owned)}

    def share_size(self) -> int:
        return len(self.owned)

    async def start(self) -> None:
        await self.join()  # this member's first share (nothing to replay: its consumers start below)
        start_s = time.time() - self.replay_s
        for family in CORRELATED:
            stream = stream_name(self.prefix, family)
            if await self.bus.delete_consumer(stream, self.consumer_name):
                log.info("correlate feed: consumer %s of %s (an earlier run of %s) deleted", self.consumer_name,
                         stream, self.member)
            consumer = await self.bus.consumer(stream, self.consumer_name, family_subjects(self.prefix, family),
                                               self.cfg.ack_wait, max_pending=self.cfg.batch_messages * 16,
                                               start_s=start_s, idle_s=CONSUMER_IDLE_S)
            self._tasks.append(asyncio.create_task(self._run(family, consumer), name=f"correlate-feed-{family}"))
        self.keep()
        log.info("correlate feed: consuming the telemetry streams as %r from %g s ago; member %s owns %d of %d "
                 "partitions (split by %s)", self.consumer_name, self.replay_s, self.member, len(self.owned),
                 len(self.partitions), self.cfg.partitions)

    async def stop(self) -> None:
        """Leave (the others take the partitions at their next check), then delete this member's consumers."""
        self._stopping.set()
        if (self._tasks or self._owning) and not await end_tasks([*self._tasks, *self._owning], STOP_GRACE_S):
            log.warning("correlate feed: consumer task(s) did not end within %g s", STOP_GRACE_S)
        self._tasks.clear()
        left = self._kv is not None
        await self.leave()
        if not left:
            return
        for family in CORRELATED:
            try:
                await asyncio.wait_for(self.bus.delete_consumer(stream_name(self.prefix, family), self.consumer_name),
                                       self.spec.ttl_s)
            except (BusError, TimeoutError) as e:
                log.warning("correlate feed: consumer %s of %s not deleted (%s); JetStream deletes it after %g s "
                            "idle", self.consumer_name, family, e or "no answer", CONSUMER_IDLE_S)

    # --- ownership -------------------------------------------------------------------------------

    async def changed(self, members: tuple[str, ...], joined: set[str], gone: set[str], initial: bool) -> None:
        share = owned(self.partitions, members, self.member)
        if initial:
            await self._own(share)
            return
        # in a task: the membership keeps beating while a takeover replays
        task = asyncio.create_task(self._own(share), name="correlate-takeover")
        self._owning.add(task)
        task.add_done_callback(self._owning.discard)

    async def _own(self, share: set[str]) -> None:
        async with self._handing:  # FIFO: successive changes apply in order
            taken, given = share - self.owned, self.owned - share
            if not taken and not given:
                return
            started = time.monotonic()
            replayed = await self._replay(taken) if taken and any(self._seen.values()) else 0
            for family, history in self._handed_for.items():
                upto = self._seen[family]
                history[:] = [(first, parts | taken) for first, parts in history if first <= upto]
                history.append((upto + 1, frozenset(share)))
                del history[:-HISTORY]
            self.owned = set(share)
            self.owned_gauge.set(len(share))
            if self.on_owned is not None:
                await asyncio.to_thread(self.on_owned, set(share) if self.ready else set())
            if taken:
                log.info("correlate member %s takes partitions %s (%d records re-read in %.2f s)", self.member,
                         _names(taken), replayed, time.monotonic() - started)
            if given:
                log.info("correlate member %s gives partitions %s", self.member, _names(given))

    @property
    def ready(self) -> bool:
        """The live consumers have read every stream to its end once (the start's re-read is done)."""
        return len(self._caught_up) == len(CORRELATED)

    async def _read_to_end(self, family: str) -> None:
        if family in self._caught_up:
            return
        async with self._handing:
            self._caught_up.add(family)
            if not self.ready:
                return
            if self.on_owned is not None:
                await asyncio.to_thread(self.on_owned, set(self.owned))
        log.info("correlate feed: %s has read the streams' last %g s; it now keeps the incidents of partitions %s",
                 self.member, self.replay_s, _names(self.owned))

    def _routed(self, kind: str, record: Any, parts: set[str]) -> bool:
        concerns = self.split.of_record(kind, record)
        return concerns is None or bool(concerns & parts)

    def _handed_at(self, family: str, seq: int) -> frozenset[str]:
        """The partitions whose records this member handed from stream position `seq`."""
        history = self._handed_for[family]
        return history[max(0, bisect.bisect_right(history, seq, key=lambda entry: entry[0]) - 1)][1]

    async def _replay(self, taken: set[str]) -> int:
        """Hand what the streams retain of the taken partitions, up to where the live consumers are, but
        no record this member handed already. A bus that does not answer (a NATS node died and its
        streams elect new leaders) is asked again every REPLAY_RETRY_S, from where the re-read got:
        the partitions are taken once they are re-read, never left without an owner."""
        start_s, count, done = time.time() - self.replay_s, 0, {}  # done: family -> last position handed
        failing = False
        while True:
            try:
                for family in CORRELATED:
                    count += await self._replay_family(family, taken, start_s, done)
                break
            except (BusUnavailable, TimeoutError) as e:
                if not failing:
                    failing = True
                    log.warning("correlate feed: re-reading partitions %s: %s; asking again every %g s",
                                _names(taken), e or "no answer", REPLAY_RETRY_S)
                await asyncio.sleep(REPLAY_RETRY_S)
        self.replayed.inc(count)
        return count

    async def _replay_family(self, family: str, taken: set[str], start_s: float, done: dict[str, int]) -> int:
        upto, count = self._seen[family], 0
        if not upto or done.get(family, 0) >= upto:
            return 0
        consumer = await self.bus.replay(stream_name(self.prefix, family), family_subjects(self.prefix, family),
                                         start_s)
        try:
            reached = False
            while not reached:
                batch = await consumer.fetch(self.cfg.batch_messages, self.cfg.fetch_timeout)
                if not batch:
                    break  # the rest is gone (the stream's retention)
                for msg in batch:
                    if msg.seq > upto:  # the live consumer hands it, with the new share
                        reached = True
                        break
                    if msg.seq > done.get(family, 0):  # not handed by an earlier try of this re-read
                        count += await self._replay_one(family, msg, taken)
                        done[family] = msg.seq
                    reached = msg.seq == upto
        finally:
            with contextlib.suppress(BusError, TimeoutError):
                await consumer.close()
        done[family] = upto
        return count

    async def _replay_one(self, family: str, msg: Message, taken: set[str]) -> int:
        try:
            kind, records = decode(msg.subject, msg.data)
        except BusError:
            return 0  # the live consumer terminated it
        if kind in VIEW_KINDS:
            return 0
        before = self._handed_at(family, msg.seq)
        mine = [r for r in records if (p := self.split.of_record(kind, r)) is not None and p & taken and not p & before]
        if mine:
            await asyncio.to_thread(self.on_ingest, kind, mine)
        return len(mine)

    # --- the live consumers ----------------------------------------------------------------------

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
            if not batch or batch[-1].pending == 0:
                await self._read_to_end(family)

    async def handle(self, family: str, msg: Message) -> None:
        """Hand one message's records of this member's partitions to the correlator's entry point, then
        acknowledge it."""
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
        async with self._handing:
            mine = [r for r in records if kind not in VIEW_KINDS and self._routed(kind, r, self.owned)]
            if mine:
                await asyncio.to_thread(self.on_ingest, kind, mine)
            handed[msg.seq] = None
            if len(handed) > REMEMBERED:
                handed.popitem(last=False)
            self._seen[family] = max(self._seen[family], msg.seq)
        await msg.ack()
        result = "taken" if msg.deliveries == 1 else "taken_again"
        self.messages.labels(family, result if mine else "not_owned").inc()
