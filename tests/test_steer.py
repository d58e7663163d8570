"""The agent's steering table and steer arguments (hostprobe/steer.py); the traces and the traffic
moving are exercised on the lab (tests/lab/test_steering_lab.py)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from hostprobe.config import SteeringSettings
from hostprobe.steer import SteerError, Steering, live_routes, parse_steer, read_table
from nms.lab.jobtraffic import steered_ports

GOOD = {"action_id": 3, "element": "leaf1:swp1--spine1:swp1", "avoid_hops": ["198.19.0.1"], "dsts": ["host3"],
        "proto": "udp", "dport": 4791}


def test_parse_steer_names_the_bad_field():
    later = time.time_ns() + 10**10
    assert parse_steer({**GOOD, "expires_ns": later})["avoid_hops"] == {"198.19.0.1"}
    for bad, field in [({"avoid_hops": []}, "avoid_hops"), ({"dsts": "host3"}, "dsts"), ({"proto": "tcp"}, "proto"),
                       ({"dport": 0}, "dport"), ({"action_id": True}, "action_id"),
                       ({"expires_ns": 5}, "expires_ns")]:
        with pytest.raises(SteerError, match=field):
            parse_steer({**GOOD, "expires_ns": later, **bad})


def test_unsteer_removes_only_its_action_and_expired_entries_are_ignored(tmp_path):
    path = tmp_path / "steering.json"
    now = time.time_ns()
    path.write_text(json.dumps({"version": 4, "updated_ns": 1, "routes": {
        "198.19.2.1": {"ports": [49153, 49160], "action_ids": [3, 5], "expires_ns": now + 10**11},
        "198.19.2.2": {"ports": [49154], "action_ids": [3], "expires_ns": now + 10**11},
        "198.19.2.3": {"ports": [49155], "action_ids": [9], "expires_ns": now - 1}}}))
    assert live_routes(read_table(path)) == {"198.19.2.1": [49153, 49160], "198.19.2.2": [49154]}
    assert steered_ports(path) == live_routes(read_table(path))  # the generator reads it the same way
    s = Steering(SteeringSettings(), path, b"k" * 16, 1, 8, 100.0, lambda: 1)
    status, message = s.unsteer({"action_id": 3})
    table = read_table(path)
    assert status == "done" and "2 destination" in message
    assert table["version"] == 5 and list(table["routes"]) == ["198.19.2.1"]  # expired one dropped too
    assert table["routes"]["198.19.2.1"]["action_ids"] == [5]
    assert not list(tmp_path.glob(".steering-*"))  # no temporary file left behind


def test_a_malformed_table_steers_nothing(tmp_path):
    path = tmp_path / "steering.json"
    path.write_text("{not json")
    assert steered_ports(path) == {}
    path.write_text(json.dumps({"routes": {"198.19.2.1": {"ports": ["x"]}, "198.19.2.2": {"ports": [5]}}}))
    assert steered_ports(path) == {"198.19.2.2": [5]}
    assert steered_ports(tmp_path / "missing.json") == {}


def test_steer_refuses_unknown_peers_before_tracing(tmp_path):
    s = Steering(SteeringSettings(), tmp_path / "t.json", b"k" * 16, 1, 8, 100.0, lambda: 1)
    with pytest.raises(SteerError, match="not peers of this agent: host3"):
        s.start_steer({**GOOD, "expires_ns": time.time_ns() + 10**10}, {}, lambda *a: None)
    assert not (tmp_path / "t.json").exists()


def test_steering_settings_are_checked():
    with pytest.raises(ValueError, match="ports_per_dst"):
        SteeringSettings(candidates=2, ports_per_dst=3)
    with pytest.raises(ValueError, match="65535"):
        SteeringSettings(port_base=65530, candidates=16)
    assert SimpleNamespace(**SteeringSettings().model_dump()).candidates == 16
