"""The `poll` role in a cluster: each member polls its share of the switches (docs/cluster.md).

Membership (nms/app/membership.py) lives in the bus's bucket `<prefix>_members_poll`: heartbeats twice a
heartbeat, entries expiring 1.25 heartbeats after their last put, the live set read every eighth of a
heartbeat. The switches are split over the live members by rendezvous hashing (nms/rendezvous.py),
which every member computes alike, so no coordinator and no lock. A dead member's switches are taken
within 1.375 heartbeats (and polled within another sixteenth); one that stops cleanly hands them over
at the others' next check. A gNMI stream moves with its switch (the poller stops and starts it,
nms/app/polling.py).

A member that cannot reach the bus keeps polling the share it had (the others may take it too once
its entry expired): a switch polled twice for a while rather than by no one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from prometheus_client import Counter, Gauge

from nms.app.membership import CHECKS_PER_HEARTBEAT, STOP_GRACE_S, TTL_HEARTBEATS, Membership, default_member
from nms.bus import Bus
from nms.config.models import BusConfig, PollShardConfig
from nms.rendezvous import assign

log = logging.getLogger(__name__)
__all__ = ["CHECKS_PER_HEARTBEAT", "STOP_GRACE_S", "TTL_HEARTBEATS", "PollShard", "default_member"]


def _names(devices: set[str], limit: int = 8) -> str:
    shown = sorted(devices)[:limit]
    return ", ".join(shown) + (f" and {len(devices) - limit} more" if len(devices) > limit else "")


class _Metrics:
    def __init__(self, registry) -> None:
        self.owned = Gauge("nms_poll_owned_switches", "switches this member polls", registry=registry)
        self.shares = Gauge("nms_poll_member_switches", "switches each live poll member owns (as this member "
                            "computes it)", ["member"], registry=registry)
        self.handovers = Counter("nms_poll_handover_switches", "switches this member took or gave",
                                 ["direction"], registry=registry)
        self.bus_errors = Counter("nms_poll_membership_errors", "heartbeats or membership reads that failed",
                                  registry=registry)


class PollShard(Membership):
    def __init__(self, bus: Bus, bus_cfg: BusConfig, cfg: PollShardConfig, poller, registry) -> None:
        self.metrics = _Metrics(registry)
        super().__init__(bus, bus_cfg, "poll", cfg.member or default_member(), cfg.heartbeat, self.metrics.bus_errors,
                         registry, "poll shard", "switches", "polling")
        self.poller = poller
        self.switches = {device for _, device in poller.status}
        self.owned: set[str] = set()

    async def start(self, scheduler) -> None:
        """Join (first heartbeat), take this member's share, schedule it, then keep the membership."""
        await self.join()
        self.poller.owned = set(self.owned)
        self.poller.schedule(scheduler)
        self.keep()

    async def stop(self) -> None:
        """Leave: the others take the switches at their next check (bounded: Membership.leave)."""
        await self.leave()

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "owned": len(self.owned)}

    def share_size(self) -> int:
        return len(self.owned)

    async def changed(self, members: tuple[str, ...], joined: set[str], gone: set[str], initial: bool) -> None:
        """Take and give switches: the share of this member among `members`."""
        shares = assign(self.switches, members)
        owned = shares[self.member]
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
