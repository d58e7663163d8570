"""The typed records of the pipeline: the one vocabulary every stage speaks.

Telemetry records know how to become store points (`to_point`): their measurement name, which
attributes are tags (identifiers) and which are fields (numbers). Timestamps are integer
nanoseconds since the Unix epoch (UTC); the API also accepts RFC 3339 strings for them.

Records that later stages need are added here when those stages land, so this
module stays the single home of the vocabulary.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from nms.store.base import INT64_MAX, INT64_MIN, MAX_TIMESTAMP_NS, UINT64_MAX, FieldType, Point, declare_fields

U64_MAX = UINT64_MAX


def _to_ns(value: Any) -> Any:
    """Accept ns integers or RFC 3339 strings / datetimes; return ns."""
    if isinstance(value, bool):
        raise ValueError("expected integer nanoseconds or an RFC 3339 timestamp, not a boolean")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():  # JSON's 3.0 is 3 (see Record)
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("expected integer nanoseconds or an RFC 3339 timestamp") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("timestamp needs a timezone (e.g. a trailing Z)")
        delta = value - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000
    return value


# the bounds before the validator: so they appear in the JSON schema as minimum/maximum
TimestampNs = Annotated[int, Field(ge=0, le=MAX_TIMESTAMP_NS), BeforeValidator(_to_ns)]
Counter = Annotated[int, Field(ge=0, le=U64_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]  # what the stores keep of an integer
Ident = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\\]+$")]
OperStatus = Literal["up", "down", "testing", "unknown", "dormant", "notPresent", "lowerLayerDown"]


class Record(BaseModel):
    # strict: no silent coercions (a boolean is not a counter, "5" is not a number)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # JSON does not tell 3 from 3.0, nor does JSON Schema (whose "integer" is any number without a
    # fraction): an integer attribute takes an integral float as that integer. Set per subclass.
    _int_attrs: ClassVar[frozenset[str]] = frozenset()
    _int_list_attrs: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        scalars, lists = set(), set()
        for name, prop in cls.model_json_schema()["properties"].items():
            for option in prop.get("anyOf", [prop]):
                if option.get("type") == "integer":
                    scalars.add(name)
                elif option.get("type") == "array" and option.get("items", {}).get("type") == "integer":
                    lists.add(name)
        cls._int_attrs, cls._int_list_attrs = frozenset(scalars), frozenset(lists)

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not (cls._int_attrs or cls._int_list_attrs):
            return data
        changed = None
        for name in cls._int_attrs.intersection(data):
            value = data[name]
            if value.__class__ is float and value.is_integer():
                changed = changed or dict(data)
                changed[name] = int(value)
        for name in cls._int_list_attrs.intersection(data):
            values = data[name]
            if isinstance(values, list) and any(v.__class__ is float for v in values):
                changed = changed or dict(data)
                changed[name] = [int(v) if v.__class__ is float and v.is_integer() else v for v in values]
        return data if changed is None else changed


def _stored_type(prop: dict[str, Any]) -> FieldType:
    """The store type of one attribute, from its JSON schema: a Counter (integer up to 2^64-1) is
    unsigned, whatever value it holds."""
    options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
    [option] = options  # one type per attribute: a union of two would make the stored type value-dependent
    kind = option.get("type", "string" if "enum" in option or "const" in option else None)
    if kind == "integer":
        return "unsigned" if option.get("maximum", 0) > INT64_MAX else "integer"
    by_kind: dict[str, FieldType] = {"number": "float", "boolean": "boolean", "string": "string"}
    return by_kind[kind]


class TelemetryRecord(Record):
    """A record stored as one point: `measurement`, the attributes named in `tag_keys` as tags,
    the other non-null attributes as fields, `time_attr` as the timestamp. Each field's stored type
    is declared to the store from the attribute's type (nms.store.base.declare_fields)."""

    measurement: ClassVar[str]
    tag_keys: ClassVar[tuple[str, ...]]
    time_attr: ClassVar[str] = "ts"

    _value_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._value_keys = tuple(k for k in cls.model_fields if k not in cls.tag_keys and k != cls.time_attr)
        if "measurement" in cls.__dict__:
            props = cls.model_json_schema()["properties"]
            declare_fields(cls.measurement, {k: _stored_type(props[k]) for k in cls._value_keys})

    def to_point(self) -> Point:
        data = self.__dict__
        tags = {k: data[k] for k in self.tag_keys if data[k] is not None}
        fields = {k: v for k in self._value_keys if (v := data[k]) is not None}
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
    discontinuity_ticks: Counter | None = Field(
        None, description="ifCounterDiscontinuityTime: a change means the counters restarted (rates dropped)")
    last_change_ticks: Counter | None = Field(
        None, description="ifLastChange: a change with the same oper status means the link went away and back")
    counter_bits: Literal[32, 64] | None = Field(
        None, description="width of in/out_octets and in/out_pkts where it varies by device or port (SNMP: 32 "
                          "from the ifTable of a device without ifXTable); None: as the collector declares")
    # the counters `counter_bits` is the width of
    traffic_counters: ClassVar[tuple[str, ...]] = ("in_octets", "out_octets", "in_pkts", "out_pkts")

    @model_validator(mode="after")
    def _fit_width(self) -> PortSample:
        if self.counter_bits == 32 and any((getattr(self, c) or 0) >> 32 for c in self.traffic_counters):
            raise ValueError("a counter above 2^32-1 in a sample whose counter_bits is 32")
        return self


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


