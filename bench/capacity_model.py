"""The pure arithmetic of the capacity bench (bench/cluster_capacity.py) and docs/scale.md: records a
host sends per second, derived from the agent's own config defaults (hostprobe/config.py), and the
members of each role a fabric needs, given the CPU seconds per record measured by the bench.

Nothing here measures or starts anything: tests/test_cluster_capacity.py checks it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hostprobe.config import ClockSyncSettings, CounterSettings, ProbeSettings, ReportSettings

NICS_PER_HOST = 8  # GPUs and NICs per host in the sizing table
PORTS_PER_SWITCH = 64
HOST_PORTS_PER_LEAF = 32  # a 64-port leaf: 32 down, 32 up
POLL_INTERVAL_S = 10.0  # the sizing's SNMP poll period per switch
# CPU per interface per SNMP poll beyond those the bench's switches have: bench/snmp_poll.py, 1.52 s per
# poll of 1,000 interfaces (docs/benchmarks.md); the bench's own measure (a few ports) is mostly per switch
SNMP_S_PER_PORT = 1.52e-3
TARGET_LOAD = 0.5  # a member (one Python process: one core) is sized to half a core: failover, bursts


@dataclass(frozen=True)
class AgentVolume:
    """Records per host per second, by ingest kind, in steady state (no path changing state)."""

    probe_windows: float
    clock_edges: float
    probe_paths: float
    host_nic_samples: float
    points: float  # agent_stats

    @property
    def total(self) -> float:
        return self.probe_windows + self.clock_edges + self.probe_paths + self.host_nic_samples + self.points

    def messages(self, report_interval: float = 1.0) -> float:
        """Bus messages a second: the agent sends each kind's records of a report interval in one batch
        (one message: the host is the partition key), so a kind at under one record an interval sends
        each alone."""
        per = (self.probe_windows, self.clock_edges, self.probe_paths, self.host_nic_samples, self.points)
        return sum(min(rate, 1.0 / report_interval) for rate in per)


def agent_volume(nics: int, peers: int, paths: int) -> AgentVolume:
    """What one agent sends at the config's defaults: each local NIC probes the same-index NIC of each
    peer (hostprobe/prober.py `set_peers`) on each of `paths` paths; one ProbeWindow per path per 1 s
    window; two ClockEdges (the SVM estimate and the NTP-style baseline, hostprobe/clock_edges.py) per
    peer host per clock window; every path's ProbePath again at each retrace;
    one HostNicSample per NIC per counter interval; one agent_stats point per stats interval. Path events
    come only when a path changes state, and NCCL records only while a job runs (neither counted)."""
    probe, clock = ProbeSettings(key="x" * 16), ClockSyncSettings()
    windows = nics * peers * paths / 1.0  # prober.WINDOW_NS: 1 s windows
    return AgentVolume(probe_windows=windows,
                       clock_edges=2 * peers / clock.window if clock.enabled else 0.0,
                       probe_paths=windows / probe.trace_interval,
                       host_nic_samples=nics / CounterSettings().interval,
                       points=1.0 / ReportSettings().stats_interval)


@dataclass(frozen=True)
class Costs:
    """CPU seconds of one member process per record (per switch poll for `poll`), as measured, and the
    bytes one record takes on the bus and as line protocol."""

    api_s: float
    write_s: float
    correlate_s: float
    poll_s: float  # per switch poll of `poll_ports` interfaces
    poll_ports: int
    bus_bytes: float
    line_bytes: float
    disk_bytes: float  # InfluxDB's data directory growth per point (WAL + TSM as measured)


@dataclass(frozen=True)
class Sizing:
    gpus: int
    hosts: int
    switches: int
    records_s: float
    api: int
    write: int
    correlate: int
    poll: int
    bus_msgs_s: float
    bus_bytes_s: float
    points_s: float
    disk_gb_day: float


def members(cores: float) -> int:
    return max(1, math.ceil(cores / TARGET_LOAD))


def switches_for(nics: int) -> int:
    """Leaves for the NICs (32 host ports each) plus half as many spine/core switches."""
    leaves = math.ceil(nics / HOST_PORTS_PER_LEAF)
    return leaves + math.ceil(leaves / 2)


def poll_s(costs: Costs, ports: int = PORTS_PER_SWITCH) -> float:
    """CPU seconds of one poll of a switch with `ports` interfaces."""
    return costs.poll_s + max(0, ports - costs.poll_ports) * SNMP_S_PER_PORT


def size(gpus: int, volume: AgentVolume, costs: Costs) -> Sizing:
    hosts = math.ceil(gpus / NICS_PER_HOST)
    switches = switches_for(hosts * NICS_PER_HOST)
    rate = hosts * volume.total
    poll_cores = switches * poll_s(costs) / POLL_INTERVAL_S
    points = rate + switches * PORTS_PER_SWITCH * 2 / POLL_INTERVAL_S  # + a PortSample and PortRates per port
    return Sizing(gpus=gpus, hosts=hosts, switches=switches, records_s=rate,
                  api=members(rate * costs.api_s), write=members(rate * costs.write_s),
                  correlate=members(rate * costs.correlate_s), poll=members(poll_cores),
                  bus_msgs_s=hosts * volume.messages(), bus_bytes_s=rate * costs.bus_bytes,
                  points_s=points, disk_gb_day=points * costs.disk_bytes * 86_400 / 1e9)
