"""Telemetry on the bus without a server: roles, the cluster config, subjects and partition keys,
ingest bodies split to the bus's message size and decoded back (nms/app/telemetry_bus.py, nms/app/roles.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nms.app.roles import parse_roles
from nms.app.telemetry_bus import (
    FAMILIES,
    FAMILY_OF,
    POLLED,
    decode,
    encode,
    kind_of,
    partition_key,
    stream_specs,
    subject,
)
from nms.bus import BusError, subject_token
from nms.config import ConfigError, load_config, parse_config
from nms.config.models import BusConfig
from nms.records import INGEST_KINDS, GenericPoint, LinkEvent, PortSample, ProbeWindow

REPO = Path(__file__).resolve().parents[1]
T0 = 1_764_000_000_000_000_000


def _window(src: str, i: int) -> ProbeWindow:
    return ProbeWindow(src_host=src, src_nic="eth0", dst_host="h9", dst_nic="eth0", path_id=f"p{i % 4}",
                       window_start=T0 + i * 10**9, sent=100, received=99 - i % 3, owd_fwd_min_ns=-5 - i)


def test_roles_all_is_the_single_process_without_a_bus_and_adds_write_with_one():
    assert parse_roles("all", has_bus=False) == {"api", "poll", "correlate"}
    assert parse_roles("all", has_bus=True) == {"api", "poll", "correlate", "write"}
    assert parse_roles(" api, write ", has_bus=True) == {"api", "write"}
    with pytest.raises(ValueError, match="--role write: needs a bus.*cluster.bus"):
        parse_roles("api,write", has_bus=False)
    with pytest.raises(ValueError, match="--role: unknown role 'writer'"):
        parse_roles("api,writer", has_bus=True)
    with pytest.raises(ValueError, match="--role: give one or more"):
        parse_roles(" , ", has_bus=True)


def test_cluster_config_is_validated_and_names_the_field():
    cfg = parse_config("store: {backend: influxdb}\ncluster:\n  bus: {servers: [nats://10.0.0.1:4222], replicas: 3}\n")
    assert cfg.cluster.bus is not None and cfg.cluster.bus.replicas == 3 and cfg.cluster.write.batch_messages == 64
    assert parse_config("site: x\n").cluster.bus is None  # no cluster section: one process, as before
    env = {"INFLUX_PASSWORD": "pw", "NATS_TOKEN": "nt", "NMS_TOKEN": "x" * 32,
           "NMS_STATE_DSN": "postgresql://nms:pw@db.example.net:5432/nms"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        example = load_config(REPO / "config/cluster.yaml")
    assert example.cluster.bus is not None and example.cluster.bus.replicas == 3
    assert len(example.cluster.bus.servers) == 3 and example.state.backend == "postgresql"
    cases = {
        "cluster: {bus: {}}\n": "store.backend: the embedded DuckDB store is single-node",
        "store: {backend: influxdb}\ncluster: {bus: {servers: ['http://n1:4222']}}\n": "cluster.bus.servers.0",
        "store: {backend: influxdb}\ncluster: {bus: {prefix: 'a.b'}}\n": "cluster.bus.prefix",
        "store: {backend: influxdb}\ncluster: {bus: {replicas: 7}}\n": "cluster.bus.replicas",
        "store: {backend: influxdb}\ncluster: {bus: {password: x}}\n": "password needs a username",
        "store: {backend: influxdb}\ncluster: {write: {ack_wait: soon}}\n": "cluster.write.ack_wait",
        "store: {backend: influxdb}\ncluster: {bsu: {}}\n": "cluster.bsu",
    }
    for text, named in cases.items():
        with pytest.raises(ConfigError) as e:
            parse_config(text)
        issues = " | ".join(str(i) for i in e.value.issues)
        assert named in issues.replace("[", ".").replace("]", ""), (text, issues)


def test_every_ingest_kind_has_one_family_stream_and_subjects_carry_the_partition_key():
    placed = [kind for kinds in FAMILIES.values() for kind in kinds]
    assert sorted(placed) == sorted(INGEST_KINDS), "place every ingest kind in one family (FAMILIES)"
    assert set(FAMILY_OF) == set(INGEST_KINDS)
    specs = stream_specs(BusConfig(prefix="site1", replicas=3, retention=3600))
    assert [(s.name, s.subjects, s.replicas, s.max_age_s) for s in specs] == [
        (f"SITE1_TEL_{f.upper()}", (f"site1.tel.{f}.>",), 3, 3600.0) for f in (*FAMILIES, POLLED)]
    assert subject("nms", "probe_windows", partition_key(_window("gpu-1.pod2", 0))) == \
        "nms.tel.probe.probe_windows.gpu-1%2Epod2"
    sample = PortSample(device="leaf1", port="swp1", ts=T0, in_octets=1)
    assert subject("nms", "port_samples", partition_key(sample)) == "nms.tel.switch.port_samples.leaf1"
    assert partition_key(GenericPoint(measurement="m", tags={"host": "h1"}, fields={"v": 1}, ts=T0)) == "h1"
    assert partition_key(GenericPoint(measurement="m", fields={"v": 1}, ts=T0)) == "_"
    assert kind_of("nms.tel.switch.port_samples.leaf1") == "port_samples"
    assert kind_of("nms.tel.switch.nonsense.leaf1") is None
    # the polled stream (what poll members hand the correlate members) carries two kinds no ingest takes
    event = LinkEvent(device="leaf1", port="swp1", ts=T0, state="down", previous="up")
    topic = subject("nms", "link_events", partition_key(event), POLLED)
    assert topic == "nms.tel.polled.link_events.leaf1" and kind_of(topic) == "link_events"
    assert decode(topic, encode("link_events", [event], 1 << 20)[0]) == ("link_events", [event])
    with pytest.raises(BusError, match="not a batch of link_events"):
        decode(topic, encode("port_samples", [sample], 1 << 20)[0])
    # one token whatever the value holds: no '.', no wildcards, reversible bytes
    assert subject_token("a.b*c>d é") == "a%2Eb%2Ac%3Ed%20%C3%A9"


def test_ingest_bodies_split_to_the_message_size_and_decode_to_the_same_records():
    records = [_window("h1", i) for i in range(50)]
    [body] = encode("probe_windows", records, 1 << 20)
    assert json.loads(body)["items"][0]["src_host"] == "h1"  # an ingest body: {"items": [...]}
    assert decode("nms.tel.probe.probe_windows.h1", body) == ("probe_windows", records)
    small = encode("probe_windows", records, 2000)
    assert len(small) > 5 and all(len(b) <= 2000 for b in small)
    assert [r for b in small for r in decode("nms.tel.probe.probe_windows.h1", b)[1]] == records
    with pytest.raises(BusError, match="more than the bus takes"):
        encode("probe_windows", records[:1], 100)


def test_a_message_that_is_no_telemetry_batch_is_named():
    with pytest.raises(BusError, match="not a telemetry subject"):
        decode("nms.other.x", b"{}")
    with pytest.raises(BusError, match=r"nms.tel.probe.probe_windows.h1: not a batch of probe_windows"):
        decode("nms.tel.probe.probe_windows.h1", b'{"items": [{"src_host": "h1"}]}')
