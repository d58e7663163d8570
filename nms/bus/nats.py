"""The bus on NATS JetStream (nats-py; Debian's `nats-server` with `-js`): file-backed streams,
publishes acknowledged by the stream (with a message id for de-duplication), durable pull consumers
with explicit acks."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import nats
import nats.aio.client
import nats.aio.transport
import nats.errors
import nats.js.errors
from nats.js import api

from nms.bus import BusError, BusUnavailable, KvSpec, PublishAck, StreamSpec

if TYPE_CHECKING:
    from nms.config.models import BusConfig

log = logging.getLogger(__name__)
# JetStream's "no suitable peers for placement": a stream's replicas need more peers than are up now
NO_SUITABLE_PEERS = 10005
REPLAY_IDLE_S = 30.0  # a replay's consumer left behind (its process died) goes by itself after this

# a NATS connection that is down or a JetStream request that got no answer: retry later
_UNAVAILABLE = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError,
                nats.errors.OutboundBufferLimitError, nats.errors.StaleConnectionError,
                nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError,
                asyncio.TimeoutError, OSError)


_STREAM_FIELDS = ("subjects", "retention", "storage", "max_age", "max_bytes", "num_replicas", "duplicate_window",
                  "discard")


def _differs(have: api.StreamConfig, want: api.StreamConfig) -> list[str]:
    """The settings of `want` that the existing stream does not have, as `name: old -> new`."""
    out = []
    for name in _STREAM_FIELDS:
        old, new = getattr(have, name), getattr(want, name)
        same = (math.isclose(old or 0.0, new or 0.0, abs_tol=1e-6) if name in ("max_age", "duplicate_window")
                else old == new)
        if not same:
            out.append(f"{name}: {old} -> {new}")
    return out


class NatsMessage:
    __slots__ = ("_msg", "subject", "data")

    def __init__(self, msg: Any) -> None:
        self._msg = msg
        self.subject: str = msg.subject
        self.data: bytes = msg.data

    @property
    def deliveries(self) -> int:
        return int(self._msg.metadata.num_delivered)

    @property
    def seq(self) -> int:
        return int(self._msg.metadata.sequence.stream)

    @property
    def pending(self) -> int:
        return int(self._msg.metadata.num_pending or 0)

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        await self._msg.nak(delay=delay_s)

    async def term(self) -> None:
        await self._msg.term()


class NatsConsumer:
    def __init__(self, sub: Any, delete: Any = None) -> None:
        self._sub = sub
        self._delete = delete  # a replay's: deleted on close

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # an ephemeral consumer also goes by itself once idle
            await self._sub.unsubscribe()
            if self._delete is not None:
                await self._delete()

    async def fetch(self, max_messages: int, timeout_s: float) -> list[NatsMessage]:
        try:
            msgs = await self._sub.fetch(max_messages, timeout=timeout_s)
        except (TimeoutError, nats.errors.TimeoutError):  # nothing came within timeout_s
            return []
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"fetch failed: {type(e).__name__}: {e}") from None
        return [NatsMessage(m) for m in msgs]


class NatsKeyValue:
    """A JetStream KV bucket: history 1, entries expire `ttl_s` after their last put (the stream's
    max_age, so the server forgets a member that stopped putting; no clock of ours decides).

    The bucket is kept in memory: when every server holding it restarted, it is gone, and the next
    operation finds no stream. It is made again then (adding a stream with the same config is
    idempotent, so a member that races another to it does no harm); its entries come back with the
    members' next puts."""

    def __init__(self, kv: Any, config: Any, js: Any) -> None:
        self._kv, self._config, self._js = kv, config, js
        self.name = config.bucket

    async def _do(self, what: str, op: Callable[[], Awaitable[Any]]) -> Any:
        for again in (False, True):
            try:
                return await op()
            except (nats.js.errors.NotFoundError, nats.errors.NoRespondersError) as e:  # the bucket is gone
                if again:
                    raise BusUnavailable(f"bucket {self.name}: {what}: {type(e).__name__}: {e}") from None
                await self._remake(e)
            except _UNAVAILABLE as e:
                raise BusUnavailable(f"bucket {self.name}: {what}: {type(e).__name__}: {e}") from None

    async def _remake(self, why: Exception) -> None:
        try:
            self._kv = await self._js.create_key_value(self._config)
        except nats.js.errors.APIError as e:
            raise BusError(f"bucket {self.name}: gone, and JetStream refused to make it again: {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"bucket {self.name}: gone, and not made again: {type(e).__name__}: {e}") from None
        log.warning("bus: bucket %s was gone (%s: its servers restarted?); made again", self.name, type(why).__name__)

    async def put(self, key: str, value: bytes) -> None:
        await self._do(f"put {key}", lambda: self._kv.put(key, value))

    async def delete(self, key: str) -> None:
        await self._do(f"delete {key}", lambda: self._kv.delete(key))

    async def items(self) -> dict[str, bytes]:
        """The keys from one stream_info (a consistent list of subjects; nats-py's watcher can report
        itself caught up before every key came), then each key's latest value (a delete leaves a
        marker that get() reports)."""
        prefix = f"$KV.{self.name}."

        async def read() -> dict[str, bytes]:
            info = await self._js.stream_info(f"KV_{self.name}", subjects_filter=f"{prefix}>")
            found: dict[str, bytes] = {}
            for subject in sorted(info.state.subjects or {}):
                try:
                    entry = await self._kv.get(subject[len(prefix):])
                except (nats.js.errors.KeyDeletedError, nats.js.errors.KeyNotFoundError):
                    continue  # deleted, or expired since the list was made
                found[entry.key] = entry.value or b""
            return found

        found: dict[str, bytes] = await self._do("read", read)
        return found


class TlsMismatch(nats.errors.Error):
    """The server's INFO and the member's URLs disagree on TLS (raised before anything is sent)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _Transport(nats.aio.transport.TcpTransport):
    """nats-py's TCP transport, but a failed TLS handshake (a certificate not verified, a wrong name)
    does not hang the client: nats-py's own then waits for ever for its plain stream to close (start_tls
    took the socket over, so that stream never hears of the close), and connect() never returns."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._failed_tls = False

    def __bool__(self) -> bool:
        return True  # made by _Client and kept (nats-py makes a plain one in place of a falsy transport)

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        self._failed_tls = False
        await super().connect(*args, **kwargs)

    async def connect_tls(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().connect_tls(*args, **kwargs)
        except BaseException:
            self._failed_tls = True
            if self._io_writer is not None:
                self._io_writer.transport.abort()
            raise

    async def wait_closed(self) -> None:
        if not self._failed_tls:
            await super().wait_closed()  # type: ignore[no-untyped-call]


class _Client(nats.aio.client.Client):
    """nats-py's client, held to the member's choice of TLS. nats-py upgrades to TLS only when the
    server's INFO says `tls_required`, whatever the URL's scheme: a `tls://` member would go on in
    plaintext, its token or password included, with a server (or anything in between) that does not
    ask for TLS. This one refuses that server before its CONNECT (at every connection, reconnections
    included), and a server asking for TLS that a `nats://` member was not configured for (a clear
    error instead of a certificate check against the system's CAs)."""

    want_tls = False

    def __init__(self) -> None:
        super().__init__()
        self._transport = _Transport()

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and self.want_tls and not info.get("tls_required"):
            raise TlsMismatch("the server does not offer TLS (tls:// wanted; refused before sending anything)")
        if initial_connection and not self.want_tls and info.get("tls_required"):
            raise TlsMismatch("the server requires TLS: give tls:// URLs (and cluster.bus.tls.ca_file for a "
                              "private CA)")
        await super()._process_info(info, initial_connection)


def _why(e: BaseException) -> str:
    """A connection error, as the operator needs it: TLS certificate problems by name."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        reason = str(e.reason or e)
        if "ALERT_BAD_CERTIFICATE" in reason or "ALERT_CERTIFICATE_REQUIRED" in reason:
            return (f"TLS: the server refused this member's client certificate, or its lack of one "
                    f"(cluster.bus.tls.cert_file/key_file) ({reason})")
        return f"TLS: {reason}"
    if isinstance(e, TlsMismatch):
        return f"TLS: {e}"
    return f"{type(e).__name__}: {e}"


class NatsBus:
    name = "nats"

    def __init__(self, config: BusConfig) -> None:
        self.cfg = config
        self._nc: Any = None
        self._js: Any = None
        self._published = 0
        self._connect_errors: list[BaseException] | None = None  # while connecting: what each try met

    @classmethod
    def from_config(cls, config: BusConfig) -> NatsBus:
        return cls(config)

    async def connect(self) -> None:
        cfg = self.cfg
        options: dict[str, Any] = {"servers": list(cfg.servers), "connect_timeout": cfg.connect_timeout,
                                   # at start: each server a few times, then a clear error; once
                                   # connected: reconnect for ever (below)
                                   "max_reconnect_attempts": 2, "reconnect_time_wait": 0.5,
                                   "allow_reconnect": True,
                                   "error_cb": self._on_error, "disconnected_cb": self._on_disconnect,
                                   "reconnected_cb": self._on_reconnect}
        if cfg.token is not None:
            options["token"] = cfg.token.get_secret_value()
        elif cfg.username:
            options["user"] = cfg.username
            options["password"] = cfg.password.get_secret_value() if cfg.password else ""
        if cfg.use_tls:
            from nms.config.models import BusTlsConfig

            tls = cfg.tls or BusTlsConfig()  # the system's CAs
            try:
                options["tls"] = tls.ssl_context()
            except ValueError as e:  # a file changed since the configuration was loaded
                raise BusError(f"cluster.bus.tls: {e}") from None
            if tls.server_name:
                options["tls_hostname"] = tls.server_name
            if not tls.verify_tls:
                log.warning("bus: TLS to %s WITHOUT verifying the servers' certificates (cluster.bus.tls.verify_tls: "
                            "false): anything in between can read and change the bus", ", ".join(cfg.servers))
        nc = _Client()
        nc.want_tls = cfg.use_tls
        self._connect_errors = []
        try:
            await nc.connect(**options)
        except (nats.errors.NoServersError, TlsMismatch, *_UNAVAILABLE) as e:
            # the last TLS problem where there was one (a refused client certificate may also show as
            # a reset connection), else the last error
            tried = [x for x in self._connect_errors if not isinstance(x, nats.errors.NoServersError)]
            tls_errors = [x for x in tried if isinstance(x, (ssl.SSLError, TlsMismatch))]
            raise BusUnavailable(f"no NATS server answered at {', '.join(cfg.servers)}: "
                                 f"{_why((tls_errors or tried or [e])[-1])}") from None
        finally:
            self._connect_errors = None
        self._nc = nc
        self._nc.options["max_reconnect_attempts"] = -1
        self._nc.options["reconnect_time_wait"] = 1.0
        self._js = self._nc.jetstream(timeout=cfg.publish_timeout)
        log.info("bus: connected to NATS %s", self._nc.connected_url.geturl() if self._nc.connected_url else "?")

    async def _on_error(self, e: Exception) -> None:
        if self._connect_errors is not None:
            self._connect_errors.append(e)
        log.warning("bus: NATS error: %s", _why(e))

    async def _on_disconnect(self) -> None:
        log.warning("bus: disconnected from NATS; reconnecting")

    async def _on_reconnect(self) -> None:
        log.info("bus: reconnected to NATS %s", self._nc.connected_url.geturl() if self._nc.connected_url else "?")

    async def close(self) -> None:
        """Send what is buffered (acks), then close. Not drain(): it waits up to 30 s on the consumers'
        open pull requests, and what a writer took without acknowledging comes back anyway."""
        if self._nc is None or self._nc.is_closed:
            return
        with contextlib.suppress(Exception):  # closing anyway
            await self._nc.flush(timeout=2)
        with contextlib.suppress(Exception):
            await self._nc.close()

    async def ensure_streams(self, streams: Sequence[StreamSpec]) -> None:
        for spec in streams:
            config = api.StreamConfig(
                name=spec.name, subjects=list(spec.subjects), retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE, max_age=spec.max_age_s, max_bytes=spec.max_bytes or -1,
                num_replicas=spec.replicas, duplicate_window=spec.duplicate_window_s,
                discard=api.DiscardPolicy.OLD)
            try:
                try:
                    have = (await self._js.stream_info(spec.name)).config
                except nats.js.errors.NotFoundError:
                    await self._js.add_stream(config)
                    log.info("bus: stream %s created (%s, %d replica(s))", spec.name, ", ".join(spec.subjects),
                             spec.replicas)
                else:
                    # every member ensures the streams at its start: one that finds them as wanted asks
                    # nothing more (an update is a proposal to the JetStream cluster's metadata group)
                    changed = _differs(have, config)
                    if changed:
                        await self._js.update_stream(config)
                        log.info("bus: stream %s updated (%s)", spec.name, ", ".join(changed))
            except nats.js.errors.APIError as e:
                if e.err_code == NO_SUITABLE_PEERS:  # fewer JetStream peers up than replicas: nodes starting
                    raise BusUnavailable(f"stream {spec.name}: {e}") from None
                raise BusError(f"stream {spec.name}: JetStream refused its configuration: {e}") from None
            except _UNAVAILABLE as e:
                raise BusUnavailable(f"stream {spec.name}: no answer from JetStream: {e}") from None

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> PublishAck:
        headers = {api.Header.MSG_ID: msg_id} if msg_id else None
        try:
            ack = await self._js.publish(subject, data, headers=headers)
        except nats.js.errors.APIError as e:
            if e.code == 503:
                raise BusUnavailable(f"JetStream unavailable for {subject}: {e}") from None
            raise BusError(f"JetStream refused a message on {subject}: {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"no acknowledgement from JetStream for {subject} within "
                                 f"{self.cfg.publish_timeout:g} s ({type(e).__name__})") from None
        self._published += 1
        return PublishAck(ack.stream, ack.seq, bool(ack.duplicate))

    async def consumer(self, stream: str, durable: str, filter_subject: str, ack_wait_s: float,
                       max_pending: int, start_s: float | None = None, idle_s: float | None = None) -> NatsConsumer:
        config = api.ConsumerConfig(durable_name=durable, ack_policy=api.AckPolicy.EXPLICIT,
                                    deliver_policy=api.DeliverPolicy.ALL, ack_wait=ack_wait_s,
                                    max_ack_pending=max_pending, filter_subject=filter_subject, max_deliver=-1,
                                    inactive_threshold=idle_s)
        if start_s is not None:
            config.deliver_policy = api.DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.datetime.fromtimestamp(start_s, datetime.UTC)
        try:
            try:
                await self._js.add_consumer(stream, config)
            except nats.js.errors.BadRequestError as e:  # it exists with other settings: keep it, say so
                log.warning("bus: consumer %s of %s exists with other settings (%s); using it as it is",
                            durable, stream, e.description)
            sub = await self._js.pull_subscribe_bind(durable=durable, stream=stream)
        except nats.js.errors.APIError as e:
            raise BusError(f"consumer {durable} of {stream}: {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"consumer {durable} of {stream}: no answer from JetStream: {e}") from None
        return NatsConsumer(sub)

    async def delete_consumer(self, stream: str, durable: str) -> bool:
        try:
            return bool(await self._js.delete_consumer(stream, durable))
        except nats.js.errors.NotFoundError:
            return False
        except nats.js.errors.APIError as e:
            raise BusError(f"consumer {durable} of {stream}: {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"consumer {durable} of {stream}: no answer from JetStream: {e}") from None

    async def replay(self, stream: str, filter_subject: str, start_s: float) -> NatsConsumer:
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.BY_START_TIME,
                                    opt_start_time=datetime.datetime.fromtimestamp(start_s, datetime.UTC),
                                    inactive_threshold=REPLAY_IDLE_S)
        try:
            sub = await self._js.pull_subscribe(filter_subject, stream=stream, config=config)
        except nats.js.errors.APIError as e:
            raise BusError(f"replay of {stream} ({filter_subject}): {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"replay of {stream}: no answer from JetStream: {e}") from None
        name = config.name

        async def delete() -> None:
            await self._js.delete_consumer(stream, name)
        return NatsConsumer(sub, delete)

    async def key_value(self, spec: KvSpec) -> NatsKeyValue:
        config = api.KeyValueConfig(bucket=spec.name, history=1, ttl=spec.ttl_s, replicas=spec.replicas,
                                    storage=api.StorageType.MEMORY)  # liveness: nothing worth a disk
        try:
            try:
                kv = await self._js.key_value(spec.name)
            except nats.js.errors.BucketNotFoundError:
                kv = await self._js.create_key_value(config)
                log.info("bus: bucket %s created (ttl %g s)", spec.name, spec.ttl_s)
            else:
                info = await self._js.stream_info(f"KV_{spec.name}")
                if info.config.max_age != spec.ttl_s:
                    info.config.max_age = spec.ttl_s
                    info.config.duplicate_window = min(info.config.duplicate_window or spec.ttl_s, spec.ttl_s)
                    await self._js.update_stream(info.config)
                    log.info("bus: bucket %s ttl set to %g s", spec.name, spec.ttl_s)
        except nats.js.errors.APIError as e:
            raise BusError(f"bucket {spec.name}: JetStream refused it: {e}") from None
        except _UNAVAILABLE as e:
            raise BusUnavailable(f"bucket {spec.name}: no answer from JetStream: {e}") from None
        return NatsKeyValue(kv, config, self._js)

    @property
    def max_message_bytes(self) -> int:
        return int(self._nc.max_payload) if self._nc is not None else 1 << 20

    def health(self) -> dict[str, object]:
        connected = self._nc is not None and self._nc.is_connected
        url = self._nc.connected_url.geturl() if connected and self._nc.connected_url else None
        return {"backend": self.name, "ok": connected, "server": url, "published": self._published}
