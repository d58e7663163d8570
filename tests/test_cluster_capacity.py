"""The pure parts of the cluster capacity bench (bench/capacity_model.py, bench/capacity_shards.py):
records per host per second derived from the agent's config defaults, the sizing arithmetic of
docs/scale.md, and the 4-way leaf shard. The measuring parts (real processes) are the benches
themselves: bench/cluster_capacity.py --quick, bench/agent_volume.py --quick."""

from __future__ import annotations

import pytest
from _fabric_synth import Synth

from bench.capacity_model import SNMP_S_PER_PORT, Costs, agent_volume, members, poll_s, size, switches_for
from bench.capacity_shards import SHARDS, shard_hosts
from hostprobe.config import ClockSyncSettings, ProbeSettings


def test_the_volume_follows_the_agents_defaults():
    v = agent_volume(nics=1, peers=16, paths=1)
    # 1 s windows, two clock edges (SVM, NTP-style) per peer per 2 s, every path again per 120 s retrace,
    # a NIC sample per 5 s, agent_stats per 10 s
    assert v.probe_windows == 16
    assert v.clock_edges == 2 * 16 / ClockSyncSettings().window == 16
    assert v.probe_paths == pytest.approx(16 / ProbeSettings(key="k" * 16).trace_interval) == pytest.approx(16 / 120)
    assert (v.host_nic_samples, v.points) == (0.2, 0.1)
    assert v.total == pytest.approx(16 + 16 + 16 / 120 + 0.3)
    big = agent_volume(nics=8, peers=16, paths=8)
    assert big.probe_windows == 1024  # every NIC probes every peer's same-index NIC on every path
    assert big.clock_edges == 16  # clock edges are per peer host, not per NIC
    assert big.total == pytest.approx(1024 + 16 + 1024 / 120 + 1.6 + 0.1)


def test_the_sizing_arithmetic():
    costs = Costs(api_s=100e-6, write_s=200e-6, correlate_s=50e-6, poll_s=0.15, poll_ports=16, bus_bytes=300,
                  line_bytes=400, disk_bytes=100)
    assert switches_for(1000) == 32 + 16  # 32 leaves of 32 host ports and half as many spines
    assert members(0.01) == 1 and members(1.0) == 2 and members(1.01) == 3  # half a core each
    assert poll_s(costs) == pytest.approx(0.15 + 48 * SNMP_S_PER_PORT)  # 64 ports: 48 beyond the measured 16
    volume = agent_volume(nics=1, peers=16, paths=8)  # 128 windows, 16 edges, ~1.07 paths, 0.2 + 0.1
    assert volume.messages() == pytest.approx(1 + 1 + 1 + 0.2 + 0.1)  # a batch per kind per 1 s report
    z = size(10_000, volume, costs)
    assert z.hosts == 1_250 and z.records_s == pytest.approx(1_250 * volume.total)
    assert z.records_s == pytest.approx(181_708, rel=1e-4)
    # 181.7k records/s x 100 us = 18.2 cores -> 37 members at half a core; writers 36.3 cores -> 73
    assert (z.api, z.write, z.correlate) == (37, 73, 19)
    assert z.switches == switches_for(10_000) == 313 + 157
    assert z.poll == members(470 * poll_s(costs) / 10) == 21  # 10.0 cores
    assert z.bus_msgs_s == pytest.approx(1_250 * 3.3) and z.bus_bytes_s == pytest.approx(z.records_s * 300)
    assert z.points_s == pytest.approx(z.records_s + 470 * 64 * 2 / 10)  # + PortSample and PortRates per port
    assert z.disk_gb_day == pytest.approx(z.points_s * 100 * 86_400 / 1e9)


def test_the_leaf_shards_split_the_hosts():
    synth = Synth(spines=2, leaves=8, hosts_per_leaf=4, peers=4, paths_per_peer=2, validate=False)
    shards = [shard_hosts(synth, SHARDS, f"m{i}") for i in range(SHARDS)]
    assert set().union(*shards) == set(synth.hosts)
    assert sum(map(len, shards)) == len(synth.hosts)  # disjoint: a host has one leaf here
    assert all(len(s) % 4 == 0 for s in shards)  # whole leaves