class QueueSample(TelemetryRecord):
    """Raw counters of one egress queue of one switch port at one instant (openconfig-qos
    /qos/interfaces/interface/output/queues/queue/state, or a Linux qdisc). ECN marks only where
    the source counts them: None is "not counted here", never zero."""

    measurement: ClassVar[str] = "queue_counters"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port", "queue")

    device: Ident
    port: Ident
    queue: Ident = Field(description="the queue's name on the port (openconfig-qos `name`; Linux: the qdisc's "
                                     "parent, `root` for the port's root qdisc)")
    ts: TimestampNs
    transmit_pkts: Counter | None = None
    transmit_octets: Counter | None = None
    dropped_pkts: Counter | None = Field(None, description="tail drops and AQM drops of the queue (overrun)")
    dropped_octets: Counter | None = None
    ecn_marked_pkts: Counter | None = Field(None, description="packets whose ECN codepoint went from ECT to CE")


class QueueRates(TelemetryRecord):
    """Per-second rates of one egress queue over one interval (the counter math of PortRates)."""

    measurement: ClassVar[str] = "queue_rates"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port", "queue")

    device: Ident
    port: Ident
    queue: Ident
    ts: TimestampNs
    interval_s: float = Field(gt=0)
    transmit_bps: float | None = Field(None, ge=0)
    transmit_pps: float | None = Field(None, ge=0)
    dropped_pps: float | None = Field(None, ge=0)
    dropped_bps: float | None = Field(None, ge=0)
    ecn_marked_pps: float | None = Field(None, ge=0)


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
    mtu: int | None = Field(None, ge=0, le=1_000_000, description="the NIC's MTU (the audits' end-to-end MTU check)")
    speed_bps: int | None = Field(None, ge=0, le=INT64_MAX,
                                  description="negotiated speed; absent when the NIC does not say")


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
    sent: int = Field(ge=0, le=INT64_MAX)
    received: int = Field(ge=0, le=INT64_MAX)
    owd_fwd_min_ns: Int64 | None = None
    owd_fwd_p50_ns: Int64 | None = None
    owd_fwd_p99_ns: Int64 | None = None
    owd_rev_min_ns: Int64 | None = None
    owd_rev_p50_ns: Int64 | None = None
    owd_rev_p99_ns: Int64 | None = None
    rtt_min_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    rtt_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    rtt_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    pairs: int | None = Field(None, ge=0, le=INT64_MAX, description="coded probe pairs sent in this window")
    pure_pairs: int | None = Field(None, ge=0, le=INT64_MAX,
                                   description="pairs whose receive spacing matched their send "
                                               "spacing within the guard, both ways (clock sync)")
    # Filled by the service at ingest from its latest clock solve (the clock service's), when fresh:
    # fwd corrected = fwd - offset, rev corrected = rev + offset; absent when no fresh solution.
    clock_offset_ns: float | None = Field(None, description="clock_dst - clock_src applied to the *_corr_ns "
                                                            "delays (service-side clock sync)")
    owd_fwd_min_corr_ns: Int64 | None = None
    owd_fwd_p50_corr_ns: Int64 | None = None
    owd_fwd_p99_corr_ns: Int64 | None = None
    owd_rev_min_corr_ns: Int64 | None = None
    owd_rev_p50_corr_ns: Int64 | None = None
    owd_rev_p99_corr_ns: Int64 | None = None

    @model_validator(mode="after")
    def _received_le_sent(self) -> ProbeWindow:
        if self.received > self.sent:
            raise ValueError("received cannot exceed sent")
        if self.pure_pairs is not None and self.pairs is not None and self.pure_pairs > self.pairs:
            raise ValueError("pure_pairs cannot exceed pairs")
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
    sport: int | None = Field(None, ge=0, le=65535)
    since_ns: TimestampNs | None = Field(None, description="down: when the last reply arrived; up: when the "
                                                           "path was declared down")


class ProbePath(TelemetryRecord):
    """One probed ECMP path as a Paris traceroute found it: the router hops each way, by address
    (each router answers from the interface the probe came in on; '*' = no answer). `path_id` is a
    stable hash of the endpoints and both hop lists; ProbeWindow/PathEvent carry the same id."""

    measurement: ClassVar[str] = "probe_path"
    tag_keys: ClassVar[tuple[str, ...]] = ("src_host", "src_nic", "dst_host", "dst_nic", "path_id")

    src_host: Ident
    src_nic: Ident
    dst_host: Ident
    dst_nic: Ident
    path_id: Ident
    ts: TimestampNs
    src_addr: str = Field(max_length=64)
    dst_addr: str = Field(max_length=64)
    dport: int = Field(ge=0, le=65535)
    sports: str = Field(max_length=4096, description="comma-separated source ports that take this path")
    probed_sport: int | None = Field(None, ge=0, le=65535, description="the source port probing this path")
    fwd_hops: str = Field(max_length=1024, description="comma-separated router addresses, source side first")
    rev_hops: str = Field(max_length=1024, description="the reply direction's routers, peer side first")
    fwd_complete: bool = Field(description="the destination answered the forward trace")
    rev_complete: bool = Field(description="the reverse trace reached this host")


