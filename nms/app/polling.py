"""Scheduled polling: one APScheduler job per (collector, device), isolated from each other.

Each job runs the collector with the device's deadline. A failure (timeout, auth, bad response) is
recorded on that device only; the device is then retried with exponential backoff (interval x
2^(failures-1), at most `polling.backoff_max`), and no other device or later cycle waits for it.
Results become rates (nms.counters: PortRates, and QueueRates of egress queues), link events and
flap counts (nms.linkstate), go to the store and to an in-memory recent window that the API's
/topology, /devices and /ports read (and that keeps each device's latest interface addresses for the
correlator). `on_records`, when set, sees every poll's records plus the derived ones (PortRates,
QueueRates, LinkEvent).

A successful poll's problems (PollResult.problems: what it left out and why) are counted per device
and collector: the latest poll's (the first PROBLEMS_KEPT of them, and how many) and a running total,
in the device's status (GET /devices) and in /metrics; a stream's batches count as its polls.

A poll may report several devices: a fabric manager (UFM) is polled as one device and returns the
records of the switches it manages. The devices a poll covers are the ones its DeviceFacts name
(the polled device's own facts come first); each gets its facts and LLDP neighbours filed under its
own name, and counts as reachable while the polled device's last poll succeeded.

In a cluster a `poll` member polls its share of the devices (nms/app/poll_shard.py: set_owned). A device
it gives away is forgotten here once no poll of it is under way: its ports' previous samples and link
states (those of the switches a fabric manager reported with it too) and the collector's session and
state of it (Collector.forget: a CLI device's SSH session, a UFM server's client and event cursor). The
member that takes it starts from its first poll, and so does this one if it takes the device back later:
never from state that the other member's polls made stale (a rate spanning the other member's tenure,
a link change it reported already).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.jobstores.base import JobLookupError
from prometheus_client import Counter, Gauge, Histogram

from nms.app.plugins import load_plugin
from nms.app.tasks import end_tasks
from nms.config import NmsConfig
from nms.config.collectors import COLLECTOR_GROUP as COLLECTOR_GROUP  # also for callers of the poller
from nms.config.models import SwitchConfig
from nms.counters import FIRST, HELD, RateTracker
from nms.linkstate import LinkStateTracker
from nms.records import (
    PROBLEMS_KEPT,
    DeviceFacts,
    DeviceStatus,
    FabricTopology,
    InterfaceAddress,
    LinkEvent,
    LldpNeighbor,
    PollProblem,
    PortRates,
    PortSample,
    QueueSample,
)
from nms.topology import build_topology

log = logging.getLogger(__name__)
NS = 10**9
STOP_GRACE_S = 5.0  # the most a stop waits for a cancelled task to end


def load_collectors(config: NmsConfig) -> dict[str, Any]:
    """The collectors that at least one configured switch uses, found by entry-point name."""
    names = sorted({name for s in config.fabric.switches for name in s.collectors})
    return {name: load_plugin(COLLECTOR_GROUP, name).from_config(config) for name in names}


@dataclass
class _Status:
    device: SwitchConfig
    collector: str
    interval_s: float
    deadline_s: float
    state: str = "pending"
    polls: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_poll_ns: int | None = None
    last_success_ns: int | None = None
    last_duration_s: float | None = None
    last_error_kind: str | None = None
    last_error: str | None = None
    next_attempt_ns: int | None = None
    records: int = 0
    problems: int = 0
    last_problem_count: int = 0
    last_problems: list[PollProblem] = field(default_factory=list)
    covers: list[str] = field(default_factory=list)  # the other devices its last successful poll reported

    def snapshot(self) -> DeviceStatus:
        return DeviceStatus(device=self.device.name, collector=self.collector, address=self.device.mgmt_address,
                            state=self.state, interval_s=self.interval_s, deadline_s=self.deadline_s,
                            polls=self.polls, failures=self.failures, consecutive_failures=self.consecutive_failures,
                            last_poll_ns=self.last_poll_ns, last_success_ns=self.last_success_ns,
                            last_duration_s=self.last_duration_s, last_error_kind=self.last_error_kind,
                            last_error=self.last_error, next_attempt_ns=self.next_attempt_ns, records=self.records,
                            problems=self.problems, last_problem_count=self.last_problem_count,
                            last_problems=list(self.last_problems), covers=list(self.covers))


@dataclass
class RecentWindow:
    """What the API shows without a store query: the latest per port/device, recent events."""

    window_s: float
    samples: dict[tuple[str, str], PortSample] = field(default_factory=dict)
    rates: dict[tuple[str, str], PortRates] = field(default_factory=dict)
    neighbors: dict[str, list[LldpNeighbor]] = field(default_factory=dict)
    facts: dict[str, DeviceFacts] = field(default_factory=dict)
    events: deque[LinkEvent] = field(default_factory=lambda: deque(maxlen=10_000))
    # device -> its interface addresses from the latest poll that read them (collectors read them
    # only now and then, so not pruned by the window; replaced whole, an empty list included)
    addresses: dict[str, list[InterfaceAddress]] = field(default_factory=dict)
    # polled device -> the other devices its latest poll reported (a fabric manager's switches)
    covered: dict[str, set[str]] = field(default_factory=dict)

    def prune(self, now_ns: int) -> None:
        cutoff = now_ns - int(self.window_s * NS)
        while self.events and self.events[0].ts < cutoff:
            self.events.popleft()
        for store in (self.samples, self.rates):
            for key in [k for k, v in store.items() if v.ts < cutoff]:
                del store[key]


class _Metrics:
    def __init__(self, registry) -> None:
        self.polls = Counter(
            "nms_collector_polls", "device polls", ["collector", "device", "result"], registry=registry
        )
        self.seconds = Histogram("nms_collector_poll_seconds", "time to poll one device", ["collector"],
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=registry)
        self.up = Gauge("nms_collector_device_up", "1 when the device's last poll succeeded",
                        ["collector", "device"], registry=registry)
        self.failing = Gauge("nms_collector_consecutive_failures", "failed polls in a row",
                             ["collector", "device"], registry=registry)
        self.last_success = Gauge("nms_collector_last_success_timestamp_seconds", "end of the last good poll",
                                  ["collector", "device"], registry=registry)
        self.records = Counter("nms_collector_records", "records produced", ["collector", "kind"], registry=registry)
        self.dropped = Counter(
            "nms_collector_rate_intervals_dropped",
            "rate intervals dropped (reboot, reset, discontinuity)",
            ["collector"],
            registry=registry,
        )
        self.store_errors = Counter("nms_collector_store_errors", "batches the store refused", ["collector"],
                                    registry=registry)
        self.problems = Counter("nms_collector_poll_problems", "things successful polls left out (PollResult.problems)",
                                ["collector", "device"], registry=registry)
        self.last_problems = Gauge("nms_collector_last_poll_problems", "things the device's last successful poll "
                                   "left out", ["collector", "device"], registry=registry)


class Poller:
    def __init__(self, config: NmsConfig, store, registry, collectors: dict[str, Any] | None = None,
                 on_records: Callable[[list[Any]], Any] | None = None):
        self.config = config
        self.store = store
        # called once per successful poll with its records + the derived PortRates and LinkEvents,
        # after the recent window is updated and before the store write; may be a coroutine
        # function; its exceptions are logged, never stop polling. Settable at any time.
        self.on_records = on_records
        # called with each poll's outcome (the device's status after it); set by a cluster's poll member
        self.on_status: Callable[[DeviceStatus], Any] | None = None
        # (collector, device) -> the latest status other members published (nms/app/polled_view.py)
        self.remote: dict[tuple[str, str], DeviceStatus] = {}
        self.collectors = collectors if collectors is not None else load_collectors(config)
        self.metrics = _Metrics(registry)
        t = config.thresholds
        self.links = LinkStateTracker(t.flap_count, t.flap_window)
        self.rates = {name: RateTracker(c.counter_bits, config.polling.max_utilization,
                                         config.polling.unchanged_hold)
                      for name, c in self.collectors.items()}
        self.recent = RecentWindow(config.polling.recent_window)
        self.status: dict[tuple[str, str], _Status] = {}
        self._streams: dict[tuple[str, str], asyncio.Task] = {}  # streaming collectors' open streams
        self._read_by: dict[str, list[str]] = {}  # device -> the collectors that read it
        self._polling: set[tuple[str, str]] = set()  # (collector, device) polls under way
        self._to_forget: list[tuple[str, str]] = []  # given away: the collectors forget them (_forget)
        self._forgetting: asyncio.Task | None = None
        # the devices this process polls: None for all of them (one process); a cluster member's
        # share otherwise (nms/app/poll_shard.py sets it through set_owned)
        self.owned: set[str] | None = None
        self._scheduler: Any = None
        for device in config.fabric.switches:
            for name, collector in self.collectors.items():
                if collector.settings(device) is not None:
                    sched = collector.schedule(device)
                    self.status[(name, device.name)] = _Status(device, name, sched.interval_s, sched.deadline_s)
                    self._read_by.setdefault(device.name, []).append(name)

    # -- scheduling ----------------------------------------------------------------------------

    def schedule(self, scheduler) -> None:
        """One interval job per (collector, device), the first runs spread over one interval; one
        stream per device of a streaming collector (call with the event loop running). Only the
        owned devices, when `owned` is set."""
        self._scheduler = scheduler
        now = datetime.now(UTC)
        mine = {k: st for k, st in self.status.items() if self.owned is None or k[1] in self.owned}
        streamed = {k for k, st in mine.items() if self.collectors[k[0]].streams(st.device)}
        polled = sorted((k, st) for k, st in mine.items() if k not in streamed)
        n = max(len(polled), 1)
        for key in sorted(streamed):
            self._start(key, now)
        for i, (key, st) in enumerate(polled):
            self._start(key, now + timedelta(seconds=st.interval_s * i / n / 4))

    def _start(self, key: tuple[str, str], first_run: datetime) -> None:
        name, device = key
        st = self.status[key]
        if self.collectors[name].streams(st.device):
            if key not in self._streams:
                self._streams[key] = asyncio.get_running_loop().create_task(self._keep_streaming(*key),
                                                                            name=f"stream-{name}-{device}")
            return
        self._scheduler.add_job(self.poll, "interval", seconds=st.interval_s, id=f"collect-{name}-{device}",
                                args=[name, device], next_run_time=first_run, max_instances=1, coalesce=True,
                                misfire_grace_time=max(1, int(st.interval_s)), replace_existing=True)

    async def _stop(self, key: tuple[str, str]) -> None:
        if (task := self._streams.pop(key, None)) is not None:
            await end_tasks([task], STOP_GRACE_S)
        with contextlib.suppress(JobLookupError):
            self._scheduler.remove_job(f"collect-{key[0]}-{key[1]}")
        st = self.status[key]
        st.state, st.next_attempt_ns, st.consecutive_failures = "pending", None, 0  # polled elsewhere now

    def _forget(self, keys: list[tuple[str, str]]) -> None:
        """Devices given to another member, no poll of them under way: what this process knew of them
        dropped, so that taking one back later starts as a member new to it would, not from state the
        other member's polls made stale (a rate over a stretch the other member's rates cover, a link
        change it reported already, a UFM event cursor behind its). Their counters' previous samples and
        link states now (those of the switches a fabric manager reported with them too, unless a device
        still polled here reports them), the collectors' sessions and state (Collector.forget) in the
        background, one device after the other, each unless taken back meanwhile."""
        kept = self.owned
        keys = [k for k in keys if kept is not None and k[1] not in kept]
        if not keys or kept is None:
            return
        here = kept | {d for polled, covers in self.recent.covered.items() if polled in kept for d in covers}
        gone: dict[str, set[str]] = {}
        for collector, device in keys:
            gone.setdefault(collector, set()).update({device} | self.recent.covered.get(device, set()))
        for collector, devices in gone.items():
            self.rates[collector].forget(*devices)
        unpolled = set().union(*gone.values()) - here
        self.links.forget(*unpolled)
        self._to_forget.extend(keys)
        if self._forgetting is None or self._forgetting.done():
            self._forgetting = asyncio.get_running_loop().create_task(self._forget_in_collectors(),
                                                                      name="poller-forget")

    async def _forget_in_collectors(self) -> None:
        while self._to_forget:
            key = self._to_forget.pop(0)
            if self.owned is None or key[1] in self.owned or key in self._polling:
                continue  # taken back, or polled again (given again, it comes back here)
            try:  # its synchronous start (the session dropped) runs before any poll can begin
                await self.collectors[key[0]].forget(key[1])
            except Exception:
                log.exception("collector %s: forgetting %s", *key)

    async def set_owned(self, devices: set[str], spread_s: float = 0.0) -> tuple[set[str], set[str]]:
        """Poll only `devices` from now on (a cluster member's share; call after schedule()): the
        jobs and streams of the devices given away stop (a poll already running finishes), those of
        the devices taken start at once, spread over spread_s; what this process knew of the devices
        given away is dropped (_forget). Returns (taken, given)."""
        configured = {device for _, device in self.status}
        before = configured if self.owned is None else self.owned & configured
        self.owned = set(devices)
        after = self.owned & configured
        taken, given = after - before, before - after
        if self._scheduler is not None:
            for key in sorted(k for k in self.status if k[1] in given):
                await self._stop(key)
            self._forget([k for k in self.status if k[1] in given and k not in self._polling])  # others: poll()
            now = datetime.now(UTC)
            starting = sorted(k for k in self.status if k[1] in taken)
            for i, key in enumerate(starting):
                self.status[key].next_attempt_ns = None
                self._start(key, now + timedelta(seconds=spread_s * i / max(len(starting), 1)))
        return taken, given

    async def poll_all(self) -> list[DeviceStatus]:
        """Poll every device once, concurrently, ignoring backoff (for `nms collect --once`, tests)."""
        await asyncio.gather(*(self.poll(name, device, force=True) for name, device in self.status))
        return self.devices()

    async def poll(self, collector_name: str, device_name: str, force: bool = False) -> None:
        st = self.status[(collector_name, device_name)]
        now = time.time_ns()
        if not force and st.next_attempt_ns is not None and now < st.next_attempt_ns:
            return  # backing off
        collector = self.collectors[collector_name]
        st.polls += 1
        st.last_poll_ns = now
        started = time.perf_counter()
        key = (collector_name, device_name)
        self._polling.add(key)
        try:
            try:
                result = await collector.collect_with_deadline(st.device, st.deadline_s)
            except Exception as e:
                if self.owned is None or device_name in self.owned:
                    self._failed(st, e, time.perf_counter() - started)
                return
            st.last_duration_s = round(time.perf_counter() - started, 4)
            self.metrics.seconds.labels(collector_name).observe(st.last_duration_s)
            await self.ingest(result)
            if self.owned is not None and device_name not in self.owned:
                return  # given to another member while this poll ran: its records count, its state is theirs
            self._succeeded(st, result)
        finally:
            self._polling.discard(key)
            if self.owned is not None and device_name not in self.owned and self._scheduler is not None:
                self._forget([key])  # given away while this poll ran

    async def _keep_streaming(self, collector_name: str, device_name: str) -> None:
        """A streaming collector's stream for one device, reopened after failures with the poll backoff.
        Each emitted batch counts as a successful poll; `polls` counts batches, `last_duration_s`
        how long the stream has been open."""
        st = self.status[(collector_name, device_name)]
        collector = self.collectors[collector_name]

        async def emit(result) -> None:
            st.polls += 1
            st.last_poll_ns = time.time_ns()
            st.last_duration_s = round(time.perf_counter() - opened, 4)
            await self.ingest(result)
            self._succeeded(st, result)

        while True:
            opened = time.perf_counter()
            try:
                await collector.stream(st.device, emit)
                raise RuntimeError("the stream returned without an error")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(st, e, time.perf_counter() - opened)
            await asyncio.sleep(max(1.0, (st.next_attempt_ns - time.time_ns()) / NS))

    def _succeeded(self, st: _Status, result) -> None:
        st.state, st.consecutive_failures, st.next_attempt_ns = "ok", 0, None
        st.last_success_ns = time.time_ns()
        st.covers = sorted(self.recent.covered.get(st.device.name, ()))  # ingest() set it
        st.records = len(result.records)
        found = list(result.problems)
        st.problems += len(found)
        st.last_problem_count, st.last_problems = len(found), found[:PROBLEMS_KEPT]
        if found:
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            log.warning("%s poll of %s left out %d things (the rest kept): %s%s", st.collector, st.device.name,
                        len(found), "; ".join(map(str, found[:3])), more)
        self.metrics.problems.labels(st.collector, st.device.name).inc(len(found))
        self.metrics.last_problems.labels(st.collector, st.device.name).set(len(found))
        self.metrics.polls.labels(st.collector, st.device.name, "ok").inc()
        self.metrics.up.labels(st.collector, st.device.name).set(1)
        self.metrics.failing.labels(st.collector, st.device.name).set(0)
        self.metrics.last_success.labels(st.collector, st.device.name).set(st.last_success_ns / NS)
        self._tell_status(st)

    def _failed(self, st: _Status, error: Exception, duration: float) -> None:
        kind = getattr(error, "kind", "internal")
        message = (
            str(error) if kind != "internal" else f"{st.device.name}: internal error: {type(error).__name__}: {error}"
        )
        if kind == "internal":
            log.error("collector %s crashed on %s", st.collector, st.device.name, exc_info=error)
        st.failures += 1
        st.consecutive_failures += 1
        st.last_duration_s = round(duration, 4)
        st.last_error_kind, st.last_error = kind, message[:1024]
        backoff = min(st.interval_s * 2 ** (st.consecutive_failures - 1), max(self.config.polling.backoff_max,
                                                                              st.interval_s))
        st.next_attempt_ns = time.time_ns() + int(backoff * NS) - int(st.interval_s * NS * 0.1)
        st.state = "backoff" if st.consecutive_failures > 1 else "error"
        log.warning("poll failed (%s, retry in %.0f s): %s", kind, backoff, message)
        self.metrics.polls.labels(st.collector, st.device.name, kind).inc()
        self.metrics.up.labels(st.collector, st.device.name).set(0)
        self.metrics.failing.labels(st.collector, st.device.name).set(st.consecutive_failures)
        self._tell_status(st)

    def _tell_status(self, st: _Status) -> None:
        if self.on_status is not None:
            try:
                self.on_status(st.snapshot())
            except Exception:
                log.exception("on_status hook failed for %s", st.device.name)

    # -- results -------------------------------------------------------------------------------

    def _sets_port_state(self, collector: str, device: str) -> bool:
        """Whether this collector's samples of the device give its link state (events, the topology's
        oper status). With several collectors on one device, the one of lowest `link_state_rank`
        among those that work (a stream while it is up, a CLI before SNMP): two sources with
        different freshness would read as false flaps."""
        working = [name for name in self._read_by.get(device, [collector])
                   if name == collector or self.status[(name, device)].state == "ok"]
        return collector == min(working, key=lambda n: (getattr(self.collectors[n], "link_state_rank", 50), n))

    async def ingest(self, result) -> None:
        records = list(result.records)
        tracker = self.rates[result.collector]
        derived: list[Any] = []
        sets_state = self._sets_port_state(result.collector, result.device)
        for sample in result.samples:
            # a streamed status change carries no counters: link state only (it would break the next rate)
            status_only = all(getattr(sample, c) is None for c in PortSample.traffic_counters)
            if not status_only:
                rate = tracker.update(sample, result.counter_bits)
                if rate.rates is not None:
                    derived.append(rate.rates)
                    self.recent.rates[(sample.device, sample.port)] = rate.rates
                elif rate.dropped not in (FIRST, HELD):  # not a rate yet: nothing was dropped
                    self.metrics.dropped.labels(result.collector).inc()
            if not sets_state:  # rates only: another collector gives this device's link state
                continue
            if (event := self.links.update(sample)) is not None:
                derived.append(event)
                self.recent.events.append(event)
            last = self.recent.samples.get((sample.device, sample.port))
            if not status_only:
                self.recent.samples[(sample.device, sample.port)] = sample
            elif last is not None:
                self.recent.samples[(sample.device, sample.port)] = last.model_copy(
                    update={"oper_status": sample.oper_status})
        for queue in (r for r in records if isinstance(r, QueueSample)):
            port = self.recent.samples.get((queue.device, queue.port))  # its speed bounds what it sends
            rate = tracker.update(queue, result.counter_bits, port.speed_bps if port is not None else None)
            if rate.rates is not None:
                derived.append(rate.rates)
            elif rate.dropped != FIRST:
                self.metrics.dropped.labels(result.collector).inc()
        facts = [r for r in records if isinstance(r, DeviceFacts)]
        for f in facts:
            self.recent.facts[f.device] = f
        devices = {f.device for f in facts} | {result.device}
        if len(devices) > 1 or result.device in self.recent.covered:
            self.recent.covered[result.device] = devices - {result.device}
        if any(isinstance(r, LldpNeighbor) for r in records) or self._lldp_enabled(result):
            neighbors: dict[str, list[LldpNeighbor]] = {d: [] for d in devices}
            for n in result.neighbors:
                neighbors.setdefault(n.device, []).append(n)
            self.recent.neighbors.update(neighbors)
        addresses = [r for r in records if isinstance(r, InterfaceAddress)]
        if addresses or getattr(result, "addresses_walked", False):
            self.recent.addresses[result.device] = addresses
        self.recent.prune(time.time_ns())
        if self.on_records is not None:
            try:
                out = self.on_records(records + derived)
                if inspect.isawaitable(out):
                    await out
            except Exception:
                log.exception("on_records hook failed for %s", result.device)
        for r in records + derived:
            self.metrics.records.labels(result.collector, type(r).__name__).inc()
        points = [r.to_point() for r in records + derived]
        try:
            written = await asyncio.to_thread(self.store.write, points)
            if written.rejected:
                log.warning("store rejected %d of %d points from %s, e.g. %s", len(written.rejected), len(points),
                            result.device, written.rejected[0][1])
        except Exception as e:  # the store spools or is down: polling goes on, the error is counted
            self.metrics.store_errors.labels(result.collector).inc()
            log.warning("store write failed for %s: %s", result.device, e)

    def _lldp_enabled(self, result) -> bool:
        st = self.status.get((result.collector, result.device))
        settings = self.collectors[result.collector].settings(st.device) if st else None
        return bool(getattr(settings, "lldp", False) or getattr(settings, "links", False))

    # -- views ---------------------------------------------------------------------------------

    def polls_here(self, device: str) -> bool:
        """Whether this process polls the device (all of them in a single process; a poll member's share),
        or a device that reports it (a fabric manager's switch)."""
        if self._scheduler is None or self.owned is None or device in self.owned:
            return self._scheduler is not None
        return any(device in covers for polled, covers in self.recent.covered.items() if polled in self.owned)

    def _status_of(self, key: tuple[str, str]) -> DeviceStatus:
        """Its status here, or, for a device another member polls, the latest that member published;
        `pending` again once its next poll is overdue by two intervals (that member is gone, and the
        member taking it over has not polled it yet)."""
        remote = self.remote.get(key)
        if remote is None or self.polls_here(key[1]):
            return self.status[key].snapshot()
        due = max(remote.next_attempt_ns or 0, (remote.last_poll_ns or 0) + int(remote.interval_s * NS))
        if time.time_ns() > due + int((2 * remote.interval_s + remote.deadline_s) * NS):
            return remote.model_copy(update={"state": "pending"})
        return remote

    def devices(self) -> list[DeviceStatus]:
        return [self._status_of(key) for key in sorted(self.status)]

    def topology(self) -> FabricTopology:
        now = time.time_ns()
        reachable: dict[str, bool] = {}
        for key in self.status:
            state = self._status_of(key).state
            if state == "pending":  # not polled anywhere yet, or by a member not heard from: unknown,
                continue  # not unreachable (the correlator takes an unreachable switch for a dead one)
            for d in {key[1]} | self.recent.covered.get(key[1], set()):
                reachable[d] = reachable.get(d, False) or state == "ok"
        fresh = {d: n for d, n in self.recent.neighbors.items() if reachable.get(d)}
        oper = {k: s.oper_status for k, s in self.recent.samples.items() if reachable.get(k[0])}
        flapping = [k for k in self.recent.samples if self.links.flapping(k[0], k[1], now)]
        return build_topology(self.config.fabric, fresh, reachable=reachable, oper=oper, rates=self.recent.rates,
                              flapping=flapping, generated_ns=now)

    async def close(self) -> None:
        await end_tasks(self._streams.values(), STOP_GRACE_S)
        self._streams.clear()
        if self._forgetting is not None:
            await end_tasks([self._forgetting], STOP_GRACE_S)
        for collector in self.collectors.values():
            try:
                await collector.close()
            except Exception:
                log.exception("closing collector %s", collector.name)
