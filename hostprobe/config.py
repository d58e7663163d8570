"""The agent's YAML configuration (`nms-agent --config FILE`).

Loaded by the service's loader (nms.config.load_config with this model), so `${ENV}`,
`${ENV:-default}` and `${file:PATH}` work the same way and every error names its field and line,
never its value. Secrets (token, probe key) are SecretStr: they print as '**********'.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from nms.config.models import ByteSize, HttpUrl, Name, Seconds, Strict


class ServiceSettings(Strict):
    """`urls`: the service's API workers, used one at a time; the agent moves to the next on a
    connection error, a timeout or a 503 (hostprobe/client.py). `url`: one, the same as `urls: [url]`."""

    url: HttpUrl | None = None  # e.g. http://198.18.0.1:8080 (the service's management address)
    urls: list[HttpUrl] = Field(default_factory=list)
    token: SecretStr  # an API token with the `ingest` scope
    timeout: Seconds = 5.0
    verify_tls: bool = True
    ca_file: Path | None = None

    @field_validator("urls")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate URLs: {sorted({u for u in v if v.count(u) > 1})}")
        return v

    @model_validator(mode="after")
    def _one_list(self) -> ServiceSettings:
        if self.url is not None and self.urls:
            raise ValueError("give service.url or service.urls, not both")
        if self.url is None and not self.urls:
            raise ValueError("service.urls (or service.url) is required: the service's API URL(s)")
        if not self.urls:
            self.urls = [self.url]  # type: ignore[list-item]  # one URL is a one-element list
        return self


class NicSettings(Strict):
    name: Name  # interface name, e.g. eth0
    address: str | None = None  # IPv4 address to probe from (default: the interface's first one)

    @field_validator("address")
    @classmethod
    def _ipv4(cls, v: str | None) -> str | None:
        if v is not None and ipaddress.ip_address(v).version != 4:
            raise ValueError("only IPv4 probe addresses are supported")
        return v


class ProbeSettings(Strict):
    key: SecretStr  # fabric-wide probe key: packets without its MAC are dropped and counted
    port: int = Field(33434, ge=1, le=65535)  # UDP port every agent answers probes on
    # exchanges per second per (peer, path), sent as pairs. 20: a 1 % loss is proven within 5 s (p99) where
    # ~24 paths cross a link direction, as in a small fabric (docs/correlator.md, "Time to detect")
    rate: float = Field(20.0, gt=0, le=10_000)
    # a path with no reply for this long is down (PathEvent at once). 0.9 s, not 1 s: a link can die
    # just after a reply, so detection takes down_after plus a few ms, and the target is 1 s
    down_after: Seconds = 0.9
    # a probe unanswered this long is lost; windows close this long after their end. Fabric RTTs are
    # microseconds, milliseconds behind a full deep buffer: 0.25 s only delays the loss numbers
    timeout: Seconds = Field(0.25, gt=0, le=10)
    sports: int = Field(32, ge=1, le=1024)  # source ports per NIC, traced to every peer (ECMP coverage)
    sport_base: int = Field(0, ge=0, le=65535)  # first source port (0: ephemeral ports from the kernel)
    max_hops: int = Field(8, ge=1, le=32)  # traceroute depth
    trace_interval: Seconds = 120.0  # how often paths are re-traced
    trace_rate: float = Field(300.0, gt=0, le=10_000)  # traceroute packets per second (routers rate-limit ICMP)
    # a pair is impure when its send and receive spacings differ by more (software stamps in the lab:
    # 17 % of pairs pure at 10 us, 45 % at 20 us; see docs/hostprobe.md)
    purity_guard_us: float = Field(10.0, gt=0)
    transport: Literal["auto", "udp", "verbs"] = "auto"

    @field_validator("key")
    @classmethod
    def _key_strength(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value()) < 16:
            raise ValueError("probe key is too short (at least 16 characters)")
        return v


class ClockSyncSettings(Strict):
    enabled: bool = True
    window: Seconds = Field(2.0, ge=0.5, le=60)  # one ClockEdge per peer per window (aligned in our clock)
    max_exchanges: int = Field(4096, ge=16, le=1_000_000)  # per peer, waiting for their window to complete
    step_threshold_us: float = Field(50.0, gt=0)  # a realtime-vs-monotonic jump beyond this is a clock step


class PeerSettings(Strict):
    refresh: Seconds = 60.0  # how often the peer list is fetched again


class ReportSettings(Strict):
    interval: Seconds = 1.0  # batching interval (path events are sent at once)
    buffer_dir: Path = Path("/var/lib/nms-agent/buffer")  # reports kept here while the service is away
    buffer_max_bytes: ByteSize = 64 << 20
    stats_interval: Seconds = 10.0  # agent_stats points (drops, forged packets, queue sizes)


class CounterSettings(Strict):
    interval: Seconds = 5.0  # HostNicSample period (link changes are sent at once)
    ethtool: Literal["auto", "off"] = "auto"


class NcclSettings(Strict):
    """The NCCL profiler plugin's socket (hostprobe/nccl.py, docs/nccl_plugin.md). Jobs point the
    plugin at it with NMS_NCCL_SOCKET; the default matches the plugin's default for the default
    buffer_dir."""

    enabled: bool = True
    socket: Path | None = None  # default: <report.buffer_dir>/nccl.sock
    socket_mode: int = Field(0o666, ge=0, le=0o777)  # the jobs' users must be able to write to it
    # proxy steps are folded into one record per second per connection; debugging: this many raw a second too
    raw_steps_per_s: int = Field(0, ge=0, le=100_000)
    # the NCCL processes' RDMA QPs from `rdma -j resource show qp`, this often (null: never)
    qp_interval: Seconds | None = 10.0
    # each QP's 5-tuple traced again this often (hostprobe/qp_trace.py; null: never traced)
    qp_trace_every: Seconds | None = 300.0


class SteeringSettings(Strict):
    """host_reroute (hostprobe/steer.py, docs/steering.md): where the steering table is written and
    which source ports a `steer` command traces."""
    path: Path | None = None  # default: <report.buffer_dir>/steering.json
    port_base: int = Field(49152, ge=1024, le=65535)  # candidate source ports start here
    candidates: int = Field(16, ge=1, le=1024)  # source ports traced per destination
    ports_per_dst: int = Field(4, ge=1, le=1024)  # how many of those avoiding the element are kept
    # what one kept port's traffic adds to the utilization of the links on its path (`hop_loads`
    # units; 0.25 = a NIC at line rate over 4 ports): the movers' ports are poured onto the routes
    # in these (correlator.actions.steering.stripe); 0: the least loaded ports alone
    port_load: float = Field(0.25, ge=0, le=1)
    # a planned route (the service's `routes`) that no candidate takes: up to this many further
    # blocks of `candidates` ports (port_base + candidates ...) traced for its pair; 0: none
    route_search: int = Field(3, ge=0, le=64)
    # the port map: the candidates' paths to every peer traced ahead, in the background, so a steer
    # answers without tracing; re-traced after this long or when the prober's paths change; 0: off
    warm_every: float = Field(300.0, ge=0)
    warm_dport: int = Field(4791, ge=1, le=65535)  # the traffic the map is for (RoCE v2)

    @model_validator(mode="after")
    def _fits(self) -> SteeringSettings:
        if self.port_base + self.candidates * (1 + self.route_search) - 1 > 65535:
            raise ValueError("port_base + candidates x (1 + route_search) runs past port 65535")
        if self.ports_per_dst > self.candidates:
            raise ValueError("ports_per_dst is more than candidates")
        return self


class LabClock(Strict):
    """Emulated clock error for the fabric lab: t_host = t_real + offset + drift * (t_real - ref).

    Either fixed numbers, or `state_file` (the lab's state.json), re-read when it changes, whose
    `clocks[host]` entry the lab writes when a clock fault is injected."""

    offset_ns: int = 0
    drift_ppm: float = Field(0.0, ge=-1000, le=1000)
    ref_ns: int = 0
    state_file: Path | None = None
    host: str | None = None  # the entry in state_file (default: the agent's host name)

    @model_validator(mode="after")
    def _one_source(self) -> LabClock:
        if self.state_file is not None and (self.offset_ns or self.drift_ppm or self.ref_ns):
            raise ValueError("give either state_file or offset_ns/drift_ppm/ref_ns, not both")
        return self


class SigningSettings(Strict):
    """Verification of the service's signed commands (hostprobe/verify.py, docs/actions.md)."""

    public_key: str | None = None  # the service's Ed25519 public key (base64), pinned by configuration
    trust_on_first_use: bool = True  # no key configured or pinned yet: pin the one the service announces
    require: Literal["pinned", "always", "never"] = "pinned"  # pinned: unsigned commands refused once a key is
    max_skew: Seconds = 30.0  # clock difference to the service tolerated when checking expiry

    @field_validator("public_key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        if v is not None:
            from nms.signing import public_from_b64
            public_from_b64(v)
        return v


class AgentConfig(Strict):
    host: Name
    service: ServiceSettings
    nics: list[NicSettings] = Field(min_length=1)
    probe: ProbeSettings
    peers: PeerSettings = PeerSettings()
    report: ReportSettings = ReportSettings()
    counters: CounterSettings = CounterSettings()
    clock_sync: ClockSyncSettings = ClockSyncSettings()
    nccl: NcclSettings = NcclSettings()
    steering: SteeringSettings = SteeringSettings()
    lab_clock: LabClock | None = None
    signing: SigningSettings = SigningSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("nics")
    @classmethod
    def _unique(cls, v: list[NicSettings]) -> list[NicSettings]:
        names = [n.name for n in v]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate NIC names: {sorted({n for n in names if names.count(n) > 1})}")
        return v


def summary(cfg: AgentConfig) -> str:
    """One line for `nms-agent --check` and `nms config check` (no secret in it)."""
    nics = ", ".join(n.name + (f" {n.address}" if n.address else "") for n in cfg.nics)
    p = cfg.probe
    return (f"host {cfg.host!r}, service {', '.join(cfg.service.urls)}, {len(cfg.nics)} NIC(s) ({nics}), "
            f"probes on UDP {p.port} "
            f"at {p.rate:g}/s x {p.sports} source ports, transport {p.transport}, "
            f"clock sync {'on' if cfg.clock_sync.enabled else 'off'}")


def load(path: str | Path) -> AgentConfig:
    """Load and validate; raises nms.config.ConfigError listing every problem."""
    from nms.config import load_config

    return load_config(path, model=AgentConfig)
