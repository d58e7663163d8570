"""The typed records of the pipeline: the one vocabulary every stage speaks.

Telemetry records know how to become store points (`to_point`): their measurement name, which
attributes are tags (identifiers) and which are fields (numbers). Timestamps are integer
nanoseconds since the Unix epoch (UTC); the API also accepts RFC 3339 strings for them.

Records that later stages need (Finding, Incident, Action, ...) are added here when those stages
land, so this module stays the single home of the vocabulary.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from nms.store.base import INT64_MAX, Point

U64_MAX = (1 << 64) - 1


def _to_ns(value: Any) -> Any:
    """Accept ns integers or RFC 3339 strings / datetimes; return ns."""
    if isinstance(value, bool):
        raise ValueError("expected integer nanoseconds or an RFC 3339 timestamp, not a boolean")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("expected integer nanoseconds or an RFC 3339 timestamp") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("timestamp needs a timezone (e.g. a trailing Z)")
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000
    return value


TimestampNs = Annotated[int, BeforeValidator(_to_ns), Field(ge=0, le=INT64_MAX)]
Counter = Annotated[int, Field(ge=0, le=U64_MAX)]
Ident = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\\]+$")]
OperStatus = Literal["up", "down", "testing", "unknown", "dormant", "notPresent", "lowerLayerDown"]


class Record(BaseModel):
    # strict: no silent coercions (a boolean is not a counter, "5" is not a number)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class TelemetryRecord(Record):
    """A record stored as one point: `measurement`, the attributes named in `tag_keys` as tags,
    the other non-null attributes as fields, `time_attr` as the timestamp."""

    measurement: ClassVar[str]
    tag_keys: ClassVar[tuple[str, ...]]
    time_attr: ClassVar[str] = "ts"

    _value_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._value_keys = tuple(k for k in cls.model_fields if k not in cls.tag_keys and k != cls.time_attr)

    def to_point(self) -> Point:
        data = self.__dict__
        tags = {k: data[k] for k in self.tag_keys if data[k] is not None}
        fields = {k: v for k in self._value_keys if (v := data[k]) is not None}
        for key, value in fields.items():
            # InfluxDB has no unsigned integers: counters past 2^63 are kept as floats.
            if value.__class__ is int and value > INT64_MAX:
                fields[key] = float(value)
        return Point(self.measurement, tags, fields, data[self.time_attr])


class PortSample(TelemetryRecord):
    """Raw interface counters of one switch port at one instant (as polled)."""

    measurement: ClassVar[str] = "port_counters"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port")

    device: Ident
    port: Ident
    ts: TimestampNs
    in_octets: Counter | None = None
    out_octets: Counter | None = None
    in_pkts: Counter | None = None
    out_pkts: Counter | None = None
    in_errors: Counter | None = None
    out_errors: Counter | None = None
    in_discards: Counter | None = None
    out_discards: Counter | None = None
    oper_status: OperStatus | None = None
    speed_bps: Counter | None = None
    mtu: int | None = Field(None, ge=0, le=1 << 20)
    uptime_ticks: Counter | None = Field(None, description="sysUpTime (1/100 s) when sampled: reboot detection")


class PortRates(TelemetryRecord):
    """Per-second rates of one port over one polling interval (after wrap/reset-safe counter math)."""

    measurement: ClassVar[str] = "port_rates"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port")

    device: Ident
    port: Ident
    ts: TimestampNs
    interval_s: float = Field(gt=0)
    in_bps: float | None = Field(None, ge=0)
    out_bps: float | None = Field(None, ge=0)
    in_utilization: float | None = Field(None, ge=0)
    out_utilization: float | None = Field(None, ge=0)
    in_errors_ps: float | None = Field(None, ge=0)
    out_errors_ps: float | None = Field(None, ge=0)
    in_discards_ps: float | None = Field(None, ge=0)
    out_discards_ps: float | None = Field(None, ge=0)


class HostNicSample(TelemetryRecord):
    """Counters of one host NIC (sysfs / ethtool -S)."""

    measurement: ClassVar[str] = "host_nic"
    tag_keys: ClassVar[tuple[str, ...]] = ("host", "nic")

    host: Ident
    nic: Ident
    ts: TimestampNs
    rx_bytes: Counter | None = None
    tx_bytes: Counter | None = None
    rx_packets: Counter | None = None
    tx_packets: Counter | None = None
    rx_errors: Counter | None = None
    tx_errors: Counter | None = None
    rx_dropped: Counter | None = None
    tx_dropped: Counter | None = None
    pause_rx: Counter | None = None
    pause_tx: Counter | None = None
    ecn_marked: Counter | None = None
    cnp_sent: Counter | None = None
    cnp_received: Counter | None = None
    oper_status: OperStatus | None = None


class ProbeWindow(TelemetryRecord):
    """One second of probing on one (peer, path): loss and raw one-way delays in local clocks."""

    measurement: ClassVar[str] = "probe_window"
    tag_keys: ClassVar[tuple[str, ...]] = ("src_host", "src_nic", "dst_host", "dst_nic", "path_id")
    time_attr: ClassVar[str] = "window_start"

    src_host: Ident
    src_nic: Ident
    dst_host: Ident
    dst_nic: Ident
    path_id: Ident
    window_start: TimestampNs
    window_s: float = Field(1.0, gt=0)
    sport: int | None = Field(None, ge=0, le=65535)
    sent: int = Field(ge=0)
    received: int = Field(ge=0)
    owd_fwd_min_ns: int | None = None
    owd_fwd_p50_ns: int | None = None
    owd_fwd_p99_ns: int | None = None
    owd_rev_min_ns: int | None = None
    owd_rev_p50_ns: int | None = None
    owd_rev_p99_ns: int | None = None
    rtt_min_ns: int | None = Field(None, ge=0)
    rtt_p50_ns: int | None = Field(None, ge=0)
    rtt_p99_ns: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _received_le_sent(self) -> ProbeWindow:
        if self.received > self.sent:
            raise ValueError("received cannot exceed sent")
        return self

    @property
    def loss(self) -> float:
        return 0.0 if self.sent == 0 else 1.0 - self.received / self.sent


class PathEvent(TelemetryRecord):
    """A probed path went down (no replies for `down_after`) or came back; pushed at once."""

    measurement: ClassVar[str] = "path_event"
    tag_keys: ClassVar[tuple[str, ...]] = ("src_host", "src_nic", "dst_host", "dst_nic", "path_id")

    src_host: Ident
    src_nic: Ident
    dst_host: Ident
    dst_nic: Ident
    path_id: Ident
    ts: TimestampNs
    state: Literal["down", "up"]
    reason: str | None = Field(None, max_length=512)


class ClockEdge(TelemetryRecord):
    """Pairwise clock estimate for one window: clock(b) - clock(a) = offset_ns + drift_ppb * t."""

    measurement: ClassVar[str] = "clock_edge"
    tag_keys: ClassVar[tuple[str, ...]] = ("host_a", "host_b", "method")
    time_attr: ClassVar[str] = "window_start"

    host_a: Ident
    host_b: Ident
    method: Literal["svm", "ntp"]
    window_start: TimestampNs
    window_s: float = Field(gt=0)
    offset_ns: float
    drift_ppb: float
    bound_ns: float = Field(ge=0)
    pure_pairs: int = Field(ge=0)


class ClockSolution(TelemetryRecord):
    """Per-host clock offset/drift after the network-effect solve."""

    measurement: ClassVar[str] = "clock_solution"
    tag_keys: ClassVar[tuple[str, ...]] = ("host",)
    time_attr: ClassVar[str] = "window_start"

    host: Ident
    window_start: TimestampNs
    offset_ns: float
    drift_ppb: float
    bound_ns: float = Field(ge=0)


class RankPlacement(Record):
    rank: int = Field(ge=0)
    host: Ident
    nic: Ident | None = None


class Job(Record):
    """A training/inference job: the metadata the correlator joins with fabric telemetry."""

    id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]*$")]
    name: str = Field("", max_length=256)
    hosts: list[Ident] = Field(default_factory=list, max_length=100_000)
    nics: list[Annotated[str, Field(pattern=r"^[^:\s]+:\S+$")]] = Field(
        default_factory=list, description="host:nic", max_length=100_000)
    ranks: list[RankPlacement] = Field(default_factory=list, max_length=1_000_000)
    start: TimestampNs
    end: TimestampNs | None = None
    labels: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=64)

    @model_validator(mode="after")
    def _check(self) -> Job:
        if self.end is not None and self.end < self.start:
            raise ValueError("end is before start")
        known = set(self.hosts)
        for nic in self.nics:
            if nic.split(":", 1)[0] not in known:
                raise ValueError(f"nic {nic!r} is on a host not listed in hosts")
        for placement in self.ranks:
            if placement.host not in known:
                raise ValueError(f"rank {placement.rank} is on host {placement.host!r} not listed in hosts")
        return self


class GenericPoint(Record):
    """A raw point for telemetry that has no record type of its own (scripts, other tools)."""

    measurement: str = Field(min_length=1, max_length=256)
    tags: dict[str, str] = Field(default_factory=dict, max_length=64)
    fields: dict[str, bool | int | float | str] = Field(min_length=1, max_length=256)
    ts: TimestampNs

    def to_point(self) -> Point:
        return Point(self.measurement, dict(self.tags), dict(self.fields), self.ts)


# Record kinds accepted by POST /ingest/<kind>.
INGEST_KINDS: dict[str, type[TelemetryRecord] | type[GenericPoint]] = {
    "port_samples": PortSample,
    "port_rates": PortRates,
    "host_nic_samples": HostNicSample,
    "probe_windows": ProbeWindow,
    "path_events": PathEvent,
    "clock_edges": ClockEdge,
    "clock_solutions": ClockSolution,
    "points": GenericPoint,
}
