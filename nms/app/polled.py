"""A `poll` member's records for the other members (docs/cluster.md): each poll's switch records
the correlator reads (port state and rates, queue rates, link events, interface addresses) published
on the bus's `polled` stream, which every correlate member reads in full (a switch's ports end links
of several partitions); with each poll's outcome (DeviceStatus), LLDP neighbours and device facts,
for every member's view of the whole fabric (nms/app/polled_view.py).

The poller stores its records itself, as without a bus; this is a copy for correlation, so it never
holds polling up: each poll's records are published in a task of their own, at most MAX_IN_FLIGHT at
once (beyond, a poll's copy is dropped and counted; the store has it), and a bus that does not answer
is logged once per outage and counted.

Interface addresses are walked every few minutes only (collectors/snmp/collector.py), while a correlate
member that starts re-reads only the stream's last `cluster.correlate.replay` (150 s by default): so a
device's latest addresses go out again, stamped with the time, with its first poll ADDRESSES_AGAIN_S
after they last went out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import POLLED, POLLED_KINDS, TelemetryPublisher
from nms.bus import BusError
from nms.records import DeviceStatus, InterfaceAddress

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
ADDRESSES_AGAIN_S = 60.0
STOP_GRACE_S = 5.0
_KIND_OF = {model: kind for kind, model in POLLED_KINDS.items()}


class PolledPublisher:
    def __init__(self, publisher: TelemetryPublisher, addresses_of: Callable[[str], Sequence[InterfaceAddress]],
                 registry: CollectorRegistry, member: str | None = None) -> None:
        self.publisher, self.addresses_of, self.member = publisher, addresses_of, member
        self._sent_addresses: dict[str, float] = {}  # device -> monotonic time its addresses last went out
        self._tasks: set[asyncio.Task[None]] = set()
        self._failing = False
        self.records = Counter("nms_polled_published_records", "switch records published for the correlate "
                               "members, by outcome", ["result"], registry=registry)

    def submit(self, records: Sequence[Any]) -> None:
        """One poll's records (call on the event loop): the correlator's kinds are published in the
        background."""
        groups: dict[str, list[Any]] = {}
        for r in records:
            kind = _KIND_OF.get(type(r))
            if kind is not None:
                groups.setdefault(kind, []).append(r)
        now = time.monotonic()
        for device in {r.device for r in records if hasattr(r, "device")}:
            if any(a.device == device for a in groups.get("interface_addresses", ())):
                self._sent_addresses[device] = now
            elif now - self._sent_addresses.get(device, -ADDRESSES_AGAIN_S) >= ADDRESSES_AGAIN_S:
                # stamped now: the set still holds as of this poll (and the same bytes again would be
                # taken for a duplicate within the stream's duplicate window and not stored)
                stamp = time.time_ns()
                again = [a.model_copy(update={"ts": stamp}) for a in self.addresses_of(device)]
                if again:
                    groups.setdefault("interface_addresses", []).extend(again)
                    self._sent_addresses[device] = now
        self._send(groups)

    def submit_status(self, status: DeviceStatus) -> None:
        """A poll's outcome (call on the event loop), named with this member, for the others' views."""
        self._send({"device_status": [status.model_copy(update={"member": self.member})]})

    def _send(self, groups: dict[str, list[Any]]) -> None:
        count = sum(len(g) for g in groups.values())
        if not count:
            return
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self.records.labels("dropped").inc(count)
            return
        task = asyncio.get_running_loop().create_task(self._publish(groups), name="polled-publish")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, groups: dict[str, list[Any]]) -> None:
        for kind, records in groups.items():
            try:
                await self.publisher.publish(kind, records, POLLED)
            except (BusError, TimeoutError) as e:
                self.records.labels("failed").inc(len(records))
                if not self._failing:
                    self._failing = True
                    log.warning("switch records not published for the correlate members (%s); they are stored, "
                                "and correlate members elsewhere miss them until the bus answers", e)
                continue
            self.records.labels("published").inc(len(records))
            if self._failing:
                self._failing = False
                log.info("switch records published for the correlate members again")

    async def close(self) -> None:
        """What is under way goes out (for STOP_GRACE_S at most), then the rest is cancelled."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        if self._tasks and not await end_tasks(list(self._tasks), 1.0):
            log.warning("polled records: %d publish task(s) did not end within %g s", len(self._tasks), STOP_GRACE_S)
