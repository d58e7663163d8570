"""napalm's public test captures as the peer of the CLI collector's vendor platforms.

Source: github.com/napalm-automation/napalm at commit ee70e634555f6d1f9d32369f2151dde526ad6dfd,
`test/<driver>/mocked_data/test_<getter>/<case>/`: outputs that real EOS, NX-OS and IOS devices
gave (`show ... | json`, eAPI and NX-API answers, which are the same JSON models, and text), with
`expected_result.json`, what napalm's getter returns for them. Copied unchanged to
tests/fixtures/napalm/<driver>/ (Apache License 2.0: tests/fixtures/napalm/LICENSE and NOTICE);
only the getters that map onto our records, and of the `| json` ones only the files our commands read.

Each case is replayed through CliCollector.collect() on a session that answers from the case's
files (tests/_replay_cli.py; no SSH: the login and host-key path is tests/test_cli_collector.py's): our
`| json` commands (`arista_eos`, `cisco_nxos`) on exec channels, and the commands of napalm's
getters (`cisco_ios`; `cisco_nxos` on a device refusing `| json`: nxos_ssh) on the shell, as
napalm's own tests answer them. A command the case has no file for fails as a device's would
(a problem of the poll: PollResult.problems), except the interface list, which a poll cannot do without: it is answered
with an empty table. Then the records are compared with napalm's expected result, field by field.

Left out: nxos (NX-API) `get_lldp_neighbors_detail`: napalm reads its text form, we read `| json`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from _replay_cli import NOT_RECORDED, poll

from collectors.base import CollectorBadResponse, PollProblem
from collectors.lldp_id import mac_octets, mac_or_text
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint, InterfaceAddress, LldpNeighbor, PortSample

NAPALM = Path(__file__).parent / "fixtures" / "napalm"
PLATFORM = {"eos": "arista_eos", "nxos": "cisco_nxos", "nxos_ssh": "cisco_nxos", "ios": "cisco_ios"}
# our command -> the file of napalm's capture that answers it
FILES = {
    "eos": {"show interfaces | json": "show_interfaces.json", "show version | json": "show_version.json",
            "show hostname | json": "show_hostname.json", "show ip interface | json": "show_ip_interface.json",
            "show lldp neighbors detail | json": "show_lldp_neighbors__detail.json",
            "show running-config": "show_running_config.text"},
    # napalm's nxos driver asks NX-API for `show ip interface`; we ask `... vrf all`: the same model
    "nxos": {"show interface | json": "show_interface.json", "show version | json": "show_version.json",
             "show ip interface vrf all | json": "show_ip_interface.json",
             "show running-config": "show_running-config.json"},  # NX-API's raw text, despite the name
    "nxos_ssh": {"show interface | json": "show_interface___json.txt"},
}
EMPTY_LINKS = {"eos": '{"interfaces": {}}', "nxos": '{"TABLE_interface": {"ROW_interface": []}}'}
EMPTY_LINKS["nxos_ssh"] = EMPTY_LINKS["nxos"]
CASES = sorted(p.parent for p in NAPALM.glob("*/test_get_*/*/expected_result.json"))
# nxos_ssh's captures of `show ... | json` (the rest are text: the device refused `| json`, see below)
NXOS_SSH_JSON = ("test_get_interfaces_counters",)
REFUSAL = (NAPALM / "nxos_ssh/test_get_facts/does_not_support_json/show_inventory___json.txt").read_text()


def replay(driver: str, answers: dict[str, str], case: Path | None = None) -> tuple[list, list[PollProblem]]:
    dev = SwitchConfig(name="sw", mgmt_address="192.0.2.1", collectors={"cli": {
        "platform": PLATFORM[driver], "username": "u", "password": "p", "verify_host_key": False}})
    result = asyncio.run(poll(dev, dict(answers), case))
    return result.records, result.problems


def case_answers(case: Path) -> dict[str, str]:
    driver = case.parts[-3]
    if driver not in FILES:  # read through napalm's getters: ReplayShell answers
        return {}
    if driver == "nxos_ssh" and case.parts[-2] not in NXOS_SSH_JSON:
        # a device without `| json` (NX-OS before 7.0(3)): `show interface | json` is refused, and the
        # collector reads through napalm's nxos_ssh text getters, which ReplayShell answers
        return {"show interface | json": REFUSAL}
    answers = {cmd: (case / f).read_text() for cmd, f in FILES[driver].items() if (case / f).is_file()}
    links = next(iter(FILES[driver]))
    answers.setdefault(links, EMPTY_LINKS[driver])
    return answers


def of(records: list, kind: type) -> list:
    return [r for r in records if isinstance(r, kind)]


# -- napalm's getters -> our records -----------------------------------------------------------------

def check_interfaces(expected: dict, records: list, case: Path) -> None:
    samples = {s.port: s for s in of(records, PortSample)}
    assert set(samples) == set(expected)
    for name, want in expected.items():
        got = samples[name]
        assert (got.oper_status == "up") == want["is_up"], name
        assert got.mtu == (want["mtu"] if want["mtu"] != -1 else None), name  # napalm's -1: not known
        assert got.speed_bps == (round(want["speed"] * 10**6) if want["speed"] > 0 else None), name


def check_interfaces_counters(expected: dict, records: list, case: Path) -> None:
    samples = {s.port: s for s in of(records, PortSample)}
    for name, want in expected.items():
        got = samples[name]
        if case.name == "Nexus3548" and name.startswith("mgmt"):
            # napalm reads mgmt0's mgmt_in/out_bytes from `show interface counters detailed`, another
            # command at another moment; we read `show interface`'s vdc_lvl_in/out_bytes: within 1 %
            assert abs(got.in_octets / want["rx_octets"] - 1) < 0.01, name
            assert abs(got.out_octets / want["tx_octets"] - 1) < 0.01, name
            continue
        want = {k: None if v == -1 else v for k, v in want.items()}  # napalm's -1: not known
        assert (got.in_errors, got.out_errors) == (want["rx_errors"], want["tx_errors"]), name
        assert (got.in_discards, got.out_discards) == (want["rx_discards"], want["tx_discards"]), name
        traffic = [(got.in_octets, want["rx_octets"]), (got.out_octets, want["tx_octets"]),
                   (got.in_pkts, sum(want[f"rx_{k}_packets"] or 0 for k in ("unicast", "multicast", "broadcast"))),
                   (got.out_pkts, sum(want[f"tx_{k}_packets"] or 0 for k in ("unicast", "multicast", "broadcast")))]
        if case.name == "Nexus3548":
            # napalm's octets and packets are from `show interface counters detailed`, read after the
            # `show interface` we read (its discards are from ours: equal above): never less, < 0.1 % more
            assert all(ours <= theirs <= ours * 1.001 for ours, theirs in traffic), (name, traffic)
        else:
            assert all(ours == theirs for ours, theirs in traffic), (name, traffic)


def check_facts(expected: dict, records: list, case: Path) -> None:
    facts = of(records, DeviceFacts)
    assert len(facts) == 1 and records[0] is facts[0]  # the facts come first
    f = facts[0]
    assert f.sys_name == expected["hostname"]
    assert f.sys_descr.startswith(expected["vendor"]) and expected["model"] in f.sys_descr
    # napalm's EOS os_version is the internal one: `4.15.5M-3054042.4155M` for version 4.15.5M
    assert expected["os_version"].split("-")[0] in f.sys_descr
    assert f.interfaces == len(expected["interface_list"])
    if isinstance(expected["uptime"], int):
        assert f.uptime_ticks == expected["uptime"] * 100
    else:  # EOS: napalm's is now - bootupTimestamp, left out of its expected result ("...")
        boot = json.loads((case / "show_version.json").read_text())["bootupTimestamp"]
        assert abs(f.uptime_ticks / 100 - (f.ts / 1e9 - boot)) < 1
    if case.parts[-3] not in ("ios", "nxos_ssh"):  # napalm's text facts cases have no `show interface(s)`
        assert {s.port for s in of(records, PortSample)} == set(expected["interface_list"])


def check_lldp_neighbors_detail(expected: dict, records: list, case: Path) -> None:
    got: dict[str, list[LldpNeighbor]] = defaultdict(list)
    for n in of(records, LldpNeighbor):
        got[n.port].append(n)
    assert set(got) == set(expected)
    for port, wants in expected.items():
        assert len(got[port]) == len(wants), port
        for n, want in zip(sorted(got[port], key=lambda n: n.remote_chassis_id or ""),
                           sorted(wants, key=lambda w: mac_or_text(w["remote_chassis_id"])), strict=True):
            assert n.remote_chassis_id == mac_or_text(want["remote_chassis_id"])
            if re.fullmatch("[0-9a-fA-F]{12}", re.sub("[.:-]", "", want["remote_chassis_id"])):  # a MAC
                assert re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", n.remote_chassis_id)
            assert n.remote_name == (want["remote_system_name"] or None)
            # a MAC as port id: we name the port by its description, as lldpd-fed Linux does
            assert n.remote_port in (mac_or_text(want["remote_port"]), want["remote_port_description"])
            assert n.remote_port_desc == (want["remote_port_description"] or None)
            assert n.remote_description == (want["remote_system_description"] or None)


def check_interfaces_ip(expected: dict, records: list, case: Path) -> None:
    want = {(port, a, v["prefix_length"]) for port, body in expected.items()
            for a, v in body.get("ipv4", {}).items()}
    if case.parts[-3] == "nxos":
        # napalm lists an unnumbered interface's borrowed address under it too; we keep each
        # address on the interface that holds it (as IP-MIB does: a traceroute hop is one port)
        doc = json.loads((case / "show_ip_interface.json").read_text())
        rows = [t["ROW_intf"] for t in doc["TABLE_intf"]]
        unnumbered = {r["intf-name"]: r["unnum-intf"] for r in rows if "unnum-intf" in r and "prefix" not in r}
        assert unnumbered == ({"Ethernet1/2": "loopback101"} if case.name in ("normal", "no_ipv6_support") else {})
        held = {port: {(a, p) for q, a, p in want if q == port} for port in unnumbered.values()}
        want -= {(port, a, p) for port, lender in unnumbered.items() for a, p in held[lender]}
    assert {(a.port, a.address, a.prefix_len) for a in of(records, InterfaceAddress)} == want


def check_config(expected: dict, records: list, case: Path) -> None:
    (point,) = [r for r in of(records, GenericPoint) if r.measurement == "device_config"]
    header, _, body = point.fields["text"].partition("\n")
    assert header == "### running-config: show running-config"
    # what changes without a change of configuration is not kept: the command echo, the time
    volatile = re.compile(r"^(! ?(Command|Time|Startup-config last modified|Last configuration change)\b.*"
                          r"|Building configuration\.\.\.)\n", re.M)
    assert body.strip() == volatile.sub("", expected["running"]).strip() != ""


CHECKS = {"test_get_interfaces": check_interfaces, "test_get_interfaces_counters": check_interfaces_counters,
          "test_get_facts": check_facts, "test_get_lldp_neighbors_detail": check_lldp_neighbors_detail,
          "test_get_interfaces_ip": check_interfaces_ip, "test_get_config": check_config}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "/".join(c.parts[-3:]))
def test_napalm_capture_gives_napalms_result(case: Path):
    driver = case.parts[-3]
    answers = case_answers(case)
    records, problems = replay(driver, answers, case)
    # every command the capture answers parsed whole: nothing of it left out
    if driver == "ios" or not answers.get("show interface | json", "{").startswith("{"):
        # read through napalm's getters, the others of which met `% Invalid input`: only this case's
        # getter must be whole
        problems = [p for p in problems if p.what == case.parts[-2].removeprefix("test_")]
    assert [str(p) for p in problems if NOT_RECORDED not in str(p)] == []
    CHECKS[case.parts[-2]](json.loads((case / "expected_result.json").read_text()), records, case)


def test_the_captures_are_all_run():
    assert len(CASES) == 21 + 22 + 19  # `| json` (EOS, NX-OS), IOS, NX-OS text
    assert {c.parts[-3] for c in CASES} == {"eos", "nxos", "nxos_ssh", "ios"}


def test_a_device_without_json_output_is_read_through_napalms_text_getters():
    """NX-OS before 7.0(3) answers `| json` with `% Invalid command at '^' marker.` (napalm's
    nxos_ssh `does_not_support_json` capture, a 7009 on 6.2(14)): the poll goes on with napalm's
    nxos_ssh getters, which parse the text outputs, on the same session."""
    records, _ = replay("nxos_ssh", {"show interface | json": REFUSAL},
                        NAPALM / "nxos_ssh/test_get_interfaces/normal")
    samples = of(records, PortSample)
    assert len(samples) > 10 and all(s.oper_status in ("up", "down") for s in samples)


def test_a_json_platform_answering_without_json_is_a_clear_error():
    """EOS has no text path here: its refusal fails the poll, naming the command and the line."""
    with pytest.raises(CollectorBadResponse) as info:
        replay("eos", {"show interfaces | json": "% Invalid input (at token 2: 'json')"})
    message = str(info.value)
    assert "'show interfaces | json'" in message and "% Invalid input (at token 2: 'json')" in message
    assert "no `| json`" in message


def test_kept_interfaces_without_counters_are_a_good_poll():
    """Only SVIs kept (napalm's nxos `vlan_interface` capture): state, speed and MTU, no counters."""
    answers = case_answers(NAPALM / "nxos/test_get_interfaces/vlan_interface")
    records, problems = replay("nxos", answers)
    samples = of(records, PortSample)
    assert [s.port for s in samples] == ["Vlan120", "Vlan198", "Vlan199"]
    assert [(s.oper_status, s.speed_bps, s.mtu, s.in_octets) for s in samples] == [
        ("up", 10**9, 1500, None), ("down", 10**9, 1500, None), ("down", 10**9, 1500, None)]


@pytest.mark.parametrize("given,kept", [
    ("2c60.0cad.30de", "2c:60:0c:ad:30:de"),  # EOS and NX-OS, dotted
    ("00c.297b.d2a8", "00:0c:29:7b:d2:a8"),  # EOS without a group's leading zeros (napalm's issue903 capture)
    ("1C:E7:10:03:54:13", "1c:e7:10:03:54:13"),  # napalm's own form
    ("08-00-27-B3-FC-E1", "08:00:27:b3:fc:e1"),
    ("08:00:27:b3:fc:e1", "08:00:27:b3:fc:e1"),  # lldpd, and SNMP's octets (below)
    ("spine1.fabric", "spine1.fabric"), ("10.1.100.1", "10.1.100.1"), ("4.15.5", "4.15.5"),  # not MACs: as given
    ("Ethernet1/1", "Ethernet1/1"), ("08:00:27-b3:fc:e1", "08:00:27-b3:fc:e1"),
])
def test_chassis_ids_in_one_form(given: str, kept: str):
    assert mac_or_text(given) == kept
    assert mac_octets(bytes.fromhex("080027b3fce1")) == "08:00:27:b3:fc:e1"
