"""The built 2x2x2 lab: ground truth, config, ECMP by source port, SNMP (v2c, v3), LLDP, traffic."""

from __future__ import annotations

import json
import os
import stat

import pytest
from lab_helpers import RATE

from nms.config import load_config
from tests.helpers import wait_until

IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"
IF_HIGH_SPEED = "1.3.6.1.2.1.31.1.1.1.15"
IF_OPER_STATUS = "1.3.6.1.2.1.2.2.1.8"
LLDP_LOC_PORT_ID = "1.0.8802.1.1.2.1.3.7.1.3"
LLDP_REM_PORT_ID = "1.0.8802.1.1.2.1.4.1.1.7"
LLDP_REM_SYS_NAME = "1.0.8802.1.1.2.1.4.1.1.9"

pytestmark = pytest.mark.root  # needs root: network namespaces (skips without it, see conftest)


def test_status_lists_nodes_links_and_no_faults(lab):
    s = lab.status()
    assert sorted(s["nodes"]) == sorted(["spine1", "spine2", "leaf1", "leaf2", "host1", "host2", "host3", "host4"])
    assert len(s["links"]) == 8 and {ln["kind"] for ln in s["links"]} == {"fabric", "access"}
    assert all(ln["oper"] == {"a": "up", "b": "up"} for ln in s["links"])
    assert all(all(n["services"].values()) for n in s["nodes"].values())
    assert s["faults"] == [] and s["clocks"] == {}


def test_config_loads_and_matches_the_lab(lab):
    s = lab.state()
    cfg = load_config(s["lab"]["config"])
    assert {sw.name: sw.role for sw in cfg.fabric.switches} == {"spine1": "spine", "spine2": "spine",
                                                                "leaf1": "leaf", "leaf2": "leaf"}
    assert {(ln.a, ln.b) for ln in cfg.fabric.links} == {(ln["a"], ln["b"]) for ln in s["links"]}
    nic = {h.name: h.nics[0] for h in cfg.fabric.hosts}["host3"]
    assert (nic.address, nic.switch, nic.switch_port) == ("198.19.2.1", "leaf2", "swp1")
    assert cfg.fabric.switches[0].collectors.snmp.community.get_secret_value() == s["snmp"]["community"]
    token = cfg.api.tokens[0]
    assert set(token.scopes) == {"read", "ingest", "act", "admin"}
    assert token.token.get_secret_value() == open(s["lab"]["token_file"]).read().strip()
    assert stat.S_IMODE(os.stat(s["lab"]["token_file"]).st_mode) == 0o600
    assert str(cfg.data_dir).startswith(s["lab"]["lab_dir"])


def test_udp_source_ports_choose_spines(lab):
    """Two source ports between the same hosts: `ip route get` puts them on different spines, and
    the spines' interface counters show the traffic exactly there."""
    sports = {spine: lab.sport_via("host1", "host3", spine, dport=5201) for spine in ("spine1", "spine2")}
    for spine, sport in sports.items():
        other = "spine2" if spine == "spine1" else "spine1"
        before = {sp: lab.counters(sp, "swp1")["rx"]["packets"] for sp in ("spine1", "spine2")}
        run = json.loads(lab.cli("traffic", "pairs", "--pair", "host1:host3", "--proto", "udp", "--rate", "20M",
                                 "--duration", "1", "--sport", str(sport), "--length", "1400", "--json").stdout)
        flow = run["flows"][0]
        assert flow["error"] is None and flow["sport"] == sport and flow["spine"] == spine
        delta = {sp: lab.counters(sp, "swp1")["rx"]["packets"] - before[sp] for sp in before}
        # 20 Mbit/s for 1 s of 1400-byte datagrams is ~1800 packets; the TCP control
        # connection and LLDP add a few dozen wherever they hash.
        assert delta[spine] > 1500, (sport, delta)
        assert delta[other] < 200, (sport, delta)


def test_tcp_hash_is_deterministic(lab):
    """TCP flows with a pinned source port follow `ip route get` too (hash policy 3, not 1)."""
    for spine in ("spine1", "spine2"):
        sport = lab.sport_via("host2", "host4", spine, dport=5201, proto="tcp", start=42000)
        before = lab.counters(spine, "swp1")["rx"]["bytes"]
        run = json.loads(lab.cli("traffic", "pairs", "--pair", "host2:host4", "--rate", "20M", "--duration", "1",
                                 "--sport", str(sport), "--json").stdout)
        assert run["flows"][0]["error"] is None
        assert lab.counters(spine, "swp1")["rx"]["bytes"] - before > 2_000_000


def test_snmp_ifmib_answers_v2c_and_v3(lab):
    for sw in lab.topo.switches:
        ports = {p.name for p in sw.ports}
        for v3 in (False, True):
            names = lab.snmpwalk(sw.name, IF_NAME, v3=v3)
            assert ports | {"lo", "mgmt0"} == set(names.values()), (sw.name, v3)
        by_name = {v: k for k, v in lab.snmpwalk(sw.name, IF_NAME).items()}
        speed = lab.snmpwalk(sw.name, IF_HIGH_SPEED, v3=True)
        oper = lab.snmpwalk(sw.name, IF_OPER_STATUS)
        for port in ports:
            assert speed[by_name[port]] == str(RATE // 10**6)  # the shaped rate, not veth's 10G
            assert oper[by_name[port]] in ("1", "up(1)")


def _lldp_links(lab, switch: str) -> set[frozenset]:
    local = lab.snmpwalk(switch, LLDP_LOC_PORT_ID)
    names = lab.snmpwalk(switch, LLDP_REM_SYS_NAME)
    ports = lab.snmpwalk(switch, LLDP_REM_PORT_ID)
    seen = set()
    for index, sysname in names.items():
        _, local_num, _ = index.split(".")  # timeMark.localPortNum.remIndex
        seen.add(frozenset({f"{switch}:{local[local_num]}", f"{sysname}:{ports[index]}"}))
    return seen


def test_lldp_neighbours_over_snmp_equal_built_links(lab):
    built = {frozenset({str(ln.a), str(ln.b)}) for ln in lab.topo.links}

    def seen():
        out = set()
        for sw in lab.topo.switches:
            out |= _lldp_links(lab, sw.name)
        return out

    assert wait_until(lambda: seen() == built, timeout=20), (seen() ^ built)


def test_traffic_patterns_report_every_flow(lab):
    a2a = json.loads(lab.cli("traffic", "all-to-all", "--proto", "udp", "--rate", "5M", "--duration", "1",
                             "--json").stdout)
    assert len(a2a["flows"]) == 12
    assert len({f["sport"] for f in a2a["flows"]}) == 12
    for f in a2a["flows"]:
        assert f["error"] is None and f["lost_percent"] < 5 and 4e6 < f["received_bps"] < 6e6, f
    incast = json.loads(lab.cli("traffic", "incast", "--dst", "host1", "--duration", "2", "--json").stdout)
    assert {f["src"] for f in incast["flows"]} == {"host2", "host3", "host4"}
    total = sum(f["received_bps"] for f in incast["flows"])
    assert 0.75 * RATE < total < 1.05 * RATE  # three senders share host1's one 100M link
    assert len(lab.state()["traffic"]) >= 2  # runs are recorded as ground truth
