"""The `poll` role in a cluster: each member polls its share of the switches (docs/cluster.md).

Membership lives in the bus: a key-value bucket `<prefix>_members_poll` whose entries expire 1.25
heartbeats after their last put. Every member renews its own entry twice a heartbeat (a renewal may
be 0.75 heartbeat late before the others count the member dead) and reads the live set every eighth of
a heartbeat; the switches are split over the live members by rendezvous hashing
(nms/rendezvous.py), which every member computes alike, so no coordinator and no lock. A member
that dies stops renewing: its entry expires and the others take its switches within 1.375
heartbeats (and start polling them within another sixteenth); a member that stops cleanly deletes
its entry (handed over at the others' next check). Stopping is bounded even when the bus does not
answer: the leave waits at most the entry's ttl (it is gone by then anyway).
A gNMI stream moves with its switch (the poller stops and starts it, nms/app/polling.py).

A member that cannot reach the bus keeps polling the share it had (the others may take it too once
its entry expired): a switch polled twice for a while rather than by no one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from typing import Any

from prometheus_client import Counter, Gauge

from nms.app.tasks import end_tasks
from nms.bus import Bus, BusError, KvSpec
from nms.config.models import BusConfig, PollShardConfig
from nms.rendezvous import assign

log = logging.getLogger(__name__)
TTL_HEARTBEATS = 1.25  # renewed every half heartbeat: a renewal may be 0.75 heartbeat late
CHECKS_PER_HEARTBEAT = 8
STOP_GRACE_S = 5.0  # the most stop() waits for the membership task to end


def default_member() -> str:
    """<hostname>-<pid> as one bus key token."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname()) or "host"
    return f"{host[:40]}-{os.getpid()}"


def _names(devices: set[str], limit: int = 8) -> str:
    shown = sorted(devices)[:limit]
    return ", ".join(shown) + (f" and {len(devices) - limit} more" if len(devices) > limit else "")


class _Metrics:
    def __init__(self, registry) -> None:
        self.members = Gauge("nms_cluster_members", "live members of a role seen in the bus", ["role"],
                             registry=registry)
        self.owned = Gauge("nms_poll_owned_switches", "switches this member polls", registry=registry)
        self.shares = Gauge("nms_poll_member_switches", "switches each live poll member owns (as this member "
                            "computes it)", ["member"], registry=registry)
        self.handovers = Counter("nms_poll_handover_switches", "switches this member took or gave",
                                 ["direction"], registry=registry)
        self.bus_errors = Counter("nms_poll_membership_errors", "heartbeats or membership reads that failed",
                                  registry=registry)


class PollShard:
    def __init__(self, bus: Bus, bus_cfg: BusConfig, cfg: PollShardConfig, poller, registry) -> None:
        self.bus, self.poller = bus, poller
        self.member = cfg.member or default_member()
        self.heartbeat_s = cfg.heartbeat
        self.spec = KvSpec(f"{bus_cfg.prefix}_members_poll", cfg.heartbeat * TTL_HEARTBEATS, bus_cfg.replicas)
        self.switches = {device for _, device in poller.status}
        self.members: tuple[str, ...] = ()
        self.owned: set[str] = set()
        self.metrics = _Metrics(registry)
        self._kv: Any = None
        self._task: asyncio.Task | None = None
        self._next_beat = 0.0
        self._started = time.time()
        self._bus_ok = True
        self._stopping = asyncio.Event()

    async def start(self, scheduler) -> None:
        """Join (first heartbeat), take this member's share, schedule it, then keep the membership."""
        self._kv = await self.bus.key_value(self.spec)
        await self._beat()
        await self.refresh(initial=True)
        self.poller.owned = set(self.owned)
        self.poller.schedule(scheduler)
        self._task = asyncio.create_task(self._keep(), name="poll-membership")

    async def stop(self) -> None:
        """Leave: stop renewing and delete the entry, so the others take the switches at their next check.
        Returns within STOP_GRACE_S + the entry's ttl, whether the bus answers or not."""
        self._stopping.set()
        if self._task is not None and not await end_tasks([self._task], STOP_GRACE_S):
            log.error("poll shard: the membership task of %s did not end within %g s", self.member, STOP_GRACE_S)
        kv, self._kv = self._kv, None  # leave once
        if kv is not None:
            try:
                await asyncio.wait_for(kv.delete(self.member), self.spec.ttl_s)
                log.info("poll shard: member %s left; its %d switches go to the others", self.member, len(self.owned))
            except (BusError, TimeoutError) as e:
                log.warning("poll shard: could not leave cleanly (%s); the entry expires in %.1f s",
                            str(e) or f"no answer within {self.spec.ttl_s:g} s", self.spec.ttl_s)

    async def _keep(self) -> None:
        while not self._stopping.is_set():  # besides the cancel, which a request may drop (_end)
            await asyncio.sleep(self.heartbeat_s / CHECKS_PER_HEARTBEAT)
            if self._stopping.is_set():
                return
            try:
                if time.monotonic() >= self._next_beat:
                    await self._beat()
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # the membership must outlive any one failure
                log.exception("poll shard: membership check failed")

    async def _beat(self) -> None:
        value = {"host": socket.gethostname(), "pid": os.getpid(), "since": self._started, "owned": len(self.owned)}
        try:
            await self._kv.put(self.member, json.dumps(value).encode())
        except BusError as e:
            self._bus_down(e)
            return
        self._next_beat = time.monotonic() + self.heartbeat_s / 2

    def _bus_down(self, error: BusError) -> None:
        self.metrics.bus_errors.inc()
        if self._bus_ok:
            log.warning("poll shard: the bus does not answer (%s); %s keeps polling its %d switches", error,
                        self.member, len(self.owned))
        self._bus_ok = False

    async def refresh(self, initial: bool = False) -> None:
        """Read the live members; take and give switches when the share changed."""
        try:
            live = set(await self._kv.items())
        except BusError as e:
            self._bus_down(e)
            return
        if not self._bus_ok:
            log.info("poll shard: the bus answers again")
            self._bus_ok = True
        live.add(self.member)  # alive by definition, even while its renewal is late
        members = tuple(sorted(live))
        if members == self.members:
            return
        joined, gone = set(members) - set(self.members), set(self.members) - set(members)
        if not initial:
            log.info("poll shard: members now %s (%s)", ", ".join(members),
                     "; ".join(filter(None, [joined and f"joined: {', '.join(sorted(joined))}",
                                             gone and f"gone: {', '.join(sorted(gone))}"])))
        self.members = members
        shares = assign(self.switches, members)
        owned = shares[self.member]
        self.metrics.members.labels("poll").set(len(members))
        for m in gone:
            with contextlib.suppress(KeyError):
                self.metrics.shares.remove(m)
        for m, share in shares.items():
            self.metrics.shares.labels(m).set(len(share))
        if initial:
            self.owned = owned
            log.info("poll shard: member %s joined %s; it polls %d of %d switches", self.member,
                     ", ".join(members), len(owned), len(self.switches))
        else:
            taken, given = await self.poller.set_owned(owned, spread_s=self.heartbeat_s / 16)
            self.owned = owned
            if taken:
                self.metrics.handovers.labels("taken").inc(len(taken))
                log.info("poll shard: %s took %d switches: %s", self.member, len(taken), _names(taken))
            if given:
                self.metrics.handovers.labels("given").inc(len(given))
                log.info("poll shard: %s gave %d switches: %s", self.member, len(given), _names(given))
        self.metrics.owned.set(len(self.owned))
