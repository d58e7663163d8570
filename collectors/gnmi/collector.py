"""The gNMI collector: openconfig-interfaces over a Subscribe STREAM per device (docs/gnmi.md).

The service keeps one stream open per device (`stream`, `mode: stream`): counters SAMPLEd every
`interval`, oper-status, MTU and port speed ON_CHANGE, so a link going down reaches the poller (link
events, the correlator) as soon as the target sends it, not at the next poll. `collect` (the poll
contract; `nms collect gnmi --once`) is one Subscribe ONCE, or with `mode: poll` one Poll on a
Subscribe POLL kept open across polls. Capabilities opens each connection: it checks the
credentials and that the target serves openconfig-interfaces; then a Get of openconfig-system's
/system/state gives the facts (hostname, software version, uptime; collectors/gnmi/inventory.py)
where the target serves it. Where the target lists openconfig-qos (or lists no models), the output
queues' counters are SAMPLEd too (QueueSample: drops, ECN marks; collectors/gnmi/qos.py); a
subscription refused for that path is a problem of the poll (PollResult.problems) and made again
without it, so a target without the model is read as before. Values of the wrong kind are left out
as problems too; a stream's go with the next batch it emits (the refused queues with every batch).

Updates are emitted in batches: counters of the interfaces a SAMPLE tick brought, when the stream
has been quiet for `BATCH_GAP_S` or `BATCH_MAX_S` after the first of them (a target sends a tick as
a burst of notifications); a status change at once, as a status-only sample. A stream with nothing
for `stale_after` is dropped (a timeout: the device shows as failing) and reopened with backoff.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

from collectors.base import (
    Collector,
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorTimeout,
    CollectorUnreachable,
    DeviceCache,
    PollProblem,
    PollResult,
    PollStart,
)
from collectors.gnmi import inventory
from collectors.gnmi import qos as gnmi_qos
from collectors.gnmi.inventory import SystemState
from collectors.gnmi.model import Port, apply, sample
from collectors.gnmi.settings import GnmiSettings
from nms.config.models import SwitchConfig

log = logging.getLogger(__name__)

BATCH_GAP_S = 0.05
BATCH_MAX_S = 0.5
MODELS = ("openconfig-interfaces",)
SAMPLED = ("interfaces/interface/state/counters",)
ON_CHANGE = ("interfaces/interface/state/oper-status", "interfaces/interface/state/mtu",
             "interfaces/interface/ethernet/state/port-speed")
AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
# how a target refuses a path it does not serve
PATH_REFUSED = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)


def path(text: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=p) for p in text.split("/")])


def subscribe_request(mode: int, interval_s: float, queues: bool = False) -> gnmi_pb2.SubscribeRequest:
    """The subscription of every device: interface counters SAMPLE, status ON_CHANGE, and with
    `queues` the openconfig-qos output queues' counters SAMPLE."""
    sampled = SAMPLED + ((gnmi_qos.PATH,) if queues else ())
    subs = [gnmi_pb2.Subscription(path=path(p), mode=gnmi_pb2.SAMPLE, sample_interval=int(interval_s * 1e9))
            for p in sampled]
    subs += [gnmi_pb2.Subscription(path=path(p), mode=gnmi_pb2.ON_CHANGE) for p in ON_CHANGE]
    if mode != gnmi_pb2.SubscriptionList.STREAM:  # ONCE and POLL take no per-subscription mode
        subs = [gnmi_pb2.Subscription(path=s.path) for s in subs]
    return gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
        subscription=subs, mode=mode, encoding=gnmi_pb2.PROTO))


