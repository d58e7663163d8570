"""Every member's view of the whole fabric in a cluster (docs/cluster.md, "The devices, cluster-wide").

A `poll` member polls its share of the switches; what it learns goes out on the bus's `polled`
stream (nms/app/polled.py): port samples and rates, link events, interface addresses, and for the
views each poll's outcome (DeviceStatus, named with the member), LLDP neighbours and device facts.
A member with `api` or `correlate` follows that stream and files what other members polled into its
own poller's recent window and `remote` statuses, so that `/devices`, `/ports`, `/links/events`,
`/topology`, the live fabric view and the correlator's topology show every switch, whichever member
polls it, and an API worker that polls nothing shows them all. A process that correlates in-process
(`api,correlate`) hands the records its correlator reads to it from here too.

One consumer of this process alone per kind (not acknowledged, nothing kept on the bus): at start,
and again after the bus was away, each re-reads what a view needs of the stream's past (BACKLOG_S:
the latest status of a device in backoff is up to `polling.backoff_max` old, its samples only an
interval) and then follows. Filing is newest-wins per port and device, and an event is filed once,
so reading a stretch twice changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from nms.app.polling import Poller
from nms.app.tasks import end_tasks
from nms.app.telemetry_bus import POLLED, VIEW_KINDS, decode, stream_name
from nms.bus import Bus, BusError
from nms.config.models import BusConfig
from nms.records import DeviceStatus, InterfaceAddress, LldpNeighbor, PortSample

log = logging.getLogger(__name__)

FETCH_MESSAGES = 256
FETCH_TIMEOUT_S = 1.0
RETRY_S = 2.0  # after the bus failed a consumer, wait this long and start it again
OVERLAP_S = 5.0  # a consumer started again re-reads from this long before its last answer
STOP_GRACE_S = 5.0
PRUNE_EVERY_S = 1.0


def backlogs(recent_window_s: float, backoff_max_s: float) -> dict[str, float]:
    """kind -> how far back a consumer starting now re-reads the stream (seconds)."""
    view = backoff_max_s + 60.0  # a failing device's status goes out at each retry, backoff_max apart
    return {"device_status": view, "lldp_neighbors": view, "device_facts": view,
            "interface_addresses": 120.0,  # sent again every minute (nms/app/polled.py)
            "port_samples": 60.0, "port_rates": 60.0,  # the latest of each port; polls come at least every minute
            "link_events": recent_window_s}


class PolledView:
    def __init__(self, bus: Bus, cfg: BusConfig, poller: Poller, registry: CollectorRegistry,
                 to_correlator: Callable[[list[Any]], None] | None = None, correlator_since_s: float = 150.0) -> None:
        self.bus, self.prefix, self.poller = bus, cfg.prefix, poller
        # a process correlating in-process (`api,correlate`) joins no correlate feed: the records of
        # switches other members poll reach its correlator from here, those of the last
        # correlator_since_s only (what a correlate member re-reads at its start)
        self.to_correlator, self.correlator_since_s = to_correlator, correlator_since_s
        polling = poller.config.polling
        self.backlog = backlogs(polling.recent_window, polling.backoff_max)
        self._tasks: list[asyncio.Task[None]] = []
        self._filed_events: dict[tuple[str, str], int] = {}  # (device, port) -> the newest event filed
        self._failing = False
        self._pruned = 0.0  # monotonic: when the recent window was last pruned of what aged out
        self.records = Counter("nms_polled_view_records", "other members' switch records filed into this "
                               "member's view of the fabric, by kind", ["kind"], registry=registry)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(kind), name=f"polled-view-{kind}") for kind in self.backlog]

    async def stop(self) -> None:
        if not await end_tasks(self._tasks, STOP_GRACE_S):
            log.warning("polled view: a consumer did not stop within %g s", STOP_GRACE_S)
        self._tasks = []

    async def _follow(self, kind: str) -> None:
        start_s = time.time() - self.backlog[kind]
        stream, subjects = stream_name(self.prefix, POLLED), f"{self.prefix}.tel.{POLLED}.{kind}.*"
        while True:
            consumer = None
            try:
                consumer = await self.bus.replay(stream, subjects, start_s)
                while True:
                    batch = await consumer.fetch(FETCH_MESSAGES, FETCH_TIMEOUT_S)
                    for msg in batch:
                        self._file(msg.subject, msg.data)
                    if not batch or batch[-1].pending == 0:  # caught up: a restart re-reads from about here
                        start_s = time.time() - OVERLAP_S
                    if self._failing:
                        self._failing = False
                        log.info("polled view: following the other poll members' switches again")
            except (BusError, TimeoutError) as e:
                if not self._failing:
                    self._failing = True
                    log.warning("polled view: the bus does not answer (%s); the switches other members poll "
                                "keep their last known state here until it does", e)
            finally:
                if consumer is not None:
                    with contextlib.suppress(BusError, TimeoutError):
                        await consumer.close()
            await asyncio.sleep(RETRY_S)

    def _file(self, subject_: str, data: bytes) -> None:
        try:
            kind, records = decode(subject_, data)
        except BusError as e:
            log.warning("polled view: a message left out: %s", e)
            return
        elsewhere = [r for r in records if not self.poller.polls_here(r.device)]
        if not elsewhere:
            return
        file_records(self.poller, kind, elsewhere, self._filed_events)
        self.records.labels(kind).inc(len(elsewhere))
        if (now := time.monotonic()) >= self._pruned + PRUNE_EVERY_S:  # a scan of every port: not per message
            self._pruned = now
            self.poller.recent.prune(time.time_ns())
        if self.to_correlator is not None and kind not in VIEW_KINDS:
            since = time.time_ns() - int(self.correlator_since_s * 1e9)
            if recent := [r for r in elsewhere if r.ts >= since]:
                self.to_correlator(recent)


def file_records(poller: Poller, kind: str, records: Sequence[Any], filed_events: dict[tuple[str, str], int]) -> None:
    """Records another member polled, filed into this poller's view as its own polls would be."""
    recent = poller.recent
    if kind == "device_status":
        for status in records:
            key = (status.collector, status.device)
            if key in poller.status and _newer(status, poller.remote.get(key)):
                poller.remote[key] = status
                if status.covers or status.device in recent.covered:  # a fabric manager's switches
                    recent.covered[status.device] = set(status.covers)
    elif kind == "port_samples":
        for sample in records:
            _file_sample(recent.samples, sample)
    elif kind == "port_rates":
        for rate in records:
            last = recent.rates.get((rate.device, rate.port))
            if last is None or rate.ts > last.ts:
                recent.rates[(rate.device, rate.port)] = rate
    elif kind == "link_events":
        for event in records:
            key = (event.device, event.port)
            if event.ts > filed_events.get(key, 0):
                filed_events[key] = event.ts
                recent.events.append(event)
                poller.links.record(event)
    elif kind == "interface_addresses":
        for device, found in _by_device(records).items():
            recent.addresses[device] = found  # a device's addresses go out whole
    elif kind == "lldp_neighbors":
        recent.neighbors.update(_by_device(records))
    elif kind == "device_facts":
        for facts in records:
            last = recent.facts.get(facts.device)
            if last is None or facts.ts > last.ts:
                recent.facts[facts.device] = facts


def _newer(status: DeviceStatus, last: DeviceStatus | None) -> bool:
    return last is None or (status.last_poll_ns or 0) >= (last.last_poll_ns or 0)


def _file_sample(samples: dict[tuple[str, str], PortSample], sample: PortSample) -> None:
    key = (sample.device, sample.port)
    last = samples.get(key)
    if last is not None and sample.ts <= last.ts:
        return
    if all(getattr(sample, c) is None for c in PortSample.traffic_counters):  # a streamed status change
        if last is not None:
            samples[key] = last.model_copy(update={"oper_status": sample.oper_status})
        return
    samples[key] = sample


def _by_device(records: Sequence[InterfaceAddress | LldpNeighbor]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for r in records:
        groups.setdefault(r.device, []).append(r)
    return groups

