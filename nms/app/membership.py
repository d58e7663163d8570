"""The live members of a cluster role, kept in the bus (docs/cluster.md): what `poll` and `correlate`
members share (nms/app/poll_shard.py, nms/app/correlate_feed.py).

Membership lives in a key-value bucket `<prefix>_members_<role>` whose entries expire 1.25 heartbeats
after their last put. Every member renews its own entry twice a heartbeat (a renewal may be 0.75
heartbeat late before the others count the member dead) and reads the live set every eighth of a
heartbeat; when the set changed, `changed()` (the subclass's) is called, and the subclass recomputes
its share by rendezvous hashing (nms/rendezvous.py), which every member computes alike: no
coordinator, no lock. A member that dies stops renewing: its entry expires and the others see it gone
within 1.375 heartbeats; one that stops cleanly deletes its entry (gone at the others' next check).
Stopping is bounded even when the bus does not answer: the leave waits at most the entry's ttl (it is
gone by then anyway).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable
from typing import Any
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge

from nms.app.tasks import end_tasks
from nms.bus import Bus, BusError, KvSpec
from nms.config.models import BusConfig

log = logging.getLogger(__name__)
TTL_HEARTBEATS = 1.25  # renewed every half heartbeat: a renewal may be 0.75 heartbeat late
CHECKS_PER_HEARTBEAT = 8
STOP_GRACE_S = 5.0  # the most stop() waits for the membership task to end

# nms_cluster_members{role}: one gauge per registry, whatever roles a process runs
_MEMBER_GAUGES: WeakKeyDictionary[CollectorRegistry, Gauge] = WeakKeyDictionary()


def default_member() -> str:
    """<hostname>-<pid> as one bus key token."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname()) or "host"
    return f"{host[:40]}-{os.getpid()}"


def members_gauge(registry: CollectorRegistry) -> Gauge:
    if registry not in _MEMBER_GAUGES:
        _MEMBER_GAUGES[registry] = Gauge("nms_cluster_members", "live members of a role seen in the bus", ["role"],
                                         registry=registry)
    return _MEMBER_GAUGES[registry]


def bucket_spec(bus_cfg: BusConfig, role: str, heartbeat_s: float) -> KvSpec:
    """The bucket of `role`'s members (also made ahead by `nms cluster up`, before any member starts)."""
    return KvSpec(f"{bus_cfg.prefix}_members_{role}", heartbeat_s * TTL_HEARTBEATS, bus_cfg.replicas)


