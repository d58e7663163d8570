"""Pydantic models of the YAML configuration (see docs/configuration.md).

Every model forbids unknown keys so that a typo names its field instead of being ignored.
Secrets are SecretStr: they print as '**********' in logs, errors and API output.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nms.config.collectors import CollectorSettings

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
               "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 10s, 500ms, 1h")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and (m := _DURATION_RE.match(value)):
        return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    raise ValueError("expected a duration such as 10s, 500ms, 1h")


def parse_size(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (m := _SIZE_RE.match(value)):
        return int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    raise ValueError("expected a size such as 1048576, 512MiB, 1GiB")


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
def _http_url(v: str) -> str:
    if not re.match(r"^https?://[^/\s]+", v):
        raise ValueError("must be an http:// or https:// URL")
    return v.rstrip("/")


HttpUrl = Annotated[str, AfterValidator(_http_url)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- store ---------------------------------------------------------------------------------


class EmbeddedStoreConfig(Strict):
    path: Path | None = None  # default: <data_dir>/telemetry.duckdb
    retention: Seconds = 7 * 86400.0


InfluxName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]
_HOUR, _DAY = 3600.0, 86400.0


class DownsampleTier(Strict):
    """One downsampled resolution: a retention policy filled by continuous queries."""

    retention_policy: InfluxName
    every: Seconds  # GROUP BY time(every)
    duration: Seconds  # how long the retention policy keeps it
    resample_for: Seconds | None = None  # window each run recomputes (late points); default 2 x every

    @model_validator(mode="after")
    def _check(self) -> DownsampleTier:
        for name in ("every", "duration", "resample_for"):
            value = getattr(self, name)
            if value is not None and value != int(value):
                raise ValueError(f"{name} must be a whole number of seconds")
        if self.duration < _HOUR:
            raise ValueError("duration must be at least 1h (InfluxDB's minimum retention)")
        if self.every >= self.duration:
            raise ValueError("every must be shorter than duration")
        if self.resample_for is not None and self.resample_for < self.every:
            raise ValueError("resample_for must be at least every")
        return self


class InfluxDownsamplingConfig(Strict):
    """Retention policies and continuous queries created at start (docs/configuration.md)."""

    enabled: bool = False
    raw_duration: Seconds | None = None  # set the raw retention policy's duration; None: leave it as it is
    tiers: list[DownsampleTier] = Field(default_factory=lambda: [
        DownsampleTier(retention_policy="nms_1m", every=60, duration=30 * _DAY),
        DownsampleTier(retention_policy="nms_1h", every=_HOUR, duration=365 * _DAY)])

    @model_validator(mode="after")
    def _check(self) -> InfluxDownsamplingConfig:
        if self.raw_duration is not None and (self.raw_duration < _HOUR or self.raw_duration != int(self.raw_duration)):
            raise ValueError("raw_duration must be a whole number of seconds, at least 1h")
        names = [t.retention_policy for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError("tiers: each needs its own retention_policy")
        for coarse, fine in zip(self.tiers[1:], self.tiers):
            if coarse.every <= fine.every or coarse.every % fine.every:
                raise ValueError(f"tiers: {coarse.retention_policy}.every must be a multiple of "
                                 f"{fine.retention_policy}.every (each tier is computed from the one before)")
        return self


class InfluxStoreConfig(Strict):
    url: HttpUrl = "http://127.0.0.1:8086"
    database: str = "nms"
    retention_policy: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None  # InfluxDB 2.x/3.x v1-compat token ("Authorization: Token ...")
    create_database: bool = True
    batch_size: int = Field(5000, ge=1, le=100_000)
    flush_interval: Seconds = 1.0
    timeout: Seconds = 5.0
    gzip: bool = True
    spool_dir: Path | None = None  # default: <data_dir>/spool
    spool_max_bytes: ByteSize = 1 << 30
    # Points InfluxDB refused for good (type conflict, beyond retention), kept in the spool directory.
    quarantine_max_bytes: ByteSize = 256 << 20
    verify_tls: bool = True
    downsampling: InfluxDownsamplingConfig = InfluxDownsamplingConfig()

    @model_validator(mode="after")
    def _one_auth(self) -> InfluxStoreConfig:
        if self.token is not None and (self.username or self.password):
            raise ValueError("give either token or username/password, not both")
        if self.password is not None and not self.username:
            raise ValueError("password needs a username")
        return self


class StoreConfig(Strict):
    backend: Literal["embedded", "influxdb"] = "embedded"
    embedded: EmbeddedStoreConfig = EmbeddedStoreConfig()
    influxdb: InfluxStoreConfig = InfluxStoreConfig()


# --- API ------------------------------------------------------------------------------------

Scope = Literal["read", "ingest", "act", "admin"]


class TokenConfig(Strict):
    """An API token: either its hash (`nms token create` prints one) or the token itself,
    normally from an environment variable (`token: ${NMS_AGENT_TOKEN}`).

    `host` binds the token to one host of `fabric.hosts`: a host probe agent's token should carry
    it. A bound token may use only `/agents/<its host>/...`, and ingest only records of its host
    (others are rejected per item)."""

    name: Name
    scopes: list[Scope] = Field(min_length=1)
    hash: str | None = None
    token: SecretStr | None = None
    host: Name | None = None

    @field_validator("hash")
    @classmethod
    def _hash_format(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
            raise ValueError("must look like sha256:<64 hex digits> (see `nms token create`)")
        return v

    @field_validator("token")
    @classmethod
    def _token_strength(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("token is too short (at least 16 characters)")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenConfig:
        if (self.hash is None) == (self.token is None):
            raise ValueError("give exactly one of hash or token")
        return self


def _config_relative(v: Path, info: ValidationInfo) -> Path:
    """A path relative to the config file's directory (the loader passes it as `base_dir`; a model made
    in code has none: relative to the working directory)."""
    base = (info.context or {}).get("base_dir")
    path = v.expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return path


def _readable_file(v: Path, info: ValidationInfo) -> Path:
    """A file the process must read (a CA bundle, a certificate, a key): relative to the config file's
    directory, and readable now, so a missing or unreadable file is a configuration error naming its
    field, never a failure at the first connection. The message names the file, never its content."""
    path = _config_relative(v, info)
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    return path


ReadableFile = Annotated[Path, AfterValidator(_readable_file)]


class TlsConfig(Strict):
    cert: Annotated[Path, AfterValidator(_config_relative)]  # relative to the config file
    key: Annotated[Path, AfterValidator(_config_relative)]


class ApiConfig(Strict):
    host: str = "127.0.0.1"
    # more addresses served on the same port, e.g. a management address that host agents in
    # other network namespaces reach (the lab's bridge gateway)
    listen: list[str] = []
    port: int = Field(8080, ge=0, le=65535)
    tls: TlsConfig | None = None
    max_body_bytes: ByteSize = 16 << 20
    max_items_per_batch: int = Field(50_000, ge=1)
    tokens: list[TokenConfig] = []
    session_ttl: Seconds = 8 * 3600.0  # a browser session of the live view (/ui) lasts this long

    @field_validator("host")
    @classmethod
    def _ip(cls, v: str) -> str:
        if v != "localhost":
            ipaddress.ip_address(v)  # raises ValueError naming the bad address
        return v

    @field_validator("listen")
    @classmethod
    def _ips(cls, v: list[str]) -> list[str]:
        for addr in v:
            if addr != "localhost":
                ipaddress.ip_address(addr)
        return v

    @field_validator("tokens")
    @classmethod
    def _unique_names(cls, v: list[TokenConfig]) -> list[TokenConfig]:
        names = [t.name for t in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate token names: {sorted(dup)}")
        return v


# --- scheduler and thresholds -----------------------------------------------------------------


class SchedulerConfig(Strict):
    misfire_grace: Seconds = 5.0
    retention_interval: Seconds = 3600.0  # how often the embedded store prunes old data


class PollingConfig(Strict):
    """How the service runs its switch collectors (per-device settings live in fabric.switches)."""

    enabled: bool = True
    max_concurrency: int = Field(64, ge=1, le=10_000)  # devices polled at once, per collector
    backoff_max: Seconds = 300.0  # a failing device is retried after interval x 2^n, at most this
    recent_window: Seconds = 900.0  # how much recent data the service keeps in memory for the API
    max_utilization: float = Field(1.5, gt=1, le=10)  # rates above speed x this are impossible: dropped
    # counters all unchanged since the last poll: not refreshed yet (device caches) for this long
    unchanged_hold: Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=3600)] = 5.0
    mib_dirs: list[Path] = []  # MIB sources for extra SNMP objects named MIB::object (besides ./mibs)


class Thresholds(Strict):
    flap_count: int = Field(8, ge=1)
    flap_window: Seconds = 3600.0
    loss_pct: float = Field(1.0, ge=0, le=100)
    congestion_utilization: float = Field(0.9, gt=0, le=1)
    owd_inflation_us: float = Field(50.0, gt=0)
    resolve_after_clean_windows: int = Field(10, ge=1)


class CorrelatorConfig(Strict):
    """The correlator (correlator/): one step per `interval` over the last `context` of telemetry."""

    enabled: bool = True
    interval: Seconds = 1.0  # the window; steps follow agents' windows, or run this often without them
    context: Seconds = 10.0  # sliding context joined at every step
    baseline: Seconds = 600.0  # one-way delay baselines (per path minimum) look back this far
    # loss is tested against each link's own baseline, learned within [loss_baseline_pct, loss_floor_pct]:
    # a link losing more than the floor is faulty whatever its history (correlator/sequential.py)
    loss_floor_pct: float = Field(0.1, gt=0, le=100)
    loss_baseline_pct: float = Field(0.01, gt=0, le=100)
    loss_horizon: Seconds = Field(300.0, ge=30, le=3600)  # the longest window loss evidence is pooled over
    # focused probing: the paths crossing a link that loses more than its baseline (p < 1e-4, not yet
    # an incident) are probed at `focus_rate` exchanges/s per path for `focus_s` (an agent command), so
    # a faint loss is proven, or cleared, on more evidence sooner; 0 turns it off
    focus_rate: float = Field(40.0, ge=0, le=1000)
    focus_s: Seconds = Field(20.0, gt=0, le=300)
    imbalance_ratio: float = Field(2.0, gt=1)  # parallel uplinks: hot / cold utilization that counts
    imbalance_min_utilization: float = Field(0.5, gt=0, le=1)  # ... and the hot one carries at least this
    # resolved incidents (with their events) older than this are deleted, checked every
    # scheduler.retention_interval; 0 keeps them forever
    incident_retention: Annotated[float, BeforeValidator(parse_duration), Field(ge=0)] = 365 * 86400.0


BUILTIN_NOTIFIERS = ("webhook", "pagerduty", "slack", "alertmanager", "servicenow")


class NotificationSink(Strict):
    """One destination of incident events. `kind` picks the payload: a notifier of the
    `nms.notifiers` entry-point group, built in or a third party's."""

    name: Name
    kind: Name
    url: HttpUrl = Field(repr=False)  # may carry a credential (Slack's path, a query token): not in repr
    secret: SecretStr | None = None  # webhook: HMAC-SHA256 key; pagerduty: routing key; servicenow: password
    username: str | None = None  # servicenow basic auth
    min_severity: Literal["critical", "major", "minor", "warning"] = "warning"
    kinds: list[str] = []  # only these fault kinds (all when empty)
    timeout: Seconds = 5.0
    verify_tls: bool = True
    options: dict[str, str | int | float | bool] = {}  # a third-party notifier's own settings

    @field_validator("kind")
    @classmethod
    def _installed(cls, v: str) -> str:
        installed = {ep.name for ep in entry_points(group="nms.notifiers")} | set(BUILTIN_NOTIFIERS)
        if v not in installed:
            raise ValueError(f"no notifier of kind {v!r} is installed (installed: {', '.join(sorted(installed))})")
        return v

    @model_validator(mode="after")
    def _needs(self) -> NotificationSink:
        if self.options and self.kind in BUILTIN_NOTIFIERS:
            raise ValueError(f"sink {self.name!r}: options are for third-party notifiers; {self.kind} takes none")
        if self.kind == "pagerduty" and self.secret is None:
            raise ValueError(f"sink {self.name!r}: pagerduty needs secret (the Events v2 routing key)")
        if self.kind == "servicenow" and (self.username is None) != (self.secret is None):
            raise ValueError(f"sink {self.name!r}: servicenow needs both username and secret, or neither")
        return self