class ClockEdge(TelemetryRecord):
    """Pairwise clock estimate of one prober for one window (input of the network-effect solve,
    nms.clock_solve).

    host_a is the prober that computed it, host_b its peer; method "svm" is the max-margin (LP)
    estimate from pure pairs, "ntp" the min-RTT baseline. The window starts at window_start in
    host_a's clock (ns since the epoch), is window_s long (default 2 s) and aligned to multiples of
    window_s in host_a's clock. At host_a-clock time t (ns):

        theta(t) = clock_b - clock_a = offset_ns + drift_ppb * (t - window_start) / 1e9

    so drift_ppb is the drift of b relative to a in ns per second. bound_ns (>= 0) is the edge's
    uncertainty, not a hard bound: svm, the envelopes' noise floor + the margin's excess over the
    pair's baseline (what queueing can bias), ntp, the scatter of its samples; the solve weighs the
    edge 1 / max(bound_ns, 20, median / 4)^2. Each direction (a->b, b->a) is an observation of its own.
    """

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
    pure_pairs: int = Field(ge=0, le=INT64_MAX)
    margin_ns: float | None = Field(None, ge=0, description="svm: half the gap between the envelopes at the "
                                                            "fitted line, (min fwd + min rev one-way delay) / 2")


class ClockSolution(TelemetryRecord):
    """Per-host clock offset/drift after the network-effect solve, for the slot of fabric time
    starting at window_start: clock_host - fabric time = offset_ns + drift_ppb * (t - window_start) / 1e9,
    fabric time being the mean of the clocks of the host's connected component. bound_ns: for two
    hosts of one solve and component, |error of clock_b - clock_a| <= bound_a + bound_b within the
    slot (>= 99 % of pairs on the lab under load and faults; docs/hostprobe.md)."""

    measurement: ClassVar[str] = "clock_solution"
    tag_keys: ClassVar[tuple[str, ...]] = ("host",)
    time_attr: ClassVar[str] = "window_start"

    host: Ident
    window_start: TimestampNs
    offset_ns: float
    drift_ppb: float
    bound_ns: float = Field(ge=0)
    component: int | None = Field(None, ge=0, le=INT64_MAX, description="connected component of the probe graph "
                                  "in this slot's solve: offsets of hosts in different components are not comparable")


class RankPlacement(Record):
    rank: int = Field(ge=0, le=INT64_MAX)
    host: Ident
    nic: Ident | None = None
    # filled by the NCCL plugin's data (correlator/jobs_nccl.py); a rank is a rank of one communicator
    comm_id: Ident | None = Field(None, description="the communicator this rank belongs to (16 hex digits)")
    peers: list[Int64] = Field(default_factory=list, max_length=4096, description="ranks it sent to / received from")
    qps: list[Int64] = Field(default_factory=list, max_length=4096, description="IB QP numbers (socket: fds) it used")
    net_devices: list[Int64] = Field(default_factory=list, max_length=64, description="NCCL's network device indexes")


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
    tags: dict[Annotated[str, Field(min_length=1, max_length=256)], str] = Field(default_factory=dict, max_length=64)
    fields: dict[Annotated[str, Field(min_length=1, max_length=256)], bool | Int64 | float | str] = Field(
        min_length=1, max_length=256)
    ts: TimestampNs

    def to_point(self) -> Point:
        return Point(self.measurement, dict(self.tags), dict(self.fields), self.ts)


# --- NCCL profiler plugin (nccl_plugin/, decoded by nccl_plugin/decode.py, sent by the host agent) -----
# Tags: the host, the job, the communicator (hex id) and the rank (decimal, a tag so that two ranks'
# events at the same nanosecond stay two points). Times are the plugin's CLOCK_REALTIME stamps.
# `event_id` / `parent_id` are unique within one process (`pid`): a proxy step's parent is its proxy
# op, a proxy op's parent the collective or p2p it moves data for.


class _NcclEvent(TelemetryRecord):
    tag_keys: ClassVar[tuple[str, ...]] = ("host", "job_id", "comm_id", "rank")
    time_attr: ClassVar[str] = "start_ns"

    host: Ident
    job_id: Ident | None = Field(None, description="from the launcher's environment at plugin init (SLURM_JOB_ID, "
                                                   "the variable NMS_JOB_ID_VAR names, ...); None when none was set")
    comm_id: Ident = Field(description="communicator id as 16 hex digits (0000000000000000: not known yet, "
                                       "profiler ABI v1-v3 before the first collective)")
    rank: Ident = Field(description="rank in the communicator, decimal")
    start_ns: TimestampNs
    stop_ns: TimestampNs = Field(description="the event's duration is stop_ns - start_ns")
    pid: int = Field(ge=0, le=2**32 - 1)
    event_id: Counter


class NcclComm(_NcclEvent):
    """A rank joined a communicator (plugin init, profiler ABI v4+): which process on which host is
    which rank of which communicator of which job."""

    measurement: ClassVar[str] = "nccl_comm"

    nranks: int = Field(ge=1, le=INT64_MAX)
    nnodes: int = Field(ge=0, le=INT64_MAX)
    comm_name: str | None = Field(None, max_length=64)
    abi_version: int = Field(ge=1, le=6, description="the ncclProfiler_vN NCCL loaded")


