"""The CLI collector's `cisco_nxos` platform: its parsers on outputs in NX-OS's JSON shapes
(tests/fixtures/nxos/, after NX-API / `| json` outputs; no NX-OS device runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.cli import nxos

FIX = Path(__file__).parent / "fixtures" / "nxos"
TS = 1_764_000_100 * 10**9


def text(name: str) -> str:
    return (FIX / name).read_text()


def every(_name: str) -> bool:
    return True


def test_interfaces_counters_as_numbers_or_strings_speed_from_kbps():
    notes: list[str] = []
    samples, count = nxos.port_samples("spine1", text("show_interface.json"), TS, {}, every, notes)
    assert count == 4 and notes == []
    by = {s.port: s for s in samples}
    e1 = by["Ethernet1/1"]
    assert (e1.in_octets, e1.out_octets, e1.in_pkts, e1.out_pkts) == (15398656, 18446744073709551000, 120302, 99200)
    assert (e1.in_errors, e1.out_errors, e1.in_discards, e1.out_discards) == (3, 0, 5, 17)  # strings in the JSON
    assert (e1.speed_bps, e1.mtu, e1.oper_status) == (400 * 10**9, 9216, "up")
    assert by["Ethernet1/2"].oper_status == "down" and by["Ethernet1/2"].speed_bps is None
    assert by["mgmt0"].speed_bps == 10**9
    lo = by["loopback0"]  # no counters: the state and MTU still
    assert (lo.oper_status, lo.mtu, lo.speed_bps, lo.in_octets) == ("up", 1500, None, None)


def test_tables_in_list_form_and_mgmt0s_own_counters():
    """`"TABLE_x": [{"ROW_x": ...}, ...]` (NX-OS's `show ip interface`, one per VRF, napalm's captures)
    and mgmt0's vdc_lvl_ counters (napalm's Nexus3548 capture: tests/test_cli_napalm_cases.py)."""
    doc = {"TABLE_interface": [
        {"ROW_interface": {"interface": "mgmt0", "state": "up", "eth_bw": "1000000", "eth_mtu": "1500",
                           "vdc_lvl_in_pkts": "20559846", "vdc_lvl_in_bytes": "3592332845",
                           "vdc_lvl_out_pkts": "10533191", "vdc_lvl_out_bytes": "3678843272"}},
        {"ROW_interface": [{"interface": "Vlan120", "svi_line_proto": "up", "svi_mtu": "9000", "svi_bw": "1000000"}]}]}
    samples, count = nxos.port_samples("spine1", json.dumps(doc), TS, {}, every, notes := [])
    assert count == 2 and notes == []
    mgmt, vlan = samples
    assert (mgmt.in_octets, mgmt.out_octets, mgmt.in_pkts, mgmt.out_pkts) == (3592332845, 3678843272, 20559846,
                                                                            10533191)
    assert mgmt.in_errors is None  # not counted at the VDC level: absent, not 0
    assert (vlan.port, vlan.oper_status, vlan.mtu, vlan.speed_bps) == ("Vlan120", "up", 9000, 10**9)
    with pytest.raises(nxos.Bad, match="TABLE_intf is neither"):
        nxos.rows({"TABLE_intf": ["x"]}, "intf")


def test_one_row_as_an_object_and_bad_output():
    one = {"TABLE_interface": {"ROW_interface": json.loads(text("show_interface.json"))["TABLE_interface"][
        "ROW_interface"][1]}}
    samples, count = nxos.port_samples("spine1", json.dumps(one), TS, {}, every, [])
    assert count == 1 and [s.port for s in samples] == ["Ethernet1/1"]
    with pytest.raises(nxos.Bad, match="TABLE_interface"):
        nxos.port_samples("spine1", "{}", TS, {}, every, [])
    with pytest.raises(nxos.Bad):
        nxos.port_samples("spine1", "% Invalid command at '^' marker.", TS, {}, every, [])


def test_facts_from_show_version():
    f = nxos.facts("spine1", text("show_version.json"), TS, 4, None)
    assert f.sys_name == "spine1" and f.sys_descr == "Cisco Nexus9000 C9364D-GX2A Chassis NX-OS 10.3(4a)"
    assert f.uptime_ticks == (((2 * 24 + 3) * 60 + 4) * 60 + 5) * 100
    with pytest.raises(nxos.Bad):
        nxos.facts("spine1", '{"host_name": "x"}', TS, 4, None)


def test_addresses_across_vrfs_without_mask_named():
    notes: list[str] = []
    found = nxos.addresses("spine1", text("show_ip_interface_vrf_all.json"), TS, every, notes)
    assert sorted((a.port, a.address, a.prefix_len) for a in found) == [
        ("Ethernet1/1", "10.0.0.0", 31), ("loopback0", "10.255.0.1", 32), ("mgmt0", "192.0.2.11", 24)]
    assert len(notes) == 1 and "Vlan103" in notes[0] and "masklen" in notes[0]


def test_lldp_short_local_names_made_long_null_strings_dropped():
    notes: list[str] = []
    found = {n.port: n for n in nxos.neighbors("spine1", text("show_lldp_neighbors_detail.json"), TS, every, notes)}
    assert sorted(found) == ["Ethernet1/1", "mgmt0"]
    n = found["Ethernet1/1"]
    assert (n.remote_name, n.remote_port, n.remote_chassis_id) == ("leaf1", "Ethernet3/1", "2c:60:0c:ad:30:34")
    assert found["mgmt0"].remote_port_desc is None and found["mgmt0"].remote_description is None
    assert notes == ["Ethernet1/9: a neighbour without name, port or chassis id"]
    assert nxos.long_name("Po10") == "port-channel10" and nxos.long_name("Ethernet1/1") == "Ethernet1/1"


def test_running_config_without_its_volatile_header():
    clean = nxos.normalize(text("show_running_config.txt"), "nxos")
    assert "!Time" not in clean and "!Running configuration last done" not in clean and "hostname spine1" in clean
