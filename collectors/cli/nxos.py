"""The `cisco_nxos` platform of the CLI collector: NX-OS commands with `| json` and their parsers.

NX-OS prints show commands as JSON with `| json`, the model NX-API returns: tables as
`TABLE_x: {ROW_x: [...]}` (one row comes as an object, not a list), numbers sometimes as strings.
`show interface`: counters `eth_inbytes`... (64-bit), `eth_bw` in kbit/s, `state`; `show lldp
neighbors detail`: `l_port_id` (short names: Eth1/1), `sys_name`, `port_id`, `chassis_id`.

What was exercised: the parsers against outputs in these documented shapes (tests/fixtures/nxos/);
no NX-OS device ran here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from collectors.cli.linux import Bad, _json, _reason, config_text  # noqa: F401 (config_text: the platform's)
from collectors.lldp_id import mac_or_text
from nms.records import U64_MAX, DeviceFacts, InterfaceAddress, LldpNeighbor, OperStatus, PortSample

PREAMBLE = ""
LINKS = "show interface | json"
SPEEDS = None  # `eth_bw` of LINKS
FACTS = "show version | json"
ADDRESSES = "show ip interface vrf all | json"
LLDP_NEIGHBORS = "show lldp neighbors detail | json"
LLDP_CHASSIS = None
CONFIG_SECTIONS: tuple[tuple[str, str, str, bool, str | None], ...] = (
    ("running-config", "show running-config", "show running-config", True, "nxos"),
)
VOLATILE = (re.compile(r"^!(Command|Running configuration last done at|Time):.*\n", re.M), "")

OPER: dict[str, OperStatus] = {"up": "up", "down": "down"}
COUNTERS = {"eth_inbytes": "in_octets", "eth_outbytes": "out_octets", "eth_inpkts": "in_pkts",
            "eth_outpkts": "out_pkts", "eth_inerr": "in_errors", "eth_outerr": "out_errors",
            "eth_indiscard": "in_discards", "eth_outdiscard": "out_discards"}
# mgmt0 counts in the supervisor's own (VDC-level) counters, without errors or discards
MGMT_COUNTERS = {"vdc_lvl_in_bytes": "in_octets", "vdc_lvl_out_bytes": "out_octets", "vdc_lvl_in_pkts": "in_pkts",
                 "vdc_lvl_out_pkts": "out_pkts"}
SHORT_NAMES = {"Eth": "Ethernet", "Po": "port-channel", "Lo": "loopback", "mgmt": "mgmt"}


def _count(value: Any) -> int | None:
    """A counter as NX-OS gives it: an int, or a string of digits."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX else None


def rows(doc: Any, table: str) -> list[dict]:
    """`TABLE_<table>.ROW_<table>` as a list of rows. NX-OS gives a single row as an object, and
    some tables as a list of such objects (`show ip interface`: one per VRF,
    `"TABLE_intf": [{"ROW_intf": {...}}, ...]`)."""
    body = doc.get(f"TABLE_{table}") if isinstance(doc, dict) else None
    if body is None:
        return []
    parts = body if isinstance(body, list) else [body]
    if not all(isinstance(part, dict) for part in parts):
        raise Bad(f"TABLE_{table} is neither an object nor a list of objects")
    found: list[dict] = []
    for part in parts:
        got = part.get(f"ROW_{table}", [])
        found += [r for r in (got if isinstance(got, list) else [got]) if isinstance(r, dict)]
    return found


def long_name(name: str) -> str:
    """`Eth1/1` (LLDP's local port) -> `Ethernet1/1` (the interface's name in `show interface`)."""
    m = re.fullmatch(r"([A-Za-z-]+?)(\d.*)", name)
    return SHORT_NAMES.get(m.group(1), m.group(1)) + m.group(2) if m else name


def port_samples(device: str, text: str, ts: int, speed_bps: dict[str, int], keep: Callable[[str], bool],
                 notes: list[str]) -> tuple[list[PortSample], int]:
    """`show interface | json` -> a PortSample per kept interface, and how many the device has."""
    doc = _json(text)
    if not isinstance(doc, dict) or "TABLE_interface" not in doc:
        raise Bad("no TABLE_interface")
    table = rows(doc, "interface")
    samples = []
    for i, row in enumerate(table):
        name = row.get("interface")
        if not isinstance(name, str) or not name:
            notes.append(f"row {i}: no 'interface'")
            continue
        if not keep(name):
            continue
        # loopbacks, VLAN interfaces (SVIs), some down ports: no counters; their sample has the
        # state, speed and MTU only
        values = {f: v for k, f in {**COUNTERS, **MGMT_COUNTERS}.items() if (v := _count(row.get(k))) is not None}
        kbps, mtu = _count(_either(row, "bw")), _count(_either(row, "mtu"))
        state = row.get("state", row.get("svi_line_proto"))
        try:
            samples.append(PortSample(
                device=device, port=name[:128], ts=ts, oper_status=OPER.get(state, "unknown"),
                speed_bps=kbps * 1000 if kbps else None, mtu=mtu if mtu is not None and mtu <= 1 << 20 else None,
                **values))
        except ValueError as e:
            notes.append(f"{name!r}: {_reason(e)}")
    if table and not samples and notes:
        raise Bad(f"none of its {len(table)} interfaces is usable: {notes[0]}")
    return samples, len(table)