class NcclCollective(_NcclEvent):
    """One collective or point-to-point call as NCCL enqueued it: start = startEvent, stop = stopEvent
    (for NCCL, stop means enqueued, not completed: the proxy ops' stops say when the network was done)."""

    measurement: ClassVar[str] = "nccl_collective"

    kind: Literal["coll", "p2p"]
    op: str = Field(max_length=16, description="AllReduce, AllGather, Send, Recv, ...")
    count: Counter
    datatype: str = Field(max_length=16)
    bytes: Counter | None = Field(None, description="count x datatype size; None for a datatype the decoder "
                                                    "does not know")
    algo: str | None = Field(None, max_length=16)
    proto: str | None = Field(None, max_length=16)
    channels: int | None = Field(None, ge=0, le=255)
    warps: int | None = Field(None, ge=0, le=255)
    seq: Counter | None = Field(None, description="NCCL's per-communicator sequence number of this collective")
    root: Int64 | None = None
    peer: Int64 | None = Field(None, description="p2p: the remote rank")


class NcclProxyOp(_NcclEvent):
    """One network proxy operation: a channel's share of a collective/p2p towards one peer."""

    measurement: ClassVar[str] = "nccl_proxy_op"

    parent_id: Counter | None = Field(None, description="the collective's / p2p's event_id, when known")
    channel: int = Field(ge=0, le=255)
    peer: Int64
    is_send: bool
    n_steps: Int64
    chunk_size: Int64
    steps: int = Field(ge=0, le=INT64_MAX, description="proxy steps that stopped under this op")
    trans_bytes: Counter = Field(description="bytes its steps transferred")


class NcclProxyStep(_NcclEvent):
    """One network transfer step of a proxy op, with the connection it went over and when it entered
    each wait state (ns after its start; None: not seen)."""

    measurement: ClassVar[str] = "nccl_proxy_step"

    parent_id: Counter | None = Field(None, description="the proxy op's event_id, when known")
    step: Int64
    peer: Int64 | None = Field(None, description="the remote rank (from the proxy op)")
    channel: int | None = Field(None, ge=0, le=255)
    is_send: bool | None = None
    trans_size: Counter
    net: Literal["ib", "socket"] | None = Field(None, description="the network plugin that reported the transfer")
    connection: Int64 | None = Field(None, description="IB: the QP number; sockets: the file descriptor")
    net_device: Int64 | None = Field(None, description="IB: the network device index")
    net_events: int = Field(ge=0, le=INT64_MAX,
                            description="network requests (work requests / socket ops) in this step")
    net_bytes: Counter
    send_gpu_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_peer_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_flush_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_gpu_wait_ns: int | None = Field(None, ge=0, le=INT64_MAX)


class NcclStepStats(TelemetryRecord):
    """Proxy steps folded by the host agent (hostprobe/nccl_steps.py): one record per second (by the
    steps' stop) per (job, comm, rank, peer, channel, direction, connection). `*_p50_ns` / `*_p99_ns` /
    `*_max_ns` of a state: how long the steps stayed in it (from entering it to entering the next state
    or stopping), over the steps that entered it; None when none did. Tags are decimal strings like
    `rank`. `connection`: the QP number (IB) or fd (sockets) when NCCL reported one (an NCCL built with
    net profiling); stock builds report none and the QPs come from the host (hostprobe/rdma_qps.py)."""

    measurement: ClassVar[str] = "nccl_step_stats"
    tag_keys: ClassVar[tuple[str, ...]] = ("host", "job_id", "comm_id", "rank", "peer", "channel", "direction",
                                           "connection")
    time_attr: ClassVar[str] = "start_ns"

    host: Ident
    job_id: Ident | None = None
    comm_id: Ident
    rank: Ident
    peer: Ident | None = Field(None, pattern=r"^-?[0-9]+$", description="the remote rank, decimal")
    channel: Ident | None = Field(None, pattern=r"^[0-9]+$")
    direction: Literal["send", "recv"] | None = None
    connection: Ident | None = Field(None, pattern=r"^-?[0-9]+$", description="QP number / socket fd, decimal")
    start_ns: TimestampNs = Field(description="the second's start (the steps' stop times fall in it; a step that "
                                              "came after its second was sent is counted in the next open one)")
    stop_ns: TimestampNs = Field(description="the second's end")
    pid: int = Field(ge=0, le=2**32 - 1)
    net: Literal["ib", "socket"] | None = None
    net_device: Int64 | None = None
    steps: int = Field(ge=1, le=INT64_MAX)
    bytes: Counter = Field(description="sum of the steps' trans_size")
    net_bytes: Counter
    net_events: int = Field(ge=0, le=INT64_MAX)
    step_p50_ns: int = Field(ge=0, le=INT64_MAX, description="step duration (start -> stop) median")
    step_p99_ns: int = Field(ge=0, le=INT64_MAX)
    step_max_ns: int = Field(ge=0, le=INT64_MAX)
    send_gpu_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_gpu_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_gpu_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_peer_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_peer_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_peer_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    send_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_flush_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_flush_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_flush_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_gpu_wait_p50_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_gpu_wait_p99_ns: int | None = Field(None, ge=0, le=INT64_MAX)
    recv_gpu_wait_max_ns: int | None = Field(None, ge=0, le=INT64_MAX)

    @model_validator(mode="after")
    def _window(self) -> NcclStepStats:
        if self.stop_ns <= self.start_ns:
            raise ValueError("stop_ns is not after start_ns")
        return self