class Membership:
    """One member of `role`. Subclasses implement changed() and may add to entry() (what the member
    puts in its bucket entry). `what` and `verb` name the member's share in log lines ("switches",
    "polling")."""

    def __init__(self, bus: Bus, bus_cfg: BusConfig, role: str, member: str, heartbeat_s: float,
                 errors: Counter, registry: CollectorRegistry, log_name: str, what: str, verb: str) -> None:
        self.bus, self.role, self.member, self.heartbeat_s = bus, role, member, heartbeat_s
        self.spec = bucket_spec(bus_cfg, role, heartbeat_s)
        self.members: tuple[str, ...] = ()
        self.latest: dict[str, bytes] = {}  # the live entries as last read (member -> its entry's JSON)
        self.members_gauge = members_gauge(registry)
        self.bus_errors = errors
        self.log_name, self.what, self.verb = log_name, what, verb  # "poll shard", "switches", "polling"
        self._kv: Any = None
        self._task: asyncio.Task | None = None
        self._next_beat = 0.0
        self._started = time.time()
        self._bus_ok = True
        self._back_until = 0.0  # monotonic: till then, a member missing from the bucket is not gone
        self._down_since = 0.0  # monotonic: when the bus stopped answering
        self._stopping = asyncio.Event()

    # --- what a subclass provides ----------------------------------------------------------------

    async def changed(self, members: tuple[str, ...], joined: set[str], gone: set[str], initial: bool) -> None:
        """The live set is now `members` (this member among them)."""
        raise NotImplementedError

    def entry(self) -> dict[str, Any]:
        """This member's bucket entry (host, pid, start, and what the subclass adds)."""
        return {"host": socket.gethostname(), "pid": os.getpid(), "since": self._started}

    def share_size(self) -> int:
        """How much this member holds (for the bus-down warning)."""
        return 0

    # --- the membership --------------------------------------------------------------------------

    async def join(self) -> None:
        """The first heartbeat and the first read of the live set (changed(..., initial=True))."""
        self._kv = await self.bus.key_value(self.spec)
        await self._beat(patient=True)
        await self.refresh(initial=True)

    def keep(self) -> None:
        """Keep the membership (heartbeats, checks) in a task until leave()."""
        self._task = asyncio.create_task(self._keep(), name=f"{self.role}-membership")

    async def leave(self) -> None:
        """Stop renewing and delete the entry, so the others take the share at their next check.
        Returns within STOP_GRACE_S + the entry's ttl, whether the bus answers or not."""
        self._stopping.set()
        if self._task is not None and not await end_tasks([self._task], STOP_GRACE_S):
            log.error("%s: the membership task of %s did not end within %g s", self.log_name, self.member,
                      STOP_GRACE_S)
        kv, self._kv = self._kv, None  # leave once
        if kv is not None:
            try:
                await asyncio.wait_for(kv.delete(self.member), self.spec.ttl_s)
                share = f"; its {self.share_size()} {self.what} go to the others" if self.what else ""
                log.info("%s: member %s left%s", self.log_name, self.member, share)
            except (BusError, TimeoutError) as e:
                log.warning("%s: could not leave cleanly (%s); the entry expires in %.1f s", self.log_name,
                            str(e) or f"no answer within {self.spec.ttl_s:g} s", self.spec.ttl_s)

    async def _keep(self) -> None:
        while not self._stopping.is_set():  # besides the cancel, which a request may drop (tasks.end_tasks)
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
                log.exception("%s: membership check failed", self.log_name)

    async def _ask(self, operation: Awaitable[Any], patient: bool) -> Any:
        """A bucket operation; once joined, given up after half a heartbeat: a later answer is a
        renewal missed anyway, and waiting out the bus's own timeout (5 s) would put the next try past
        the others' patience once an outage ends (they count nobody gone for one heartbeat after it)."""
        return await (operation if patient else asyncio.wait_for(operation, self.heartbeat_s / 2))

    async def _beat(self, patient: bool = False) -> None:
        try:
            await self._ask(self._kv.put(self.member, json.dumps(self.entry()).encode()), patient)
        except (BusError, TimeoutError) as e:
            self._bus_down(e)
            return
        self._next_beat = time.monotonic() + self.heartbeat_s / 2

    def _bus_down(self, error: Exception) -> None:
        self.bus_errors.inc()
        if self._bus_ok:
            self._down_since = time.monotonic()
            keeps = f"; {self.member} keeps {self.verb} its {self.share_size()} {self.what}" if self.what else ""
            log.warning("%s: the bus does not answer (%s)%s", self.log_name,
                        str(error) or f"nothing within {self.heartbeat_s / 2:g} s", keeps)
        self._bus_ok = False

    async def refresh(self, initial: bool = False) -> None:
        """Read the live members; call changed() when the set is not what it was."""
        try:
            self.latest = await self._ask(self._kv.items(), patient=initial)
            live = set(self.latest)
        except (BusError, TimeoutError) as e:
            self._bus_down(e)
            return
        if not self._bus_ok:
            log.info("%s: the bus answers again", self.log_name)
            self._bus_ok = True
            if time.monotonic() - self._down_since >= self.heartbeat_s / 4:  # not one slow answer: an outage
                self._back_until = time.monotonic() + self.heartbeat_s
        live.add(self.member)  # alive by definition, even while its renewal is late
        if time.monotonic() < self._back_until:
            # the entries may have expired while the bus was away (or its bucket was made again): the
            # others renew within half a heartbeat of its return, so nobody is gone before a heartbeat
            live |= set(self.members)
        members = tuple(sorted(live))
        if members == self.members:
            return
        joined, gone = set(members) - set(self.members), set(self.members) - set(members)
        if not initial:
            log.info("%s: members now %s (%s)", self.log_name, ", ".join(members),
                     "; ".join(filter(None, [joined and f"joined: {', '.join(sorted(joined))}",
                                             gone and f"gone: {', '.join(sorted(gone))}"])))
        self.members = members
        self.members_gauge.labels(self.role).set(len(members))
        await self.changed(members, joined, gone, initial)