class NotificationsConfig(Strict):
    sinks: list[NotificationSink] = []
    max_attempts: int = Field(8, ge=1, le=100)  # then the delivery is marked failed
    backoff_initial: Seconds = 1.0
    backoff_max: Seconds = 300.0
    max_retry_after: Seconds = 3600.0  # a Retry-After longer than this is capped
    # this NMS's URL as receivers should link to it (Alertmanager externalURL/generatorURL, PagerDuty client_url)
    external_url: HttpUrl | None = None

    @field_validator("sinks")
    @classmethod
    def _unique(cls, sinks: list[NotificationSink]) -> list[NotificationSink]:
        names = [s.name for s in sinks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate sink names: {dup}")
        return sinks


class AgentsConfig(Strict):
    """How the service steers host probe agents (hostprobe/; the agents' own settings are in their
    config files)."""

    peers_random: int = Field(12, ge=0, le=256)  # K: random peers besides the hosts under the same leaf
    seed: str = "fabric"  # peer choice is a pure function of (inventory, seed): stable across restarts
    command_wait_max: Seconds = 30.0  # longest long-poll an agent may hold for commands
    command_ttl: Seconds = 300.0  # a command no agent has received by then expires


class ClockConfig(Strict):
    """Service-side clock sync: the network-effect solve over the agents' ClockEdges
    (docs/hostprobe.md, "Clock sync: the service side")."""

    enabled: bool = True
    window_s: Seconds = 2.0  # the agents' clock window: one solve per window of fabric time
    solve_lag: Seconds = 4.0  # a slot is solved this long after its end (its edges have arrived)
    max_age: Seconds = 60.0  # a solution further than this from a probe window is not applied to it
    method: Literal["svm", "ntp"] = "svm"  # which edges are solved (ntp: the min-RTT baseline)


def _yaml_off(v: object) -> object:
    return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false


ActionPolicy = Annotated[Literal["auto", "approval", "off"], BeforeValidator(_yaml_off)]
ActionKindName = Literal["host_reroute", "drain_link", "isolate_port"]
ACTION_KINDS: tuple[ActionKindName, ...] = ("host_reroute", "drain_link", "isolate_port")


class ActionScope(Strict):
    """A policy for the elements it matches (every key given must match; the first scope wins).
    `devices`: glob patterns on the element's devices (a link's two ends); `roles`: roles of those
    devices (fabric.switches[].role, "host" for hosts); `prefix`: the start of the element's name
    (a pod's naming prefix)."""

    policy: ActionPolicy
    devices: list[str] = []
    roles: list[str] = []
    prefix: str | None = None

    @model_validator(mode="after")
    def _something(self) -> ActionScope:
        if not (self.devices or self.roles or self.prefix):
            raise ValueError("a scope needs devices, roles or prefix (the kind's policy covers everything)")
        return self


class ActionKindPolicy(Strict):
    policy: ActionPolicy = "approval"
    scopes: list[ActionScope] = []


class ActionLimits(Strict):
    """Blast radius (correlator.actions.steering.Limits): a flow group (host pair) keeps `min_paths` of its
    ECMP paths and loses at most `max_drain_fraction` of them to everything avoided at once."""

    max_drain_fraction: float = Field(0.5, gt=0, le=1)
    min_paths: int = Field(1, ge=1)


class ActionRate(Strict):
    per_kind: int = Field(5, ge=1)  # automatic actions of one kind per `window`; beyond, they wait for approval
    window: Seconds = 600.0
    max_concurrent: int = Field(10, ge=1)  # actions applied (or being applied) at once, all kinds


class ActionsConfig(Strict):
    """Acting on incidents (docs/actions.md): the planner proposes, the policy decides."""

    enabled: bool = False
    dry_run: bool = False  # record every proposal, send nothing to agents or switches
    policies: dict[ActionKindName, ActionKindPolicy] = Field(
        default_factory=lambda: {k: ActionKindPolicy() for k in ACTION_KINDS})
    limits: ActionLimits = ActionLimits()
    rate: ActionRate = ActionRate()
    expiry: Seconds = 3600.0  # an applied action is rolled back this long after it was applied
    approval_ttl: Seconds = 900.0  # a proposal nobody approved by then expires
    hold: Seconds = 300.0  # rolled back once its incident has stayed resolved this long
    worse_windows: int = Field(10, ge=1)  # correlator windows after applying in which "worse" rolls back
    # the first windows after applying judge nothing: a fresh fault's loss still climbs over the
    # correlator's loss window then, and the baseline follows it up
    worse_grace: int = Field(3, ge=0)
    worse_factor: float = Field(1.5, gt=1)  # the incident's loss % or delay inflation rising this much is worse
    dport: int = Field(4791, ge=1, le=65535)  # the traffic host_reroute steers (RoCE v2)
    # host_reroute sends the moved-to links' utilization (`hop_loads`), and the agents place their
    # ports by load; false: only `avoid_hops` (avoid-only steering: the first ports that avoid)
    load_aware: bool = True
    # with load_aware: the service places every mover's subflows at once on the paths that avoid the
    # element and sends each agent its `routes` (docs/steering.md "Planned routes"); false: the agents
    # place theirs alone (one stripe per switch)
    plan_routes: bool = True
    # as the agents' steering.ports_per_dst and steering.port_load: the subflows each mover sends to
    # a destination, and what one adds to a link's utilization (the planned routes' units)
    ports_per_dst: int = Field(4, ge=1, le=1024)
    port_load: float = Field(0.25, gt=0, le=1)

    @field_validator("policies")
    @classmethod
    def _every_kind(cls, v: dict[ActionKindName, ActionKindPolicy]) -> dict[ActionKindName, ActionKindPolicy]:
        return {k: v.get(k, ActionKindPolicy()) for k in ACTION_KINDS}


# --- fabric inventory ------------------------------------------------------------------------


class SwitchConfig(Strict):
    name: Name
    mgmt_address: str
    role: Literal["spine", "leaf", "superspine", "other"] = "other"
    # collector name -> its settings, each validated by that collector's own model (nms/config/collectors.py)
    collectors: CollectorSettings = Field(default_factory=CollectorSettings)

    @field_validator("mgmt_address")
    @classmethod
    def _addr(cls, v: str) -> str:
        ipaddress.ip_address(v)
        return v


class NicConfig(Strict):
    name: Name
    address: str
    switch: Name | None = None
    switch_port: str | None = None

    @field_validator("address")
    @classmethod
    def _addr(cls, v: str) -> str:
        ipaddress.ip_address(v)
        return v


class HostConfig(Strict):
    name: Name
    nics: list[NicConfig] = Field(min_length=1)


class LinkConfig(Strict):
    """Expected cabling, `device:port` on each end."""

    a: str = Field(pattern=r"^[^:\s]+:\S+$")
    b: str = Field(pattern=r"^[^:\s]+:\S+$")


class FabricConfig(Strict):
    switches: list[SwitchConfig] = []
    hosts: list[HostConfig] = []
    links: list[LinkConfig] = []

    @model_validator(mode="after")
    def _consistent(self) -> FabricConfig:
        names = [s.name for s in self.switches] + [h.name for h in self.hosts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate device names: {dup}")
        known = set(names)
        for link in self.links:
            for end in (link.a, link.b):
                if end.split(":", 1)[0] not in known:
                    raise ValueError(f"link end {end!r} names an unknown device")
        switches = {s.name for s in self.switches}
        for host in self.hosts:
            for nic in host.nics:
                if nic.switch is not None and nic.switch not in switches:
                    raise ValueError(f"host {host.name} nic {nic.name}: unknown switch {nic.switch!r}")
        return self


# --- fabric audits (docs/audits.md) ---------------------------------------------------------

AUDIT_NAMES = ("cabling", "mtu", "speed", "errors", "ecmp_balance", "clock", "config_drift", "probe_coverage")
IncidentLevel = Literal["critical", "major", "minor", "warning", "never"]


def _crontab(v: str | None) -> str | None:
    if v is not None:
        from apscheduler.triggers.cron import CronTrigger  # the service schedules it; checked here
        try:
            CronTrigger.from_crontab(v, timezone="UTC")
        except ValueError as e:
            raise ValueError(f"expected a crontab 'minute hour day month weekday': {e}") from None
    return v


class AuditSettings(Strict):
    """One audit: on or off, when it runs (default: audits.interval), which findings open incidents."""

    enabled: bool = True
    interval: Seconds | None = None  # run this often (default: audits.interval)
    cron: Annotated[str | None, AfterValidator(_crontab)] = None  # crontab in UTC; replaces interval
    open_incidents: IncidentLevel | None = None  # findings at least this severe open incidents (default: audits')


class CablingAudit(AuditSettings):
    pass


class MtuAudit(AuditSettings):
    expected_mtu: int | None = Field(None, ge=68, le=1 << 20)  # every fabric port; default: the common MTU


class SpeedAudit(AuditSettings):
    pass


class ErrorsAudit(AuditSettings):
    ber_threshold: float = Field(1e-12, gt=0, lt=1)  # errored frames per line-rate bit above this: noisy


class EcmpBalanceAudit(AuditSettings):
    skew_threshold: float = Field(2.0, gt=1)  # busiest / mean utilization of parallel uplinks
    min_utilization: float = Field(0.1, gt=0, le=1)  # groups whose busiest uplink is below this are not judged


class ClockAudit(AuditSettings):
    # a solution's error bound above this is poor sync; honest bounds on software stamps are a few us,
    # ~10 us in an agent's first 30 s (docs/hostprobe.md)
    max_bound_us: float = Field(25.0, gt=0)
    max_offset_us: float = Field(1000.0, gt=0)  # host clock this far from fabric time: its discipline is off
    max_drift_ppm: float = Field(100.0, gt=0)
    max_age: Seconds = 60.0  # a host's newest solution older than this: sync stopped


class ConfigDriftAudit(AuditSettings):
    ignore: list[str] = []  # regular expressions of configuration lines never compared

    @field_validator("ignore")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"invalid regular expression {pattern!r}: {e}") from None
        return v


class ProbeCoverageAudit(AuditSettings):
    max_age: Seconds = 300.0  # a pair or path counts as probed when a window this recent exists


class AuditsConfig(Strict):
    enabled: bool = True
    interval: Seconds = 3600.0  # default schedule of every audit
    start_delay: Seconds = 120.0  # first scheduled runs this long after start (polls and LLDP settle)
    open_incidents: IncidentLevel = "major"  # default per audit: findings this severe open incidents
    history: int = Field(1000, ge=1)  # reports kept
    cabling: CablingAudit = CablingAudit()
    mtu: MtuAudit = MtuAudit()
    speed: SpeedAudit = SpeedAudit()
    errors: ErrorsAudit = ErrorsAudit()
    ecmp_balance: EcmpBalanceAudit = EcmpBalanceAudit()
    clock: ClockAudit = ClockAudit()
    config_drift: ConfigDriftAudit = ConfigDriftAudit()
    probe_coverage: ProbeCoverageAudit = ProbeCoverageAudit()

    def settings(self, name: str) -> AuditSettings:
        settings: AuditSettings = getattr(self, name)  # name: one of the audits above
        return settings


# --- cluster (docs/cluster.md) ---------------------------------------------------------------

NatsUrl = Annotated[str, Field(pattern=r"^(nats|tls)://[^/\s]+$")]
SubjectToken = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_-]+$")]