class NcclRdmaQp(TelemetryRecord):
    """One RDMA QP of a process the NCCL plugin reported, as the host's RDMA netlink shows it
    (`rdma -j resource show qp`, hostprobe/rdma_qps.py): not from NCCL, whose stock builds never name
    a QP. `ranks`: the communicator ranks that process holds ("comm_id:rank", comma-separated); which
    of them uses the QP follows from the peer's end (correlator/qp_join.py). `sport`: the RoCE v2 UDP
    source port by the kernel's rdma_get_udp_sport() with flow label 0 (what NCCL passes). The path
    fields use ProbePath's vocabulary, for the QP's own 5-tuple traced (dport 4791, no reverse trace:
    the peer's NIC consumes the probes)."""

    measurement: ClassVar[str] = "nccl_rdma_qp"
    tag_keys: ClassVar[tuple[str, ...]] = ("host", "job_id", "device", "lqpn")

    host: Ident
    job_id: Ident | None = None
    device: Ident = Field(description="the RDMA device, e.g. mlx5_0")
    lqpn: Ident = Field(pattern=r"^[0-9]+$", description="local QP number, decimal")
    ts: TimestampNs
    port: int | None = Field(None, ge=0, le=255)
    netdev: Ident | None = Field(None, description="the device port's network interface")
    src_addr: str | None = Field(None, max_length=64, description="the netdev's address (the agent's NIC config)")
    rqpn: int | None = Field(None, ge=0, le=2**24 - 1, description="remote QP number (connected QPs)")
    type: str = Field(max_length=16, description="RC, UC, UD, XRC_INI, ...")
    state: str = Field(max_length=16, description="RESET, INIT, RTR, RTS, SQD, SQE, ERR")
    pid: int = Field(ge=0, le=2**32 - 1)
    comm: str | None = Field(None, max_length=64, description="the process name")
    ranks: str = Field("", max_length=4096, description="comm_id:rank of the process's ranks, comma-separated")
    sport: int | None = Field(None, ge=0, le=65535, description="RoCE v2 UDP source port (flow label 0)")
    dst_addr: str | None = Field(None, max_length=64, description="the peer's address, when traced")
    path_id: Ident | None = Field(None, description="the traced path's id (hostprobe/trace.py's path_id)")
    fwd_hops: str | None = Field(None, max_length=1024, description="routers of the QP's 5-tuple, source side first")
    fwd_complete: bool | None = None


class QpRoute(Record):
    """One QP of a job joined with its peer's end (correlator/qp_join.py)."""

    host: Ident
    device: Ident
    lqpn: int = Field(ge=0, le=2**24 - 1)
    rqpn: int = Field(ge=0, le=2**24 - 1)
    peer_host: Ident
    peer_device: Ident
    comm_id: Ident | None = Field(None, description="None: the two processes share several communicators")
    rank: int | None = None
    peer_rank: int | None = None
    sport: int | None = None
    path_id: Ident | None = None


class NcclCollectivePerf(TelemetryRecord):
    """One collective of one communicator, assembled by the service from its ranks' records
    (correlator/jobs_nccl.py): duration is the slowest rank's (start -> its last proxy op's stop, else
    its enqueue stop); bandwidths as nccl-tests defines them (algbw = bytes / duration, busbw =
    algbw x the op's factor). `slow`: below the slowdown detector's baseline (correlator/slowdown.py)."""

    measurement: ClassVar[str] = "nccl_collective_perf"
    tag_keys: ClassVar[tuple[str, ...]] = ("job_id", "comm_id", "op", "size_bucket")
    time_attr: ClassVar[str] = "start_ns"

    job_id: Ident
    comm_id: Ident
    op: str = Field(max_length=16)
    size_bucket: str = Field(max_length=16, description="message size rounded down to a power of two, e.g. 1MiB")
    start_ns: TimestampNs
    seq: int = Field(ge=-1, le=INT64_MAX, description="NCCL's sequence number (-1: unknown)")
    bytes: int = Field(ge=0, le=INT64_MAX)
    nranks: int = Field(ge=1, le=INT64_MAX)
    ranks_seen: int = Field(ge=1, le=INT64_MAX)
    duration_ns: int = Field(ge=1, le=INT64_MAX)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    baseline_busbw_gbps: float | None = Field(None, ge=0)
    slow: bool = False


class JobSlowdown(Record):
    """A collective (job, communicator, op, size bucket) running below its own bus bandwidth
    baseline for K collectives in a row; cleared after K good ones."""

    job_id: Ident
    comm_id: Ident
    op: str
    size_bucket: str
    since_ns: int
    cleared_ns: int | None = None
    baseline_busbw_gbps: float
    busbw_gbps: float = Field(description="the median of the slow collectives")
    ratio: float = Field(description="busbw / baseline")
    slow_collectives: list[int] = Field(default_factory=list, description="seq numbers of the slow collectives "
                                                                         "(the latest up to 32)")
    host_pairs: list[str] = Field(default_factory=list, description="host>host pairs its ranks' QPs connect")
    qps: list[QpRoute] = Field(default_factory=list, max_length=10_000,
                               description="the communicator's QPs, each joined with its peer's end")


