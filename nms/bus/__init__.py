"""The telemetry bus contract: durable streams of messages, published with an acknowledgement and
consumed by durable consumers that acknowledge what they handled (docs/cluster.md).

A backend (NATS JetStream today: nms/bus/nats.py; the `nms.buses` entry-point group) maps it onto a
proven engine; the project never implements a broker. Vocabulary:

- a *stream* keeps the messages of its subjects (one stream per record family) for a retention time;
- a *subject* is dot-separated tokens; the last one carries the partition key (a host, a device),
  so that consumers may later take partitions by subject filter;
- a *durable consumer* remembers what was acknowledged: its members share its messages, and what one
  took but never acknowledged (it died) is delivered again after `ack_wait`;
- a *key-value bucket* keeps the latest value of each key for `ttl_s` after it was last put: what
  is not put again in time is gone (the live members of a role: nms/app/membership.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class BusError(Exception):
    """The bus refused a request (bad stream or subject, configuration the engine rejects)."""


class BusUnavailable(BusError):
    """The bus did not answer (down, no acknowledgement in time): retry later; nothing was taken."""


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    max_bytes: int | None = None
    replicas: int = 1
    duplicate_window_s: float = 120.0


@dataclass(frozen=True)
class PublishAck:
    stream: str
    seq: int
    duplicate: bool  # the engine already had a message with this id (inside the duplicate window)


@dataclass(frozen=True)
class KvSpec:
    name: str  # [A-Za-z0-9_-]
    ttl_s: float  # an entry not put again within it expires
    replicas: int = 1


class KeyValue(Protocol):
    async def put(self, key: str, value: bytes) -> None:
        """Set the key (and restart its ttl). Raises BusUnavailable."""

    async def delete(self, key: str) -> None: ...

    async def items(self) -> dict[str, bytes]:
        """Every key not deleted nor expired, with its latest value. Raises BusUnavailable."""


class Message(Protocol):
    subject: str
    data: bytes

    @property
    def deliveries(self) -> int:
        """1 on the first delivery, more when it is delivered again."""

    @property
    def seq(self) -> int:
        """The message's position in its stream (the same on every delivery)."""

    @property
    def pending(self) -> int:
        """How many messages of its consumer were left after this one when it was delivered."""

    async def ack(self) -> None:
        """Handled: never deliver again."""

    async def nak(self, delay_s: float | None = None) -> None:
        """Not handled now: deliver again (after delay_s)."""

    async def term(self) -> None:
        """Never deliver again to this consumer, though not handled (it stays in the stream)."""


class Consumer(Protocol):
    async def fetch(self, max_messages: int, timeout_s: float) -> list[Message]:
        """Up to max_messages, waiting at most timeout_s for the first; [] when none came."""

    async def close(self) -> None:
        """Stop taking messages here (a replay's consumer is deleted; a durable one stays)."""


class Bus(Protocol):
    name: str

    async def connect(self) -> None:
        """Connect; raises BusUnavailable when no server answers."""

    async def close(self) -> None: ...

    async def ensure_streams(self, streams: Sequence[StreamSpec]) -> None:
        """Create the streams, or bring existing ones to this configuration."""

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> PublishAck:
        """Store a message durably; returns once the engine acknowledged it. Raises BusUnavailable."""

    async def consumer(self, stream: str, durable: str, filter_subject: str, ack_wait_s: float,
                       max_pending: int, start_s: float | None = None, idle_s: float | None = None) -> Consumer:
        """A durable pull consumer (created if missing) that this process joins. A new one starts at
        the stream's first message, or at the first one stored at or after `start_s` (epoch seconds);
        with `idle_s`, the engine deletes it once no one fetched from it for that long."""

    async def delete_consumer(self, stream: str, durable: str) -> bool:
        """Delete a durable consumer; False when there was none."""

    async def replay(self, stream: str, filter_subject: str, start_s: float) -> Consumer:
        """A consumer of this process alone, not acknowledged, from the first message of filter_subject
        stored at or after `start_s` (epoch seconds): to re-read what a stream retains."""

    async def key_value(self, spec: KvSpec) -> KeyValue:
        """A key-value bucket (created if missing, its ttl brought to spec's) whose entries expire."""

    @property
    def max_message_bytes(self) -> int:
        """The largest message the engine takes."""

    def health(self) -> dict[str, object]: ...


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def subject_token(value: str) -> str:
    """`value` as one subject token: every byte outside [A-Za-z0-9_-] becomes %XX (so a dotted host
    name stays one token, and tokens never hold the wildcards '*' and '>')."""
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), value) or "%00"