class BusTlsConfig(Strict):
    """TLS to the NATS servers (`cluster.bus.tls`; the servers' URLs are then `tls://`): the servers'
    certificates are verified against `ca_file` (default: the system's CAs), and their name (the URL's
    host, or `server_name`) must be in them; `cert_file` + `key_file` present a client certificate
    (the servers' `verify: true`, mutual TLS). `verify_tls: false` accepts any server certificate
    (a lab's self-signed one; a warning in the log whenever the member connects)."""

    ca_file: ReadableFile | None = None  # PEM bundle of the CA(s) the servers' certificates chain to
    cert_file: ReadableFile | None = None  # client certificate (PEM), for servers with `verify: true`
    key_file: ReadableFile | None = None  # its private key (PEM, unencrypted; keep it 0600)
    # the name in the servers' certificates, where not the URL's host (servers named by address)
    server_name: str | None = Field(None, min_length=1)
    verify_tls: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> BusTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            missing = "key_file" if self.key_file is None else "cert_file"
            raise ValueError(f"{missing}: a client certificate needs both cert_file and key_file, or neither")
        if not self.verify_tls and (self.ca_file is not None or self.server_name is not None):
            raise ValueError("verify_tls: false checks no certificate: ca_file and server_name are for "
                             "verify_tls: true")
        self.ssl_context()  # a file that is no PEM certificate or key, or a key not of the certificate
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """The client's context: TLS 1.2 or later, the server's certificate and name verified (unless
        verify_tls is false), the client certificate loaded. Errors name the field and the file, never
        the content (OpenSSL's reason, e.g. KEY_VALUES_MISMATCH)."""
        if self.verify_tls:
            try:
                context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                                     cafile=str(self.ca_file) if self.ca_file else None)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"ca_file: {str(self.ca_file)!r} holds no usable CA certificate (PEM): "
                                 f"{_ssl_reason(e)}") from None
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            def no_passphrase() -> str:  # never OpenSSL's prompt on the terminal
                raise ValueError("encrypted")
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file), password=no_passphrase)
            except ValueError:
                raise ValueError(f"key_file: {str(self.key_file)!r} is encrypted: give an unencrypted key "
                                 "(readable by the service only)") from None
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"cert_file/key_file: {str(self.cert_file)!r} and {str(self.key_file)!r} are not "
                                 f"a PEM certificate and its private key: {_ssl_reason(e)}") from None
        return context