# Record kinds accepted by POST /ingest/<kind>.
INGEST_KINDS: dict[str, type[TelemetryRecord] | type[GenericPoint]] = {
    "port_samples": PortSample,
    "port_rates": PortRates,
    "queue_samples": QueueSample,
    "queue_rates": QueueRates,
    "host_nic_samples": HostNicSample,
    "probe_windows": ProbeWindow,
    "path_events": PathEvent,
    "probe_paths": ProbePath,
    "clock_edges": ClockEdge,
    "clock_solutions": ClockSolution,
    "points": GenericPoint,
    "nccl_comms": NcclComm,
    "nccl_collectives": NcclCollective,
    "nccl_proxy_ops": NcclProxyOp,
    "nccl_proxy_steps": NcclProxyStep,
    "nccl_step_stats": NcclStepStats,
    "nccl_rdma_qps": NcclRdmaQp,
}


# --- switch-side collectors: link state, LLDP, device facts, collector status ------------------


class LinkEvent(TelemetryRecord):
    """A port's oper status changed between two polls (or, by ifLastChange, changed and came back).

    `flaps_in_window` counts the port's down-transitions within the configured flap window;
    `flapping` is true while that count exceeds the flap threshold (default: more than 8 per hour)."""

    measurement: ClassVar[str] = "link_event"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port")

    device: Ident
    port: Ident
    ts: TimestampNs
    state: OperStatus
    previous: OperStatus | None = None
    transitions: int = Field(1, ge=1, description="status changes seen in this poll interval (2: down and back)")
    flaps_in_window: int = Field(0, ge=0)
    flapping: bool = False


class LldpNeighbor(TelemetryRecord):
    """One LLDP neighbour seen on a local port (LLDP-MIB lldpRemTable, or any other source)."""

    measurement: ClassVar[str] = "lldp_neighbor"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port")

    device: Ident
    port: Ident
    ts: TimestampNs
    remote_name: str | None = Field(None, max_length=255, description="lldpRemSysName")
    remote_port: str | None = Field(None, max_length=255, description="lldpRemPortId (an ifname with subtype 5/7)")
    remote_port_desc: str | None = Field(None, max_length=255)
    remote_chassis_id: str | None = Field(None, max_length=255, description="hex for MAC chassis ids")
    remote_description: str | None = Field(None, max_length=1024)


class DeviceFacts(TelemetryRecord):
    """Identity and uptime of a polled device."""

    measurement: ClassVar[str] = "device_facts"
    tag_keys: ClassVar[tuple[str, ...]] = ("device",)

    device: Ident
    ts: TimestampNs
    sys_name: str | None = Field(None, max_length=255)
    sys_descr: str | None = Field(None, max_length=1024)
    sys_object_id: str | None = Field(None, max_length=255)
    uptime_ticks: Counter | None = Field(None, description="sysUpTime, 1/100 s")
    interfaces: int | None = Field(None, ge=0)
    lldp_chassis_id: str | None = Field(None, max_length=255)


CollectorState = Literal["pending", "ok", "error", "backoff"]
CollectorErrorKind = Literal["timeout", "auth", "bad_response", "unreachable", "config", "internal"]
PROBLEMS_KEPT = 20  # of the latest poll's problems, DeviceStatus keeps this many (and their count)


def _clip(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda v: v[:limit] if isinstance(v, str) else v)


class PollProblem(Record):
    """Something a poll left out and why, the rest of the poll kept (PollResult.problems): a command
    that failed, a route that answered badly, values or items that did not parse. The text names
    the command, route or path, never a secret."""

    what: Annotated[str, _clip(300)] = Field(description="the command, request, path or item left out")
    reason: Annotated[str, _clip(1024)] = Field(description="why, and what the poll lost by it")
    kind: CollectorErrorKind = "bad_response"

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}"


class DeviceStatus(Record):
    """What one collector knows about one device: last outcome, timings, backoff (GET /devices)."""

    device: Ident
    collector: Ident
    address: str
    state: CollectorState = "pending"
    interval_s: float = Field(gt=0)
    deadline_s: float = Field(gt=0)
    polls: int = Field(0, ge=0)
    failures: int = Field(0, ge=0)
    consecutive_failures: int = Field(0, ge=0)
    last_poll_ns: int | None = None
    last_success_ns: int | None = None
    last_duration_s: float | None = None
    last_error_kind: CollectorErrorKind | None = None
    last_error: str | None = Field(None, max_length=1024)
    next_attempt_ns: int | None = None
    records: int = Field(0, ge=0, description="records produced by the last successful poll")
    problems: int = Field(0, ge=0, description="problems (things left out) reported by every poll so far")
    last_problem_count: int = Field(0, ge=0, description="problems the last successful poll reported")
    last_problems: list[PollProblem] = Field(
        default_factory=list, max_length=PROBLEMS_KEPT,
        description=f"the last successful poll's problems (the first {PROBLEMS_KEPT})")
    member: str | None = Field(None, max_length=128, description="in a cluster, the poll member that polls it "
                               "(None: this process, or not polled yet)")
    covers: list[Ident] = Field(default_factory=list, description="the other devices its last successful poll "
                                "reported (a fabric manager's switches), which count as reachable by its state")


