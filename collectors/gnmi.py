"""The gNMI collector: openconfig-interfaces over a Subscribe STREAM per device (docs/gnmi.md).

The service keeps one stream open per device (`stream`): counters SAMPLEd every `interval`,
oper-status, MTU and port speed ON_CHANGE, so a link going down reaches the poller (link events,
the correlator) as soon as the target sends it, not at the next poll. `collect` (`nms collect gnmi
--once`, the poll contract) is one Subscribe ONCE. Capabilities opens each connection: it checks the
credentials and that the target serves openconfig-interfaces.

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

from collectors.base import (Collector, CollectorAuthError, CollectorBadResponse, CollectorConfigError,
                             CollectorTimeout, CollectorUnreachable, PollResult)
from collectors.gnmi_model import Port, apply, sample
from nms.config.models import GnmiSettings, SwitchConfig
from nms.records import DeviceFacts

log = logging.getLogger(__name__)

BATCH_GAP_S = 0.05
BATCH_MAX_S = 0.5
MODELS = ("openconfig-interfaces",)
SAMPLED = ("interfaces/interface/state/counters",)
ON_CHANGE = ("interfaces/interface/state/oper-status", "interfaces/interface/state/mtu",
             "interfaces/interface/ethernet/state/port-speed")
AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def path(text: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=p) for p in text.split("/")])


def subscribe_request(mode: int, interval_s: float) -> gnmi_pb2.SubscribeRequest:
    subs = [gnmi_pb2.Subscription(path=path(p), mode=gnmi_pb2.SAMPLE, sample_interval=int(interval_s * 1e9))
            for p in SAMPLED]
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

    async def close(self) -> None:
        await self.channel.close()


class GnmiCollector(Collector):
    name = "gnmi"
    streaming = True
    link_state_rank = 0  # ON_CHANGE: a status change arrives at once
    counter_bits: dict[str, int] = {}  # openconfig counters are counter64

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self.problems: dict[str, list[str]] = {}  # device -> values its latest answer left out

    def settings(self, device: SwitchConfig) -> GnmiSettings | None:
        return device.collectors.gnmi

    def stale_after(self, device: SwitchConfig) -> float:
        s = self.settings(device)
        return float(s.stale_after or 2 * s.interval + 2)

    async def _session(self, device: SwitchConfig) -> _Session:
        s = self.settings(device)
        if s is None:
            raise CollectorConfigError(device.name, "has no collectors.gnmi settings")
        session = self._sessions.get(device.name)
        if session is None or session.settings is not s:
            if session is not None:
                await session.close()
            session = self._sessions[device.name] = _Session(device, s)
        return session

    def _wanted(self, device: SwitchConfig) -> Callable[[str], bool]:
        """Whether an interface is kept: decided once per name (it is asked for every leaf of every tick)."""
        patterns = self.settings(device).interfaces
        if not patterns:
            return lambda name: True
        return functools.cache(lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns))

    async def collect(self, device: SwitchConfig) -> PollResult:
        """One Subscribe ONCE: every interface's counters and status."""
        session = await self._session(device)
        started_ns, t0 = time.time_ns(), time.perf_counter()
        caps = await session.capabilities()
        ports: dict[str, Port] = {}
        problems: list[str] = []
        values, wanted = 0, self._wanted(device)
        call = session.stub.Subscribe(iter([subscribe_request(gnmi_pb2.SubscriptionList.ONCE, 0)]),
                                      metadata=session.metadata, timeout=self.schedule(device).deadline_s)
        try:
            async for response in call:
                if response.HasField("update"):
                    update = apply(ports, response.update, wanted)
                    problems += update.problems
                    values += len(response.update.update)
                elif response.sync_response:
                    break
        except grpc.aio.AioRpcError as e:
            raise session.error("Subscribe ONCE", e) from None
        finally:
            call.cancel()
        self._note(device.name, problems)
        now = time.time_ns()
        records: list[Any] = [_facts(device.name, caps, now, len(ports))]
        records += [sample(device.name, name, p, p.counters_ts or now, True) for name, p in sorted(ports.items())]
        return PollResult(device=device.name, collector=self.name, started_ns=started_ns,
                          duration_s=time.perf_counter() - t0, records=records, counter_bits=self.counter_bits,
                          values=values)

    async def stream(self, device: SwitchConfig, emit: Callable[[PollResult], Awaitable[None]]) -> None:
        """Subscribe STREAM until cancelled; raises a CollectorError when the stream fails or goes
        quiet for `stale_after` (the caller reopens it)."""
        session = await self._session(device)
        caps = await session.capabilities()
        s, wanted, stale = self.settings(device), self._wanted(device), self.stale_after(device)
        ports: dict[str, Port] = {}

        async def outgoing():  # the request side stays open for the stream's life
            yield subscribe_request(gnmi_pb2.SubscriptionList.STREAM, float(s.interval))
            await asyncio.Event().wait()

        call = session.stub.Subscribe(outgoing(), metadata=session.metadata)
        # a reader task feeds a queue: timing out a grpc.aio read() would cancel the whole call
        responses: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    response = await call.read()
                    responses.put_nowait(response)
                    if response is grpc.aio.EOF:
                        return
            except grpc.aio.AioRpcError as e:
                responses.put_nowait(e)

        reader = asyncio.create_task(read())
        pending: set[str] = set()  # interfaces whose new counters wait for their batch to close
        values, first_at, synced = 0, 0.0, False
        try:
            while True:
                wait = stale if not pending else max(0.0, min(BATCH_GAP_S, first_at + BATCH_MAX_S - time.monotonic()))
                try:
                    response = await asyncio.wait_for(responses.get(), wait)
                    if isinstance(response, grpc.aio.AioRpcError):
                        raise response
                except TimeoutError:
                    if not pending:
                        raise CollectorTimeout(device.name, f"{session.target}: the stream sent nothing for "
                                                            f"{stale:g} s (stale)") from None
                    response = None  # the batch is complete
                if response is grpc.aio.EOF:
                    raise CollectorUnreachable(device.name, f"{session.target}: the target ended the stream")
                sync = response is not None and response.sync_response
                if response is not None and response.HasField("update"):
                    update = apply(ports, response.update, wanted)
                    values += len(response.update.update)
                    if update.problems:
                        self._note(device.name, update.problems)
                    if update.counters and not pending:
                        first_at = time.monotonic()
                    pending |= update.counters
                    changed = update.status - update.counters
                    if changed and synced:  # a status change on its own: at once
                        ts = response.update.timestamp or time.time_ns()
                        await emit(self._result(device.name, [sample(device.name, n, ports[n], ts, False)
                                                              for n in sorted(changed)], values))
                        values = 0
                if (response is None or sync) and (pending or sync):
                    now = time.time_ns()
                    records: list[Any] = [_facts(device.name, caps, now, len(ports))] if sync else []
                    records += [sample(device.name, n, ports[n], ports[n].counters_ts or now, True)
                                for n in sorted(pending) if n in ports]
                    await emit(self._result(device.name, records, values))
                    pending, values = set(), 0
                synced = synced or sync
        except grpc.aio.AioRpcError as e:
            raise session.error("Subscribe STREAM", e) from None
        finally:
            call.cancel()
            reader.cancel()

    def _result(self, device: str, records: list[Any], values: int) -> PollResult:
        return PollResult(device=device, collector=self.name, started_ns=time.time_ns(), records=records,
                          counter_bits=self.counter_bits, values=values)

    def _note(self, device: str, problems: list[str]) -> None:
        for p in problems[:5]:
            log.warning("%s: gNMI value left out: %s", device, p)
        self.problems[device] = problems

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()


def _facts(device: str, caps: gnmi_pb2.CapabilityResponse, ts: int, interfaces: int) -> DeviceFacts:
    version = caps.gNMI_version or "?"
    return DeviceFacts(device=device, ts=ts, sys_name=device[:255], interfaces=interfaces,
                       sys_descr=f"gNMI {version} target"[:1024])