def _ssl_reason(e: Exception) -> str:
    return str(getattr(e, "reason", None) or getattr(e, "strerror", None) or type(e).__name__)


class BusConfig(Strict):
    """The telemetry bus the roles share (NATS JetStream; the backend is an `nms.buses` entry point)."""

    backend: Literal["nats"] = "nats"
    servers: list[NatsUrl] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1)
    token: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    # first token of every subject and of the stream names: several sites can share one NATS
    prefix: SubjectToken = "nms"
    replicas: int = Field(1, ge=1, le=5)  # JetStream stream replicas (3 in a 3-node cluster)
    retention: Seconds = 24 * 3600.0  # how long a stream keeps records (also after they are written)
    max_bytes: ByteSize | None = None  # per stream; None: bounded by retention only
    duplicate_window: Seconds = 120.0  # a batch published twice within it is stored once
    connect_timeout: Seconds = 5.0
    publish_timeout: Seconds = 5.0  # an ingest answers 503 when JetStream did not acknowledge within it
    # TLS (the servers' URLs tls://); a tls:// URL without it verifies against the system's CAs
    tls: BusTlsConfig | None = None

    @model_validator(mode="after")
    def _one_auth(self) -> BusConfig:
        if self.token is not None and (self.username or self.password):
            raise ValueError("give either token or username/password, not both")
        if self.password is not None and not self.username:
            raise ValueError("password needs a username")
        return self

    @model_validator(mode="after")
    def _tls_urls(self) -> BusConfig:
        schemes = {url.split("://", 1)[0] for url in self.servers}
        if len(schemes) > 1:
            raise ValueError("servers: give every URL tls:// (TLS) or every one nats://, not both")
        if self.tls is not None and schemes != {"tls"}:
            raise ValueError("servers: with tls, the servers' URLs are tls://")
        return self

    @property
    def use_tls(self) -> bool:
        """TLS is wanted (every URL tls://): a server that does not offer it is refused."""
        return all(url.startswith("tls://") for url in self.servers)