# --- topology (built by nms.topology from LLDP and the configured inventory) -------------------

LinkCheck = Literal["ok", "missing", "unexpected", "miscabled", "unverified", "discovered"]
LinkState = Literal["up", "down", "degraded", "unknown"]


class TopologyNode(Record):
    name: Ident
    kind: Literal["switch", "host", "unknown"]
    role: str | None = None
    configured: bool = Field(description="listed in the configured inventory")
    reachable: bool | None = Field(None, description="its collector's last poll succeeded (switches)")


class TopologyLink(Record):
    """One cable, `a` and `b` as `device:port` (sorted so that a link has one spelling)."""

    a: str
    b: str
    check: LinkCheck = Field(description="ok: seen as configured; missing: configured, both ends polled, not "
                                         "seen; miscabled: an end sees another peer; unexpected: seen, not "
                                         "configured; unverified: configured, no polled end could confirm it; "
                                         "discovered: seen, and the inventory lists no cabling to compare")
    state: LinkState = "unknown"
    seen_by: list[str] = Field(default_factory=list, description="devices whose LLDP reported this link")
    expected: str | None = Field(None, description="miscabled: the configured peer of the end that moved")
    flapping: bool = False
    rate_port: str | None = Field(None, description="the polled end whose rates in_bps/out_bps are")
    in_bps: float | None = None
    out_bps: float | None = None


class FabricTopology(Record):
    nodes: list[TopologyNode]
    links: list[TopologyLink]
    generated_ns: int

    def problems(self) -> list[TopologyLink]:
        return [link for link in self.links if link.check in ("missing", "unexpected", "miscabled")]


class PathHop(Record):
    device: Ident
    ingress: str | None = Field(None, description="port the path enters by (None at the source host)")
    egress: str | None = Field(None, description="port the path leaves by (None at the destination host)")


class FabricPath(Record):
    """One of the equal-cost paths between two hosts."""

    hops: list[PathHop]

    @property
    def links(self) -> list[tuple[str, str]]:
        """Directed (egress end, ingress end) pairs as `device:port`."""
        return [(f"{a.device}:{a.egress}", f"{b.device}:{b.ingress}") for a, b in zip(self.hops, self.hops[1:])]

    @property
    def devices(self) -> list[str]:
        return [h.device for h in self.hops]


class InterfaceAddress(TelemetryRecord):
    """An IPv4 address a switch holds on a port (IP-MIB ipAddrTable): turns traceroute hops into
    devices and ports for the correlator."""

    measurement: ClassVar[str] = "interface_address"
    tag_keys: ClassVar[tuple[str, ...]] = ("device", "port", "address")

    device: Ident
    port: Ident
    ts: TimestampNs
    address: str = Field(max_length=64)
    prefix_len: int = Field(32, ge=0, le=128, description="32 (a host address) when the device gives no usable mask")


# --- the correlator's output: findings -> incidents -> notifications ------------------------------

FaultKind = Literal["link_down", "link_flapping", "corrupting_link", "congestion", "path_imbalance",
                    "nic_down", "device_down", "mtu_mismatch", "miscabling", "partial_blackhole",
                    # from the fabric audits (docs/audits.md, their escalation)
                    "speed_mismatch", "clock_unsynced", "config_drift", "probe_gap",
                    # a job's collectives slowed and no fabric element explains it (correlator/job_impact.py)
                    "job_slowdown"]
ElementKind = Literal["link", "nic", "device", "host", "host_pair", "role", "job"]
Severity = Literal["critical", "major", "minor", "warning"]


class Finding(Record):
    """What the correlator concluded in one window about one element. `element` names it:
    a link as its two ends `dev:port--dev:port` (sorted, as TopologyLink), a NIC as `host:nic`,
    a device by name. `direction` (links only) is the loaded / lossy direction as `dev:port->dev:port`
    when the evidence is one-way."""

    kind: FaultKind
    element: str = Field(min_length=1, max_length=512)
    element_kind: ElementKind
    ts: TimestampNs = Field(description="the window the finding was made in")
    confidence: float = Field(ge=0, le=1)
    severity: Severity
    summary: str = Field(max_length=1024)
    direction: str | None = Field(None, max_length=512)
    evidence: dict[str, Any] = Field(default_factory=dict, description="the numbers that decided it")
    paths: list[str] = Field(default_factory=list, max_length=10_000,
                             description="affected probe paths as src_host:src_nic>dst_host:dst_nic/path_id")
    jobs: list[str] = Field(default_factory=list, description="jobs whose hosts talk across the element")
    explains: list[str] = Field(default_factory=list, max_length=10_000,
                                description="dedup keys (element_kind:element) of the elements whose down or "
                                            "flapping state this fault explains: a dead switch's links and the NICs "
                                            "on them, a down NIC's access link")

    @property
    def dedup_key(self) -> str:
        """One incident per element at a time: a link that goes from down to flapping, or from
        congested to down, is one incident whose kind follows the evidence."""
        return f"{self.element_kind}:{self.element}"


IncidentState = Literal["open", "resolved"]


