"""The collector contract every switch-side collector follows (SNMP, UFM, gNMI, CLI).

A collector is one object per protocol for the whole service (it may hold one engine, one
connection pool). It is configured per device: a device is polled by collector `name` when its
`collectors.<name>` section is set; the configuration validates that section through the
collector's own `settings_model` (a pydantic model; found through the entry point, so a third
party's collector is configured like a built-in one). The service schedules
`collect_with_deadline(device)` per device at `schedule(device).interval_s`; each call returns a
`PollResult` of shared records (PortSample, LldpNeighbor, DeviceFacts, InterfaceAddress,
GenericPoint for extra objects; the polled device's DeviceFacts first) or raises a
`CollectorError` whose `kind` says what went wrong (timeout, auth, bad_response, unreachable,
config). Messages name the device and the address, never a secret.

A poll that succeeds in part says what it left out in `PollResult.problems` (PollProblem: the
command, route, path or item; why; the error kind): a failed optional command, a route that
answered badly, values that did not parse. The rest of the poll is kept; the poller counts the
problems per device and collector (GET /devices, `nms devices`, /metrics). What fails the poll
(no session, refused credentials, a timeout, the required part unreadable) is raised, not noted.
Problems name no secret either.

A streaming collector (gNMI) sets `streaming` and implements `stream(device, emit)`: the service
keeps one stream per device for which `streams(device)` holds open instead of scheduling polls, and
ingests each PollResult the stream emits as it comes; a stream that fails raises a CollectorError
and is reopened with the same backoff as a failing poll. Its `collect` still answers one-shot polls
(`nms collect ... --once`).

A device a cluster's `poll` member gives to another is forgotten: `forget(device_name)` releases its
session and drops what the collector kept of it (nms/app/polling.py), so that polling it again later
starts afresh.

With several collectors on one device, `link_state_rank` picks the one whose samples give the
device's link state (events, flaps, the topology's oper status); the others give rates only.

Helpers every collector uses: `required_settings(device)` (its settings, or the "no settings"
CollectorConfigError) and `result(device, PollStart(), records, ...)` (a PollResult timed from the
poll's start, with the collector's name and counter widths). A collector that keeps a session (a
target, a channel, a client) per device keeps it in a `DeviceCache`: made again when the device's
settings or address change, the replaced one released.

A new collector is one module with a subclass (its `name`, its `settings_model`, `collect`) and one
line in its pyproject.toml:

    [project.entry-points."nms.collectors"]
    snmp = "collectors.snmp.collector:SnmpCollector"
"""

from __future__ import annotations

import asyncio
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from nms.config.models import SwitchConfig
from nms.records import CollectorErrorKind, DeviceFacts, InterfaceAddress, LldpNeighbor, PortSample
from nms.records import PollProblem as PollProblem  # part of the contract: collectors import it from here


class CollectorError(Exception):
    kind: ClassVar[CollectorErrorKind] = "internal"

    def __init__(self, device: str, message: str):
        super().__init__(f"{device}: {message}")
        self.device = device
        self.message = message

    def problem(self, what: str, consequence: str = "") -> PollProblem:
        """This error as a problem of a poll that goes on without `what`."""
        return PollProblem(what=what, reason=f"{self.message}; {consequence}" if consequence else self.message,
                           kind=self.kind)


class CollectorTimeout(CollectorError):
    kind = "timeout"


class CollectorAuthError(CollectorError):
    kind = "auth"


class CollectorBadResponse(CollectorError):
    kind = "bad_response"


class CollectorUnreachable(CollectorError):
    kind = "unreachable"


class CollectorConfigError(CollectorError):
    kind = "config"


@dataclass(frozen=True)
class Schedule:
    interval_s: float
    deadline_s: float  # a poll still running then is cancelled and counted as a timeout


@dataclass(frozen=True)
class PollStart:
    """When a poll began: its result's `started_ns`, and the clock its `duration_s` is read from."""

    ns: int = field(default_factory=time.time_ns)
    perf: float = field(default_factory=time.perf_counter)


@dataclass
class PollResult:
    device: str
    collector: str
    started_ns: int
    duration_s: float = 0.0
    records: list[Any] = field(default_factory=list)
    # widths of the PortSample counters (a sample's own counter_bits overrides them for its octets and packets)
    counter_bits: Mapping[str, int] = field(default_factory=dict)
    values: int = 0  # objects read from the device (for throughput numbers)
    # True when this poll read the device's interface addresses: its InterfaceAddress records are then
    # the complete current set (possibly empty). Addresses are read only now and then (see the
    # collector); a poll with False says nothing about them, the consumer keeps the latest set.
    addresses_walked: bool = False
    problems: list[PollProblem] = field(default_factory=list)  # what this poll left out, and why

    @property
    def samples(self) -> list[PortSample]:
        return [r for r in self.records if isinstance(r, PortSample)]

    @property
    def neighbors(self) -> list[LldpNeighbor]:
        return [r for r in self.records if isinstance(r, LldpNeighbor)]

    @property
    def addresses(self) -> list[InterfaceAddress]:
        return [r for r in self.records if isinstance(r, InterfaceAddress)]

    @property
    def facts(self) -> DeviceFacts | None:
        return next((r for r in self.records if isinstance(r, DeviceFacts)), None)


