"""The CLI collector's `arista_eos` platform: its parsers on outputs in EOS's JSON shapes
(tests/fixtures/eos/, after captured EOS 4.x outputs; no EOS device runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.cli import eos

FIX = Path(__file__).parent / "fixtures" / "eos"
TS = 1_764_000_100 * 10**9


def text(name: str) -> str:
    return (FIX / name).read_text()


def every(_name: str) -> bool:
    return True


def test_interfaces_give_64_bit_counters_speed_mtu_and_state():
    notes: list[str] = []
    samples, count = eos.port_samples("leaf1", text("show_interfaces.json"), TS, {}, every, notes)
    assert count == 4
    by = {s.port: s for s in samples}
    assert sorted(by) == ["Ethernet1/1", "Ethernet2/1", "Management1", "Vlan100"]
    e1 = by["Ethernet1/1"]
    assert (e1.in_octets, e1.out_octets, e1.in_pkts, e1.out_pkts) == (18446744073709550000, 98304, 1023, 910)
    assert (e1.in_errors, e1.out_errors, e1.in_discards, e1.out_discards) == (7, 0, 2, 11)
    assert (e1.speed_bps, e1.mtu, e1.oper_status) == (400 * 10**9, 9214, "up")
    down = by["Ethernet2/1"]
    assert down.oper_status == "down" and down.speed_bps is None  # bandwidth 0: unknown, not 0 b/s
    assert by["Management1"].in_pkts == 50  # only the unicast column given: the others count as absent
    vlan = by["Vlan100"]  # no interfaceCounters: the state, speed and MTU still
    assert (vlan.oper_status, vlan.mtu, vlan.in_octets, vlan.out_pkts) == ("up", 1500, None, None)
    assert notes == []


def test_only_interfaces_without_counters_are_a_usable_answer():
    doc = {"interfaces": {"Loopback0": {"lineProtocolStatus": "up", "mtu": 65535, "bandwidth": 0}}}
    samples, count = eos.port_samples("leaf1", json.dumps(doc), TS, {}, every, notes := [])
    assert count == 1 and notes == []
    assert [(s.port, s.oper_status, s.mtu, s.speed_bps) for s in samples] == [("Loopback0", "up", 65535, None)]


def test_interface_filter_and_unusable_output():
    samples, _ = eos.port_samples("leaf1", text("show_interfaces.json"), TS, {}, lambda n: n.startswith("Eth"), [])
    assert [s.port for s in samples] == ["Ethernet1/1", "Ethernet2/1"]
    with pytest.raises(eos.Bad, match="interfaces"):
        eos.port_samples("leaf1", '{"errors": ["Invalid input"]}', TS, {}, every, [])
    with pytest.raises(eos.Bad):
        eos.port_samples("leaf1", "% Invalid input (at token 2: 'json')", TS, {}, every, [])


def test_a_bad_counter_is_left_out_and_the_rest_kept():
    doc = json.loads(text("show_interfaces.json"))
    doc["interfaces"]["Ethernet1/1"]["interfaceCounters"]["inOctets"] = -5
    doc["interfaces"]["Ethernet1/1"]["interfaceCounters"]["outOctets"] = "many"
    samples, _ = eos.port_samples("leaf1", json.dumps(doc), TS, {}, every, [])
    e1 = next(s for s in samples if s.port == "Ethernet1/1")
    assert e1.in_octets is None and e1.out_octets is None and e1.in_errors == 7


def test_facts_from_show_version():
    f = eos.facts("leaf1", text("show_version.json"), TS, 4, None)
    assert f.sys_descr == "Arista DCS-7060DX5-64S 4.31.2F" and f.interfaces == 4
    assert f.uptime_ticks == 100 * 100  # booted 100 s before TS
    assert f.lldp_chassis_id == "08:00:27:b3:fc:e1" and f.sys_name is None  # in `show hostname`
    assert eos.hostname(text("show_hostname.json")) == "leaf1"
    with pytest.raises(eos.Bad, match="hostname"):
        eos.hostname('{"fqdn": "leaf1.fabric.example"}')
    with pytest.raises(eos.Bad):
        eos.facts("leaf1", "{}", TS, 4, None)


def test_addresses_primary_and_secondary_bad_ones_named():
    notes: list[str] = []
    found = eos.addresses("leaf1", text("show_ip_interface.json"), TS, every, notes)
    assert sorted((a.port, a.address, a.prefix_len) for a in found) == [
        ("Ethernet1/1", "10.0.0.1", 31), ("Vlan100", "192.168.233.1", 24), ("Vlan100", "192.168.234.1", 24)]
    assert len(notes) == 1 and "192.168.235.1" in notes[0] and "maskLen 40" in notes[0]


def test_lldp_neighbours_port_names_and_mac_port_ids():
    notes: list[str] = []
    found = {n.port: n for n in eos.neighbors("leaf1", text("show_lldp_neighbors_detail.json"), TS, every, notes)}
    assert sorted(found) == ["Ethernet1/1", "Ethernet8"]
    spine = found["Ethernet1/1"]
    assert (spine.remote_name, spine.remote_port, spine.remote_chassis_id) == (
        "spine1",
        "Ethernet3/1",
        "2c:60:0c:ad:30:34",  # EOS's dotted form, in the one form of every collector
    )
    host = found["Ethernet8"]  # port id is a MAC: the description names the port
    assert (host.remote_name, host.remote_port) == ("gpu-node-17", "ens1f0np0")
    assert notes == ["Ethernet13: a neighbour without name, port or chassis id"]


def test_running_config_without_its_volatile_header():
    raw = text("show_running_config.txt")
    clean = eos.normalize(raw, "eos")
    assert "! Command:" not in clean and "hostname leaf1" in clean and "maximum-paths 64" in clean
    assert eos.normalize(raw.replace("! Command: show running-config", "! Time: Tue Nov 25 10:00:00 2026"),
                         "eos") == clean