class Incident(Record):
    """A finding that persists: open -> (updated)* -> resolved after N clean windows."""

    id: int = Field(description="rises with every incident; never reused")
    dedup_key: str = Field(description="element_kind:element; one open incident per key (its kind may change)")
    kind: FaultKind
    element: str
    element_kind: ElementKind
    direction: str | None = None
    severity: Severity
    state: IncidentState = "open"
    summary: str
    confidence: float = Field(ge=0, le=1)
    evidence: dict[str, Any] = Field(default_factory=dict)
    paths: list[str] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)
    opened_ns: int
    updated_ns: int
    last_seen_ns: int = Field(description="the last window that still showed the fault")
    resolved_ns: int | None = None
    updates: int = Field(0, ge=0, description="times the finding changed while open")
    clean_windows: int = Field(0, ge=0, description="windows in a row without the finding")
    acknowledged_by: str | None = None
    acknowledged_ns: int | None = None
    parent_id: int | None = Field(None, description="a child: the incident whose fault explains this one (a switch's "
                                                    "death its links' link_down). A child sends no notifications of "
                                                    "its own and resolves with its parent (docs/correlator.md)")
    children: list[int] = Field(default_factory=list, description="a parent: ids of the incidents it explains")
    explains: list[str] = Field(default_factory=list, description="a parent: dedup keys of the elements its fault "
                                                                  "explains (children are opened only for those "
                                                                  "that showed a fault of their own)")
    adopted_ns: int | None = Field(None, description="a child that was opened on its own (and notified) before its "
                                                     "parent appeared: when the parent adopted it")


IncidentEventKind = Literal["opened", "updated", "resolved", "acknowledged"]


class IncidentEvent(Record):
    """One change of an incident: what the API streams and the notifiers deliver."""

    event: IncidentEventKind
    ts: TimestampNs
    incident: Incident
    absorbed: list[int] = Field(default_factory=list, description="ids of the open incidents this event's incident "
                                                                   "adopted as children in this event (each was "
                                                                   "notified as opened on its own before)")

    @property
    def notifies(self) -> bool:
        """Whether the event goes to the notification sinks: a child's events do not, except the
        resolve and ack of an adopted child (they close the page its own `opened` raised)."""
        inc = self.incident
        return inc.parent_id is None or (inc.adopted_ns is not None and self.event in ("resolved", "acknowledged"))


DeliveryState = Literal["pending", "delivered", "failed"]


class NotificationDelivery(Record):
    """One incident event on its way to one notification sink (docs/notifications.md)."""

    id: int = Field(description="rises with every delivery; never reused; webhook receivers see it as delivery_id")
    incident_id: int
    event: IncidentEventKind
    sink: str = Field(description="the sink's name in the config")
    sink_kind: str
    state: DeliveryState = Field("pending", description="pending -> delivered | failed (permanent answer or "
                                                        "max_attempts reached)")
    attempts: int = Field(0, ge=0)
    created_ns: int
    last_attempt_ns: int | None = None
    next_attempt_ns: int | None = Field(None, description="when a pending delivery is tried next")
    delivered_ns: int | None = None
    last_status: int | None = Field(None, description="HTTP status of the last attempt (None: no answer)")
    last_error: str | None = Field(None, max_length=512, description="why the last attempt did not deliver")


# --- acting on incidents (correlator/actions/; docs/actions.md) -----------------------------------------

ActionKind = Literal["host_reroute", "drain_link", "isolate_port"]
ActionState = Literal["proposed", "awaiting_approval", "approved", "applying", "applied", "failed", "rejected",
                      "rolling_back", "rolled_back", "expired"]


class Action(Record):
    """One change the controller makes (or proposes) to steer traffic off a bad element, with its
    audit trail: who asked and why, the state before and after, and when it was undone."""

    id: int = Field(description="rises with every action; never reused (0 before it is stored)")
    kind: ActionKind
    incident_id: int | None = Field(None, description="the incident it answers (None: a manual request)")
    element: str = Field(min_length=1, max_length=512, description="the element traffic is steered off")
    element_kind: ElementKind
    targets: list[str] = Field(description="hosts (host_reroute) or devices (drain_link, isolate_port)")
    params: dict[str, Any] = Field(default_factory=dict, description="what the actuator needs (avoid_hops, dsts, ...)")
    state: ActionState = "proposed"
    dry_run: bool = Field(False, description="recorded only: nothing is sent to agents or switches")
    reason: str = Field("", max_length=2048, description="why it was proposed (or refused)")
    requested_by: str = Field(description="'controller' (the policy) or the API token's name")
    approved_by: str | None = None
    created_ns: int
    updated_ns: int
    applied_ns: int | None = None
    expires_ns: int | None = Field(None, description="rolled back automatically at this time")
    reverted_ns: int | None = None
    before: dict[str, Any] = Field(default_factory=dict, description="the state the action changes, as read before")
    after: dict[str, Any] = Field(default_factory=dict, description="the state after applying (or after rollback)")
    result: str | None = Field(None, max_length=4096, description="the outcome in words (failures: the reasons)")


ActionEventKind = Literal["proposed", "approved", "rejected", "applied", "failed", "rolled_back", "expired"]


class ActionEvent(Record):
    """One step of an action's life: the audit log (nms.state keeps it, with a note of why)."""

    event: ActionEventKind
    ts: TimestampNs
    action: Action
    by: str = Field(description="'controller' or the API token's name")
