"""Every cluster member's health in the bus (docs/cluster.md, "Members' health"): each member with a
bus, whatever its roles, renews an entry in the bucket `<prefix>_members_any` (nms/app/membership.py)
every HEARTBEAT_S / 2 with its roles, process and health (store, bus, state store, its share of the
switches or partitions); an entry not renewed expires. Only API workers read the bucket: any of them
serves the entries
(`GET /cluster/members`, `nms_cluster_member_up` in its /metrics), and `nms cluster status` shows them,
so a poll, correlate or write member (which has no HTTP endpoint) is seen from outside.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from nms.app.membership import Membership
from nms.bus import Bus
from nms.config.models import BusConfig

log = logging.getLogger(__name__)

ROLE = "any"  # the bucket of every member, whatever its roles
HEARTBEAT_S = 10.0  # renewed every 5 s, gone 12.5 s after the last renewal


class MemberHealth(Membership):
    def __init__(self, bus: Bus, bus_cfg: BusConfig, member: str, roles: frozenset[str],
                 health: Callable[[], dict[str, Any]], registry: CollectorRegistry) -> None:
        errors = Counter("nms_member_health_bus_errors", "member health entries the bus did not take",
                         registry=registry)
        super().__init__(bus, bus_cfg, ROLE, member, HEARTBEAT_S, errors, registry, log_name="cluster members",
                         what="", verb="reporting")
        self.roles, self.health = roles, health
        self._health: dict[str, Any] = {"ok": None}  # the latest check (in a thread: a store's ping blocks)
        self._checked = 0.0
        self.up = Gauge("nms_cluster_member_up", "1 for each cluster member whose health entry is live in the "
                        "bus, by its roles and whether it says it is healthy", ["member", "roles", "ok"],
                        registry=registry)

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "roles": sorted(self.roles), "health": self._health}

    async def _check(self) -> None:
        try:
            self._health = await asyncio.to_thread(self.health)
        except Exception as e:  # an entry still goes out: the member is alive, its check failed
            self._health = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        self._checked = time.monotonic()

    async def join(self) -> None:
        await self._check()
        await super().join()

    async def changed(self, members: tuple[str, ...], joined: set[str], gone: set[str], initial: bool) -> None:
        return None  # nothing is shared out: the entries are the point

    async def refresh(self, initial: bool = False) -> None:
        if time.monotonic() - self._checked >= HEARTBEAT_S / 2:
            await self._check()
        if "api" not in self.roles:
            return  # only API workers serve the entries: the others put theirs and read none (N^2 reads)
        await super().refresh(initial)
        self.up.clear()
        for entry in self.entries():
            self.up.labels(entry["member"], ",".join(entry.get("roles", [])),
                           str(bool(entry.get("health", {}).get("ok"))).lower()).set(1)

    def entries(self) -> list[dict[str, Any]]:
        """The live members' entries as last read (this member's own as it is now), by name."""
        out = {self.member: {"member": self.member, **self.entry()}}
        for name, raw in self.latest.items():
            if name == self.member:
                continue
            try:
                out[name] = {"member": name, **json.loads(raw)}
            except ValueError:
                log.warning("members: %s's entry is not JSON; left out", name)
        return [out[name] for name in sorted(out)]
