"""Telemetry records on the bus (docs/cluster.md): one stream per record family, subjects
`<prefix>.tel.<family>.<kind>.<partition key>`, messages that are ingest bodies (`{"items": [...]}`),
so that whoever consumes them decodes them through the ingest's own validation.

The partition key is the host a record comes from (nms.app.binding.HOST_FIELD) or the device it is
about; records of one batch with several keys become several messages.

One more stream, `polled`, carries what `poll` members hand the other members (nms/app/polled.py):
the switch records the correlator reads (port state and rates, queue rates, link events, interface
addresses), and for every member's view of the fabric (nms/app/polled_view.py) each poll's outcome
(DeviceStatus), LLDP neighbours and device facts. Poll members store their records themselves, so
writers do not consume it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from nms.app.binding import HOST_FIELD
from nms.bus import Bus, BusError, StreamSpec, subject_token
from nms.config.models import BusConfig
from nms.records import (
    INGEST_KINDS,
    DeviceFacts,
    DeviceStatus,
    GenericPoint,
    InterfaceAddress,
    LinkEvent,
    LldpNeighbor,
    PortRates,
    PortSample,
    QueueRates,
)

# record family -> the ingest kinds its stream carries
FAMILIES: dict[str, tuple[str, ...]] = {
    "switch": ("port_samples", "port_rates", "queue_samples", "queue_rates"),
    "probe": ("probe_windows", "path_events", "probe_paths", "clock_edges", "clock_solutions"),
    "host": ("host_nic_samples", "points"),
    "nccl": ("nccl_comms", "nccl_collectives", "nccl_proxy_ops", "nccl_proxy_steps", "nccl_step_stats",
             "nccl_rdma_qps"),
}
FAMILY_OF = {kind: family for family, kinds in FAMILIES.items() for kind in kinds}
# a kind added to INGEST_KINDS and not placed above still travels (tests/test_telemetry_bus.py asks
# that every kind be placed): by its name's prefix
for _kind in INGEST_KINDS:
    FAMILY_OF.setdefault(_kind, "nccl" if _kind.startswith("nccl_") else "host")

POLLED = "polled"
# what only the members' views of the fabric read (nms/app/polled_view.py), not the correlator
VIEW_KINDS: dict[str, type] = {"device_status": DeviceStatus, "lldp_neighbors": LldpNeighbor,
                               "device_facts": DeviceFacts}
# the polled stream's kinds (those no ingest takes: only collectors and pollers make them)
POLLED_KINDS: dict[str, type] = {"port_samples": PortSample, "port_rates": PortRates, "queue_rates": QueueRates,
                                 "link_events": LinkEvent, "interface_addresses": InterfaceAddress, **VIEW_KINDS}
BUS_KINDS: dict[str, type] = {**INGEST_KINDS, **POLLED_KINDS}
CORRELATED = (*FAMILIES, POLLED)  # the streams correlate members read (writers read FAMILIES)

_LISTS = {kind: TypeAdapter(list[model]) for kind, model in BUS_KINDS.items()}  # type: ignore[valid-type]
_ENVELOPE_BYTES = len(b'{"items":}')
# the ingest's batch envelope: {"items": [record, ...]} and no other key, the records strict as on ingest
_BATCHES: dict[str, type[BaseModel]] = {
    kind: create_model(f"{model.__name__}BusBatch", __config__=ConfigDict(extra="forbid"),
                       items=(list[model], ...))  # type: ignore[valid-type]
    for kind, model in BUS_KINDS.items()}
NO_KEY = "_"


def stream_name(prefix: str, family: str) -> str:
    return f"{prefix}_TEL_{family}".upper()


def family_subjects(prefix: str, family: str) -> str:
    return f"{prefix}.tel.{family}.>"


def subject(prefix: str, kind: str, key: str, family: str | None = None) -> str:
    return f"{prefix}.tel.{family or FAMILY_OF[kind]}.{kind}.{subject_token(key)}"


def kind_of(subject_: str) -> str | None:
    """The ingest kind a telemetry subject carries (None if it is not one)."""
    parts = subject_.split(".")
    return parts[3] if len(parts) == 5 and parts[1] == "tel" and parts[3] in BUS_KINDS else None


def stream_specs(cfg: BusConfig) -> list[StreamSpec]:
    return [StreamSpec(stream_name(cfg.prefix, family), (family_subjects(cfg.prefix, family),),
                       max_age_s=cfg.retention, max_bytes=cfg.max_bytes, replicas=cfg.replicas,
                       duplicate_window_s=cfg.duplicate_window)
            for family in CORRELATED]


def partition_key(record: Any) -> str:
    """The host a record comes from, else the device it is about; NO_KEY when it names neither."""
    if isinstance(record, GenericPoint):
        return record.tags.get("host") or record.tags.get("device") or NO_KEY
    attr = HOST_FIELD.get(type(record))
    if attr is not None:
        return str(getattr(record, attr))
    return str(getattr(record, "device", None) or getattr(record, "host", None) or NO_KEY)


def encode(kind: str, records: Sequence[Any], max_bytes: int) -> list[bytes]:
    """Records of one kind as ingest bodies of at most max_bytes each (halved until they fit)."""
    items = _LISTS[kind].dump_json(list(records))
    if len(items) + _ENVELOPE_BYTES <= max_bytes:
        return [b'{"items":' + items + b"}"]
    if len(records) == 1:
        raise BusError(f"one {kind} record is {len(items)} bytes, more than the bus takes ({max_bytes})")
    half = len(records) // 2
    return encode(kind, records[:half], max_bytes) + encode(kind, records[half:], max_bytes)


def decode(subject_: str, data: bytes) -> tuple[str, list[Any]]:
    """(kind, records) of a telemetry message; BusError naming what is wrong with it."""
    kind = kind_of(subject_)
    if kind is None:
        raise BusError(f"{subject_!r} is not a telemetry subject (<prefix>.tel.<family>.<kind>.<key>)")
    try:
        return kind, list(_BATCHES[kind].model_validate_json(data).items)  # type: ignore[attr-defined]
    except ValidationError as e:
        raise BusError(f"{subject_}: not a batch of {kind}: {e.error_count()} error(s), first: "
                       f"{e.errors(include_input=False)[0]['msg']}") from None


def by_key(records: Iterable[Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for record in records:
        groups.setdefault(partition_key(record), []).append(record)
    return groups


class TelemetryPublisher:
    """Validated ingest records -> the bus; returns once JetStream acknowledged every message."""

    def __init__(self, bus: Bus, cfg: BusConfig, registry: CollectorRegistry) -> None:
        self.bus = bus
        self.prefix = cfg.prefix
        self.messages = Counter("nms_bus_published_messages", "telemetry messages published, by outcome",
                                ["kind", "result"], registry=registry)

    async def publish(self, kind: str, records: Sequence[Any], family: str | None = None) -> int:
        """Publish the records (on their kind's family's stream, or `family`'s); raise BusUnavailable /
        BusError unless every message was acknowledged (the caller answers 503 and the sender retries:
        a message published twice is stored once)."""
        limit = self.bus.max_message_bytes - 1024  # room for headers
        messages = [(subject(self.prefix, kind, key, family), body)
                    for key, group in by_key(records).items() for body in encode(kind, group, limit)]
        results = await asyncio.gather(*(self.bus.publish(s, body, msg_id=_msg_id(s, body)) for s, body in messages),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        self.messages.labels(kind, "acked").inc(len(results) - len(failed))
        if failed:
            self.messages.labels(kind, "failed").inc(len(failed))
            raise failed[0]
        return len(records)


def _msg_id(subject_: str, body: bytes) -> str:
    """The same batch on the same subject has the same id: JetStream keeps one (duplicate window)."""
    return hashlib.blake2b(subject_.encode() + b"\n" + body, digest_size=16).hexdigest()