class _Session:
    """One device's channel, stub and credentials."""

    def __init__(self, device: SwitchConfig, s: GnmiSettings):
        self.device, self.settings = device.name, s
        host = device.mgmt_address
        self.target = f"[{host}]:{s.port}" if ipaddress.ip_address(host).version == 6 else f"{host}:{s.port}"
        self.metadata = ((("username", s.username), ("password", s.password.get_secret_value()))
                         if s.username is not None and s.password is not None else ())
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if s.insecure:
            self.channel = grpc.aio.insecure_channel(self.target, options=options)
        else:
            try:
                files = [p.read_bytes() if p is not None else None for p in (s.ca_file, s.key_file, s.cert_file)]
            except OSError as e:
                raise CollectorConfigError(device.name, f"TLS file {e.filename}: {e.strerror}") from None
            if s.server_name:
                options.append(("grpc.ssl_target_name_override", s.server_name))
            self.channel = grpc.aio.secure_channel(self.target, grpc.ssl_channel_credentials(*files), options=options)
        self.stub = gnmi_pb2_grpc.gNMIStub(self.channel)
        self.queues_refused: str | None = None  # why this target refused the openconfig-qos path

    def queues(self, caps: gnmi_pb2.CapabilityResponse) -> bool:
        """Whether to subscribe to the output queues: asked for, the target lists openconfig-qos (or no
        models at all), and has not refused the path."""
        models = {m.name for m in caps.supported_models}
        return self.settings.queues and self.queues_refused is None and (not models or gnmi_qos.MODEL in models)

    def refused_queues(self, e: grpc.aio.AioRpcError, asked: bool) -> bool:
        """A subscription with the queues refused for a path: remember it (the next asks without)."""
        if not asked or e.code() not in PATH_REFUSED:
            return False
        self.queues_refused = f"{e.code().name}: {(e.details() or '')[:200]}"
        log.warning("%s: %s refused the openconfig-qos subscription (%s): interfaces only", self.device,
                    self.target, self.queues_refused)
        return True

    def error(self, rpc: str, e: grpc.aio.AioRpcError) -> Exception:
        """A gRPC failure as the collector error of its kind (the details name no secret of ours)."""
        code, details = e.code(), (e.details() or "")[:300]
        message = f"{self.target}: {rpc}: {code.name}: {details}"
        if code in AUTH_CODES:
            return CollectorAuthError(self.device, message)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return CollectorTimeout(self.device, message)
        if code == grpc.StatusCode.UNAVAILABLE:
            return CollectorUnreachable(self.device, message)
        return CollectorBadResponse(self.device, message)

    async def capabilities(self) -> gnmi_pb2.CapabilityResponse:
        try:
            answer = await self.stub.Capabilities(gnmi_pb2.CapabilityRequest(), metadata=self.metadata,
                                                  timeout=self.settings.timeout)
        except grpc.aio.AioRpcError as e:
            raise self.error("Capabilities", e) from None
        models = {m.name for m in answer.supported_models}
        if models and not all(m in models for m in MODELS):
            raise CollectorBadResponse(self.device, f"{self.target}: the target does not serve {', '.join(MODELS)}")
        return answer

    async def inventory(self, caps: gnmi_pb2.CapabilityResponse, problems: list[PollProblem]) -> SystemState:
        """Get /system/state (openconfig-system) when the target serves it and `inventory` is on;
        a refused or unusable answer is noted, the facts then come from Capabilities."""
        models = {m.name for m in caps.supported_models}
        if not self.settings.inventory or (models and "openconfig-system" not in models):
            return SystemState()
        request = gnmi_pb2.GetRequest(path=[inventory.PATH], type=gnmi_pb2.GetRequest.STATE,
                                      encoding=gnmi_pb2.JSON_IETF)
        try:
            answer = await self.stub.Get(request, metadata=self.metadata, timeout=self.settings.timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() in AUTH_CODES or e.code() == grpc.StatusCode.UNAVAILABLE:
                raise self.error("Get /system/state", e) from None
            problems.append(PollProblem(what="Get /system/state", reason=f"{e.code().name}: "
                                        f"{(e.details() or '')[:200]}; the facts from Capabilities only"))
            return SystemState()
        return inventory.system_state(answer, time.time_ns(), problems)

    async def close(self) -> None:
        await self.channel.close()


def fold(ports: dict[str, Port], queues: dict, notification, wanted) -> tuple:
    """One notification into the interfaces and the queues: (its Update, queues whose counters it carried)."""
    update = apply(ports, notification, wanted)
    touched, problems = gnmi_qos.apply(queues, notification, wanted)
    update.problems += problems
    return update, touched


def _queues_refused(why: str | None) -> PollProblem:
    return PollProblem(what="openconfig-qos", reason=f"{why} (queues not collected)")


class _QueuesRefused(Exception):
    """The target refused the subscription for the queues' path (subscribe again without it)."""


class _Responses:
    """A Subscribe call's responses through a reader task and a queue: timing out a grpc.aio
    read() would cancel the whole call."""

    def __init__(self, call) -> None:
        self.call, self.queue = call, asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                self.queue.put_nowait(response)
                if response is grpc.aio.EOF:
                    return
        except grpc.aio.AioRpcError as e:
            self.queue.put_nowait(e)

    async def get(self, timeout: float):
        """The next response (grpc.aio.EOF at the end); raises TimeoutError or the call's error."""
        response = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(response, grpc.aio.AioRpcError):
            raise response
        return response

    def close(self) -> None:
        self.call.cancel()
        self.reader.cancel()


class _PollCall:
    """A Subscribe POLL kept open across polls: each poll sends a Poll request and reads the
    answer up to its sync_response. Targets differ on the subscription's own first answer: one that
    sends it unasked has it taken as the first poll's."""

    FIRST_WAIT_S = 1.0

    def __init__(self, session: _Session, caps: gnmi_pb2.CapabilityResponse, system: SystemState) -> None:
        self.session, self.caps, self.system = session, caps, system
        self.queues = session.queues(caps)
        self.requests: asyncio.Queue = asyncio.Queue()
        self.requests.put_nowait(subscribe_request(gnmi_pb2.SubscriptionList.POLL, 0, self.queues))

        async def outgoing():
            while True:
                yield await self.requests.get()

        self.responses = _Responses(session.stub.Subscribe(outgoing(), metadata=session.metadata))
        self.polls = 0

    async def poll(self, wanted, timeout: float) -> tuple[dict[str, Port], dict, list[PollProblem], int]:
        ports: dict[str, Port] = {}
        queues: dict = {}
        problems: list[PollProblem] = []
        values, first, self.polls = 0, self.polls == 0, self.polls + 1
        if not first:
            self.requests.put_nowait(gnmi_pb2.SubscribeRequest(poll=gnmi_pb2.Poll()))
        while True:
            try:
                response = await self.responses.get(self.FIRST_WAIT_S if first and values == 0 else timeout)
            except TimeoutError:
                if not (first and values == 0):
                    raise
                first = False  # this target answers Poll requests only
                self.requests.put_nowait(gnmi_pb2.SubscribeRequest(poll=gnmi_pb2.Poll()))
                continue
            if response is grpc.aio.EOF:
                raise CollectorUnreachable(self.session.device, f"{self.session.target}: the target ended "
                                                                "the POLL subscription")
            if response.HasField("update"):
                problems += fold(ports, queues, response.update, wanted)[0].problems
                values += len(response.update.update)
            elif response.sync_response:
                return ports, queues, problems, values

    def close(self) -> None:
        self.responses.close()


class GnmiCollector(Collector):
    name = "gnmi"
    settings_model = GnmiSettings
    streaming = True
    link_state_rank = 0  # ON_CHANGE: a status change arrives at once
    counter_bits: dict[str, int] = {}  # openconfig counters are counter64

    def __init__(self) -> None:
        self._sessions: DeviceCache[_Session] = DeviceCache(_Session, release=_Session.close)
        self._polls: dict[str, _PollCall] = {}  # device -> its kept Subscribe POLL (`mode: poll`)

    def settings(self, device: SwitchConfig) -> GnmiSettings | None:
        return device.collectors.gnmi

    def stale_after(self, device: SwitchConfig) -> float:
        s = self.settings(device)
        return float(s.stale_after or 2 * s.interval + 2)

    async def _session(self, device: SwitchConfig) -> _Session:
        return await self._sessions.get(device, self.required_settings(device))

    async def session(self, device: SwitchConfig) -> _Session:
        """The device's session, for gNMI Set (collectors/gnmi/setter.py)."""
        return await self._session(device)

    def _wanted(self, device: SwitchConfig) -> Callable[[str], bool]:
        """Whether an interface is kept: decided once per name (it is asked for every leaf of every tick)."""
        patterns = self.settings(device).interfaces
        if not patterns:
            return lambda name: True
        return functools.cache(lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns))

    def streams(self, device: SwitchConfig) -> bool:
        return self.settings(device).mode == "stream"

    async def collect(self, device: SwitchConfig) -> PollResult:
        """One poll: on the device's kept Subscribe POLL (`mode: poll`), else one Subscribe ONCE."""
        started = PollStart()
        if self.required_settings(device).mode == "poll":
            ports, queues, problems, values, caps, system = await self._poll(device)
        else:
            ports, queues, problems, values, caps, system = await self._once(device)
        if (refused := (await self._session(device)).queues_refused) is not None:
            problems = [_queues_refused(refused), *problems]
        now = time.time_ns()
        records: list[Any] = [system.facts(device.name, now, len(ports), caps.gNMI_version)]
        records += [sample(device.name, name, p, p.counters_ts or now, True) for name, p in sorted(ports.items())]
        records += gnmi_qos.samples(device.name, queues, queues, now)
        return self.result(device.name, started, records, values=values, problems=problems)

    async def _once(self, device: SwitchConfig):
        session = await self._session(device)
        caps = await session.capabilities()
        problems: list[PollProblem] = []
        system = await session.inventory(caps, problems)
        wanted, asked = self._wanted(device), session.queues(caps)
        while True:
            ports: dict[str, Port] = {}
            queues: dict = {}
            values = 0
            call = session.stub.Subscribe(iter([subscribe_request(gnmi_pb2.SubscriptionList.ONCE, 0, asked)]),
                                          metadata=session.metadata, timeout=self.schedule(device).deadline_s)
            try:
                async for response in call:
                    if response.HasField("update"):
                        problems += fold(ports, queues, response.update, wanted)[0].problems
                        values += len(response.update.update)
                    elif response.sync_response:
                        break
            except grpc.aio.AioRpcError as e:
                if session.refused_queues(e, asked):
                    asked = False
                    continue
                raise session.error("Subscribe ONCE", e) from None
            finally:
                call.cancel()
            return ports, queues, problems, values, caps, system

    async def _poll(self, device: SwitchConfig):
        """A poll on the device's Subscribe POLL, opened (Capabilities, inventory) when there is none;
        a poll that fails or is cut off at its deadline closes it, the next opens a new one."""
        poll_call = self._polls.get(device.name)
        session = await self._session(device)
        problems: list[PollProblem] = []
        if poll_call is None or poll_call.session is not session:
            caps = await session.capabilities()
            poll_call = self._polls[device.name] = _PollCall(session, caps, await session.inventory(caps, problems))
        try:
            ports, queues, more, values = await poll_call.poll(self._wanted(device),
                                                               float(self.settings(device).timeout))
        except BaseException as e:
            poll_call.close()
            self._polls.pop(device.name, None)
            if isinstance(e, grpc.aio.AioRpcError) and session.refused_queues(e, poll_call.queues):
                return await self._poll(device)  # again, without the queues
            if isinstance(e, grpc.aio.AioRpcError):
                raise session.error("Subscribe POLL", e) from None
            if isinstance(e, TimeoutError):
                raise CollectorTimeout(device.name, f"{session.target}: no answer to a Poll within "
                                                    f"{self.settings(device).timeout:g} s") from None
            raise
        return ports, queues, problems + more, values, poll_call.caps, poll_call.system

    async def stream(self, device: SwitchConfig, emit: Callable[[PollResult], Awaitable[None]]) -> None:
        """Subscribe STREAM until cancelled; raises a CollectorError when the stream fails or goes
        quiet for `stale_after` (the caller reopens it). A target that refuses the queues' path before
        its first sync is subscribed to again at once, without it."""
        session = await self._session(device)
        caps = await session.capabilities()
        problems: list[PollProblem] = []  # emitted with the first batch
        system = await session.inventory(caps, problems)
        asked = session.queues(caps)
        while True:
            try:
                return await self._stream(device, session, caps, system, asked, emit, problems)
            except _QueuesRefused:  # each batch says so from now on (_result)
                asked = False

    async def _stream(self, device: SwitchConfig, session: _Session, caps, system: SystemState, asked: bool,
                      emit: Callable[[PollResult], Awaitable[None]], problems: list[PollProblem]) -> None:
        """The stream; `problems` (the inventory's) and those of each notification go with the next batch."""
        s, wanted, stale = self.settings(device), self._wanted(device), self.stale_after(device)
        problems = list(problems)  # the caller's stay as they are for a subscription made again
        ports: dict[str, Port] = {}
        queues: dict = {}

        async def outgoing():  # the request side stays open for the stream's life
            yield subscribe_request(gnmi_pb2.SubscriptionList.STREAM, float(s.interval), asked)
            await asyncio.Event().wait()

        responses = _Responses(session.stub.Subscribe(outgoing(), metadata=session.metadata))
        pending: set[str] = set()  # interfaces whose new counters wait for their batch to close
        pending_queues: set = set()  # the same for queues
        values, first_at, synced = 0, 0.0, False
        try:
            while True:
                waiting = pending or pending_queues
                wait = stale if not waiting else max(0.0, min(BATCH_GAP_S, first_at + BATCH_MAX_S - time.monotonic()))
                try:
                    response = await responses.get(wait)
                except TimeoutError:
                    if not waiting:
                        raise CollectorTimeout(device.name, f"{session.target}: the stream sent nothing for "
                                                            f"{stale:g} s (stale)") from None
                    response = None  # the batch is complete
                if response is grpc.aio.EOF:
                    raise CollectorUnreachable(device.name, f"{session.target}: the target ended the stream")
                sync = response is not None and response.sync_response
                if response is not None and response.HasField("update"):
                    update, touched = fold(ports, queues, response.update, wanted)
                    values += len(response.update.update)
                    problems += update.problems
                    if (update.counters or touched) and not (pending or pending_queues):
                        first_at = time.monotonic()
                    pending |= update.counters
                    pending_queues |= touched
                    changed = update.status - update.counters
                    if changed and synced:  # a status change on its own: at once
                        ts = response.update.timestamp or time.time_ns()
                        await emit(self._result(session, [sample(device.name, n, ports[n], ts, False)
                                                          for n in sorted(changed)], values, problems))
                        values, problems = 0, []
                if (response is None or sync) and (pending or pending_queues or sync):
                    now = time.time_ns()
                    records: list[Any] = [system.facts(device.name, now, len(ports), caps.gNMI_version)] if sync else []
                    records += [sample(device.name, n, ports[n], ports[n].counters_ts or now, True)
                                for n in sorted(pending) if n in ports]
                    records += gnmi_qos.samples(device.name, queues, pending_queues, now)
                    await emit(self._result(session, records, values, problems))
                    pending, pending_queues, values, problems = set(), set(), 0, []
                synced = synced or sync
        except grpc.aio.AioRpcError as e:
            if not synced and session.refused_queues(e, asked):
                raise _QueuesRefused() from None
            raise session.error("Subscribe STREAM", e) from None
        finally:
            responses.close()

    def _result(self, session: _Session, records: list[Any], values: int, problems: list[PollProblem]) -> PollResult:
        """A stream's batch."""
        if session.queues_refused is not None:
            problems = [_queues_refused(session.queues_refused), *problems]
        return self.result(session.device, PollStart(), records, values=values, problems=list(problems))

    async def forget(self, device_name: str) -> None:
        """Given to another member (its stream already closed by the poller): its kept POLL subscription
        and its channel closed."""
        if (poll_call := self._polls.pop(device_name, None)) is not None:
            poll_call.close()
        if (session := self._sessions.pop(device_name)) is not None:
            await session.close()

    async def close(self) -> None:
        for poll_call in self._polls.values():
            poll_call.close()
        self._polls.clear()
        await self._sessions.close_all()