class Collector(ABC):
    name: ClassVar[str]
    # the model of `collectors.<name>` (pydantic; Strict from nms.config.models forbids unknown keys):
    # what settings(device) returns
    settings_model: ClassVar[type[BaseModel]]
    # widths of PortSample counters this protocol delivers (a counter not named is 64-bit); where the width
    # of the octet and packet counters varies by device or port, each sample says it (counter_bits)
    counter_bits: ClassVar[Mapping[str, int]] = {}

    @classmethod
    def from_config(cls, config: Any) -> Collector:
        """Build the collector from the whole NmsConfig (plugins may read their own section)."""
        return cls()

    def settings(self, device: SwitchConfig) -> Any | None:
        """This collector's settings for `device`, or None when the device is not polled by it."""
        return device.collectors.get(self.name)

    def required_settings(self, device: SwitchConfig) -> Any:
        """This collector's settings for `device`; a CollectorConfigError when it has none."""
        settings = self.settings(device)
        if settings is None:
            raise CollectorConfigError(device.name, f"has no collectors.{self.name} settings")
        return settings

    def result(self, device: str, started: PollStart, records: list[Any], **more: Any) -> PollResult:
        """This collector's PollResult of a poll of `device` begun at `started` (its duration: until now)."""
        return PollResult(device=device, collector=self.name, started_ns=started.ns,
                          duration_s=time.perf_counter() - started.perf, records=records,
                          counter_bits=self.counter_bits, **more)

    def schedule(self, device: SwitchConfig) -> Schedule:
        s = self.settings(device)
        if s is None:
            raise ValueError(f"{device.name} is not polled by the {self.name} collector")
        interval = float(s.interval)
        deadline = getattr(s, "deadline", None) or interval * 0.8
        return Schedule(interval, min(float(deadline), interval))

    @abstractmethod
    async def collect(self, device: SwitchConfig) -> PollResult:
        """Poll one device once; raise CollectorError on failure."""

    async def collect_with_deadline(self, device: SwitchConfig, deadline_s: float | None = None) -> PollResult:
        """`collect`, cancelled at the device's deadline (a CollectorTimeout then)."""
        deadline = deadline_s if deadline_s is not None else self.schedule(device).deadline_s
        started = time.monotonic()
        try:
            return await asyncio.wait_for(self.collect(device), deadline)
        except TimeoutError:
            raise CollectorTimeout(device.name, f"poll did not finish within its deadline of {deadline:g} s "
                                                f"(took {time.monotonic() - started:.1f} s)") from None

    streaming: ClassVar[bool] = False
    # Which collector gives a device's link state when several read it (the others give rates only):
    # the lowest rank among those whose last poll or stream is ok. A stream sees changes first; a
    # command line reads the kernel's state as it is; an SNMP agent answers from a cache.
    link_state_rank: ClassVar[int] = 50

    def streams(self, device: SwitchConfig) -> bool:
        """Whether the service keeps a stream open for `device` instead of polling it."""
        return self.streaming

    async def stream(self, device: SwitchConfig, emit: Callable[[PollResult], Awaitable[None]]) -> None:
        """Streaming collectors: run until cancelled, awaiting `emit` with each batch of records;
        raise CollectorError when the stream fails or goes stale."""
        raise NotImplementedError(f"{self.name} does not stream")

    async def close(self) -> None:  # noqa: B027  (optional: collectors without resources keep it)
        """Release engines, sockets, sessions."""

    async def forget(self, device_name: str) -> None:  # noqa: B027  (optional, as close)
        """A device this process no longer polls (a cluster member gave it to another, nms/app/poll_shard.py):
        release its session and drop what was kept about it (event cursors, previous counters), so that
        polling it again later starts as a process new to it would, not from state the other member's
        polls made stale. Called between polls of the device, never during one."""


T = TypeVar("T")


class DeviceCache(Generic[T]):
    """One kept object per device (a session, a target, a client), made by `make(device, settings)`
    and made again when the device's settings object (a reloaded configuration gives a new one) or
    management address changes, or when `usable(obj)` says no. The replaced object is handed to
    `release` (a plain or an async callable) and `forget(device_name)` is called, so that the collector
    drops what it kept about the device's old session."""

    def __init__(self, make: Callable[[SwitchConfig, Any], T], *,
                 release: Callable[[T], Awaitable[None] | None] | None = None,
                 usable: Callable[[T], bool] | None = None,
                 forget: Callable[[str], None] | None = None) -> None:
        self.make, self.release, self.usable, self.forget = make, release, usable, forget
        self._kept: dict[str, tuple[Any, str, T]] = {}  # device -> (settings, address, object)

    async def get(self, device: SwitchConfig, settings: Any) -> T:
        """The device's object, made (and the one it replaces released) when there is none to keep."""
        cached = self._kept.get(device.name)
        if cached is not None and cached[0] is settings and cached[1] == device.mgmt_address \
                and (self.usable is None or self.usable(cached[2])):
            return cached[2]
        made = self.make(device, settings)
        self._kept[device.name] = (settings, device.mgmt_address, made)
        if self.forget is not None:
            self.forget(device.name)
        if cached is not None:
            await self._release(cached[2])
        return made

    def kept(self, device_name: str) -> T | None:
        """The device's object as it is now (None when there is none); nothing is made."""
        cached = self._kept.get(device_name)
        return None if cached is None else cached[2]

    def pop(self, device_name: str) -> T | None:
        """Forget the device's object and hand it back unreleased (None when there is none); the next
        get() makes a new one (and calls `forget`)."""
        cached = self._kept.pop(device_name, None)
        return None if cached is None else cached[2]

    def drop_all(self) -> list[T]:
        """Forget every object and hand them back unreleased (for a collector that releases them elsewhere,
        as the CLI collector does in its thread pool)."""
        objects = [cached[2] for cached in self._kept.values()]
        self._kept.clear()
        return objects

    async def close_all(self) -> None:
        """Release every object and forget them."""
        for obj in self.drop_all():
            await self._release(obj)

    async def _release(self, obj: T) -> None:
        if self.release is not None and inspect.isawaitable(pending := self.release(obj)):
            await pending
