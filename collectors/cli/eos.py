"""The `arista_eos` platform of the CLI collector: EOS commands with `| json` and their parsers.

EOS prints any show command as JSON with `| json`: the same model its eAPI returns (the field names
below are those of EOS's `show interfaces`, `show ip interface`, `show lldp neighbors detail` and
`show version` JSON models). Counters are 64-bit; `bandwidth` is the speed in bit/s.

What was exercised: the parsers against outputs in EOS's documented JSON shapes (tests/fixtures/eos/,
written after captured EOS 4.x outputs); no EOS device ran here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from collectors.cli.linux import Bad, _json, _reason, config_text  # noqa: F401 (config_text: the platform's)
from collectors.lldp_id import mac_or_text
from nms.records import U64_MAX, DeviceFacts, InterfaceAddress, LldpNeighbor, OperStatus, PortSample

PREAMBLE = ""  # EOS's CLI takes the command as it is
LINKS = "show interfaces | json"
SPEEDS = None  # `bandwidth` of LINKS (cli.py reads no speeds and no chassis when these are None)
FACTS = "show version | json"
HOSTNAME = "show hostname | json"  # the facts' sys_name (show version has none), as napalm's get_facts reads it
ADDRESSES = "show ip interface | json"
LLDP_NEIGHBORS = "show lldp neighbors detail | json"
LLDP_CHASSIS = None  # EOS's LLDP chassis id is its system MAC (in FACTS)
CONFIG_SECTIONS: tuple[tuple[str, str, str, bool, str | None], ...] = (
    ("running-config", "show running-config", "show running-config", True, "eos"),
)
# the running configuration's header lines that change without a change of configuration
VOLATILE = (re.compile(r"^! (Command|Time|Startup-config last modified)\b.*\n", re.M), "")

OPER: dict[str, OperStatus] = {"up": "up", "down": "down", "notPresent": "notPresent",
                               "lowerLayerDown": "lowerLayerDown", "dormant": "dormant", "testing": "testing"}
COUNTERS = {"inOctets": "in_octets", "outOctets": "out_octets", "totalInErrors": "in_errors",
            "totalOutErrors": "out_errors", "inDiscards": "in_discards", "outDiscards": "out_discards"}
PACKETS = {"in_pkts": ("inUcastPkts", "inMulticastPkts", "inBroadcastPkts"),
           "out_pkts": ("outUcastPkts", "outMulticastPkts", "outBroadcastPkts")}
PORT_ID_IS_NAME = ("interfaceName", "local")  # LLDP port id subtypes that name the port


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX else None


def _interfaces(text: str) -> dict[str, Any]:
    doc = _json(text)
    interfaces = doc.get("interfaces") if isinstance(doc, dict) else None
    if not isinstance(interfaces, dict):
        raise Bad("no 'interfaces' object")
    return interfaces


def port_samples(device: str, text: str, ts: int, speed_bps: dict[str, int], keep: Callable[[str], bool],
                 notes: list[str]) -> tuple[list[PortSample], int]:
    """`show interfaces | json` -> a PortSample per kept interface, and how many the device has."""
    interfaces = _interfaces(text)
    samples = []
    for name, body in interfaces.items():
        if not keep(name):
            continue
        if not isinstance(body, dict):
            notes.append(f"{name}: not an object")
            continue
        # EOS leaves `interfaceCounters` out of interfaces without counters (Loopback, Vlan,
        # subinterfaces): their sample has the state, speed and MTU only
        counters = body.get("interfaceCounters")
        values: dict[str, Any] = {}
        if isinstance(counters, dict):
            values = {f: v for k, f in COUNTERS.items() if (v := _count(counters.get(k))) is not None}
            for field, keys in PACKETS.items():
                parts = [_count(counters.get(k)) for k in keys]
                if parts[0] is not None:
                    values[field] = sum(p for p in parts if p is not None) & U64_MAX
        speed, mtu = _count(body.get("bandwidth")), body.get("mtu")
        try:
            samples.append(PortSample(
                device=device, port=name[:128], ts=ts, oper_status=OPER.get(body.get("lineProtocolStatus"), "unknown"),
                speed_bps=speed or None,  # 0: EOS does not know (a port without a transceiver)
                mtu=mtu if _count(mtu) is not None and mtu <= 1 << 20 else None, **values))
        except ValueError as e:
            notes.append(f"{name!r}: {_reason(e)}")
    if interfaces and not samples and notes:
        raise Bad(f"none of its {len(interfaces)} interfaces is usable: {notes[0]}")
    return samples, len(interfaces)


def facts(device: str, text: str, ts: int, interfaces: int, chassis_id: str | None) -> DeviceFacts:
    """`show version | json` -> DeviceFacts: model and version as the description, uptime from the
    boot time, the system MAC as the LLDP chassis id."""
    doc = _json(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), str):
        raise Bad("no 'version' in show version")
    descr = " ".join(str(doc[k]) for k in ("modelName", "version") if doc.get(k))
    boot = doc.get("bootupTimestamp")
    uptime = round((ts / 1e9 - boot) * 100) if isinstance(boot, (int, float)) and not isinstance(boot, bool) else None
    mac = doc.get("systemMacAddress")
    return DeviceFacts(device=device, ts=ts, sys_descr=f"Arista {descr}"[:1024],
                       uptime_ticks=uptime if uptime is not None and uptime >= 0 else None, interfaces=interfaces,
                       lldp_chassis_id=chassis_id or (mac_or_text(mac) if isinstance(mac, str) and mac else None))


def hostname(text: str) -> str | None:
    """`show hostname | json` -> the host name (`hostname`; `fqdn` is the name with its domain)."""
    doc = _json(text)
    name = doc.get("hostname") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise Bad("no 'hostname' in show hostname")
    return name[:255] or None


def addresses(device: str, text: str, ts: int, keep: Callable[[str], bool],
              notes: list[str]) -> list[InterfaceAddress]:
    """`show ip interface | json` -> InterfaceAddress per primary and secondary IPv4 address."""
    found = []
    for name, body in _interfaces(text).items():
        if not keep(name) or not isinstance(body, dict):
            continue
        blocks = body.get("interfaceAddress")
        for block in blocks if isinstance(blocks, list) else [blocks]:
            if not isinstance(block, dict):
                continue
            for ip in [block.get("primaryIp"), *(block.get("secondaryIpsOrderedList") or [])]:
                if not isinstance(ip, dict) or ip.get("address") in (None, "0.0.0.0"):
                    continue
                try:
                    plen = ip.get("maskLen")
                    if not isinstance(plen, int) or isinstance(plen, bool) or not 0 <= plen <= 32:
                        raise ValueError(f"maskLen {plen!r} is not 0..32")
                    found.append(InterfaceAddress(device=device, port=name[:128], ts=ts, prefix_len=plen,
                                                  address=str(ipaddress.IPv4Address(ip["address"]))))
                except ValueError as e:
                    notes.append(f"{name!r} {ip.get('address')!r}: {_reason(e)}")
    return found


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def neighbors(device: str, text: str, ts: int, keep: Callable[[str], bool], notes: list[str]) -> list[LldpNeighbor]:
    """`show lldp neighbors detail | json` -> an LldpNeighbor per (local port, neighbour)."""
    doc = _json(text)
    ports = doc.get("lldpNeighbors") if isinstance(doc, dict) else None
    if not isinstance(ports, dict):
        raise Bad("no 'lldpNeighbors' object")
    out = []
    for port, body in ports.items():
        if not keep(port):
            continue
        for info in (body.get("lldpNeighborInfo") or []) if isinstance(body, dict) else []:
            if not isinstance(info, dict):
                continue
            iface = info.get("neighborInterfaceInfo") if isinstance(info.get("neighborInterfaceInfo"), dict) else {}
            # EOS quotes an interface name as port id: "\"Ethernet3/1\""
            port_id = _text(mac_or_text(str(iface.get("interfaceId") or "").strip('"')), 255)
            port_desc = _text(iface.get("interfaceDescription"), 255)
            if iface.get("interfaceIdType") not in PORT_ID_IS_NAME and port_desc:
                remote_port = port_desc  # a MAC as port id: the description names the port
            else:
                remote_port = port_id
            name = _text(info.get("systemName"), 255)
            chassis = _text(mac_or_text(str(info.get("chassisId") or "")), 255)
            if not (name or remote_port or chassis):
                notes.append(f"{port}: a neighbour without name, port or chassis id")
                continue
            try:
                out.append(LldpNeighbor(device=device, port=port[:128], ts=ts, remote_name=name,
                                        remote_port=remote_port, remote_port_desc=port_desc, remote_chassis_id=chassis,
                                        remote_description=_text(info.get("systemDescription"), 1024)))
            except ValueError as e:
                notes.append(f"{port!r}: {_reason(e)}")
    return out


def normalize(text: str, kind: str | None) -> str:
    pattern, replacement = VOLATILE
    return pattern.sub(replacement, text) if kind == "eos" else text