class WriterConfig(Strict):
    """The `write` role: telemetry streams -> the store, in batches, acknowledged once stored."""

    batch_messages: int = Field(64, ge=1, le=10_000)  # bus messages fetched (and stored) at once
    fetch_timeout: Seconds = 1.0
    ack_wait: Seconds = 30.0  # a batch not acknowledged within it is delivered again (to any writer)
    flush_timeout: Seconds = 30.0  # longest wait for the store to take a batch before it is redelivered


class PollShardConfig(Strict):
    """The `poll` members' share of the switches (rendezvous hashing over the live members)."""

    # a member renews its entry in the bus twice a heartbeat; the entry expires 1.25 heartbeats after
    # the last renewal, and members check the live set every eighth of a heartbeat: a dead member's
    # switches are taken within 1.375 heartbeats
    heartbeat: Seconds = Field(2.0, ge=0.2, le=60.0)
    # this member's name in the bus (unique per process); default: <hostname>-<pid>
    member: SubjectToken | None = None


class CorrelateFeedConfig(Strict):
    """A `correlate` member without `api` takes the telemetry from the bus (nms/app/correlate_feed.py)."""

    # each member's durable consumer is `<group>-<member>` (every member reads every message and hands
    # its correlator those of its partitions); a restarted member re-reads `replay` of the streams
    group: SubjectToken = "correlate"
    # how the fabric is split into partitions that the live members own (nms/app/correlate_partitions.py):
    # the whole fabric (one member correlates, the others stand by), one per leaf plus `core`, or one
    # per pod of a 3-tier fabric plus `core` (the superspines)
    partitions: Literal["fabric", "leaf", "pod"] = "fabric"
    member: SubjectToken | None = None  # this member's name in the bus; default: <hostname>-<pid>
    # membership in `<prefix>_members_correlate`, as for poll members: a dead member's partitions are
    # taken within 1.375 heartbeats
    heartbeat: Seconds = Field(2.0, ge=0.2, le=60.0)
    # a member that takes partitions (or starts) re-reads this much of the streams for them, to rebuild
    # the correlator's context (at least correlator.context is re-read, whatever this says); the
    # default covers the agents' path traces (probe.trace_interval, 120 s)
    replay: Seconds = Field(150.0, le=86_400)
    batch_messages: int = Field(256, ge=1, le=10_000)
    fetch_timeout: Seconds = 0.5
    ack_wait: Seconds = 10.0  # taken and not acknowledged within it (a stall): delivered again