def _either(row: dict, field: str) -> Any:
    """`eth_<field>`, or an SVI's `svi_<field>`."""
    return row.get(f"eth_{field}", row.get(f"svi_{field}"))


def facts(device: str, text: str, ts: int, interfaces: int, chassis_id: str | None) -> DeviceFacts:
    """`show version | json` -> DeviceFacts: host name, chassis and NX-OS version, kernel uptime."""
    doc = _json(text)
    version = next((doc[k] for k in ("nxos_ver_str", "sys_ver_str", "kickstart_ver_str")
                    if isinstance(doc, dict) and isinstance(doc.get(k), str)), None)
    if version is None:
        raise Bad("no NX-OS version in show version")
    parts = [_count(doc.get(f"kern_uptm_{u}")) for u in ("days", "hrs", "mins", "secs")]
    uptime = None
    if all(p is not None for p in parts):
        d, h, m, s = parts
        uptime = (((d * 24 + h) * 60 + m) * 60 + s) * 100
    name = doc.get("host_name")
    chassis = doc.get("chassis_id")
    return DeviceFacts(device=device, ts=ts, sys_name=name[:255] if isinstance(name, str) and name else None,
                       sys_descr=f"Cisco {chassis + ' ' if isinstance(chassis, str) else ''}NX-OS {version}"[:1024],
                       uptime_ticks=uptime, interfaces=interfaces, lldp_chassis_id=chassis_id)


def addresses(device: str, text: str, ts: int, keep: Callable[[str], bool],
              notes: list[str]) -> list[InterfaceAddress]:
    """`show ip interface vrf all | json` -> InterfaceAddress per IPv4 address: the primary (`prefix`,
    `masklen`) and the secondaries (`TABLE_secondary_address`: `prefix1`, `masklen1`). An unnumbered
    interface (`unnum-intf`) gets none: its address is held by the interface it names (as IP-MIB
    has it; napalm's get_interfaces_ip lists it under both)."""
    found = []
    for row in rows(_json(text), "intf"):
        name = row.get("intf-name")
        if not isinstance(name, str) or not keep(name):
            continue
        pairs = [(row.get("prefix"), row.get("masklen"))]
        pairs += [(r.get("prefix1"), r.get("masklen1")) for r in rows(row, "secondary_address")]
        for address, masklen in pairs:
            if address is None:
                continue
            plen = _count(masklen)
            try:
                if plen is None or plen > 32:
                    raise ValueError(f"masklen {masklen!r} is not 0..32")
                found.append(InterfaceAddress(device=device, port=name[:128], ts=ts, prefix_len=plen,
                                              address=str(ipaddress.IPv4Address(address))))
            except ValueError as e:
                notes.append(f"{name!r} {address!r}: {_reason(e)}")
    return found


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value and value != "null" else None


def _mac(value: Any) -> Any:
    return mac_or_text(value) if isinstance(value, str) else value


def neighbors(device: str, text: str, ts: int, keep: Callable[[str], bool], notes: list[str]) -> list[LldpNeighbor]:
    """`show lldp neighbors detail | json` -> an LldpNeighbor per row."""
    doc = _json(text)
    if not isinstance(doc, dict):
        raise Bad("not a JSON object")
    out = []
    for i, row in enumerate(rows(doc, "nbor_detail")):
        local = row.get("l_port_id")
        if not isinstance(local, str) or not local:
            notes.append(f"row {i}: no 'l_port_id'")
            continue
        port = long_name(local)
        if not keep(port):
            continue
        name, remote_port = _text(row.get("sys_name"), 255), _text(_mac(row.get("port_id")), 255)
        chassis = _text(_mac(row.get("chassis_id")), 255)
        if not (name or remote_port or chassis):
            notes.append(f"{port}: a neighbour without name, port or chassis id")
            continue
        try:
            out.append(LldpNeighbor(device=device, port=port[:128], ts=ts, remote_name=name, remote_port=remote_port,
                                    remote_port_desc=_text(row.get("port_desc"), 255), remote_chassis_id=chassis,
                                    remote_description=_text(row.get("sys_desc"), 1024)))
        except ValueError as e:
            notes.append(f"{port!r}: {_reason(e)}")
    return out


def normalize(text: str, kind: str | None) -> str:
    pattern, replacement = VOLATILE
    return pattern.sub(replacement, text) if kind == "nxos" else text