class StateConfig(Strict):
    """Where incidents, actions, jobs and agent commands are kept (nms.state): SQLite in data_dir (one
    process: the default), or PostgreSQL, shared by a cluster's processes."""

    backend: Literal["sqlite", "postgresql"] = "sqlite"
    # libpq connection string, a URI (postgresql://nms@db1:5432/nms) or key=value pairs; may hold the
    # password, so a secret: normally `dsn: ${NMS_STATE_DSN}` (or a password file: passfile=...)
    dsn: SecretStr | None = None
    connect_timeout: Seconds = 10.0

    @field_validator("dsn")
    @classmethod
    def _dsn_parses(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            from psycopg import ProgrammingError
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(v.get_secret_value())
            except ProgrammingError:  # its message may quote the value (a password): not repeated
                raise ValueError("not a PostgreSQL connection string: give a URI postgresql://user@host:port/dbname "
                                 "or key=value pairs (host=... dbname=...)") from None
        return v

    @model_validator(mode="after")
    def _dsn_for_postgresql(self) -> StateConfig:
        if self.backend == "postgresql" and self.dsn is None:
            raise ValueError("dsn: backend postgresql needs dsn (e.g. dsn: ${NMS_STATE_DSN})")
        if self.backend == "sqlite" and self.dsn is not None:
            raise ValueError("dsn: only for backend postgresql (SQLite is <data_dir>/state.sqlite)")
        return self


class ClusterConfig(Strict):
    bus: BusConfig | None = None  # None: one process, no bus (the default)
    write: WriterConfig = WriterConfig()
    poll: PollShardConfig = PollShardConfig()
    correlate: CorrelateFeedConfig = CorrelateFeedConfig()


class NmsConfig(Strict):
    site: Name = "default"
    data_dir: Path = Path("./data")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    store: StoreConfig = StoreConfig()
    api: ApiConfig = ApiConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    polling: PollingConfig = PollingConfig()
    thresholds: Thresholds = Thresholds()
    agents: AgentsConfig = AgentsConfig()
    clock: ClockConfig = ClockConfig()
    correlator: CorrelatorConfig = CorrelatorConfig()
    notifications: NotificationsConfig = NotificationsConfig()
    audits: AuditsConfig = AuditsConfig()
    actions: ActionsConfig = ActionsConfig()
    fabric: FabricConfig = FabricConfig()
    cluster: ClusterConfig = ClusterConfig()
    state: StateConfig = StateConfig()

    @model_validator(mode="after")
    def _cluster_store(self) -> NmsConfig:
        if self.cluster.bus is not None and self.store.backend == "embedded":
            raise ValueError("store.backend: the embedded DuckDB store is single-node; a cluster (cluster.bus) "
                             "needs a shared store: store.backend: influxdb")
        return self

    @model_validator(mode="after")
    def _token_hosts(self) -> NmsConfig:
        hosts = {h.name for h in self.fabric.hosts}
        for t in self.api.tokens:
            if t.host is not None and t.host not in hosts:
                raise ValueError(f"api.tokens: token {t.name!r} is bound to host {t.host!r}, "
                                 "which is not in fabric.hosts")
        return self
