"""Platforms of the CLI collector read through napalm's getters: `cisco_ios` (napalm's `ios` driver),
and `cisco_nxos` on a device that refuses `| json` (NX-OS before 7.0(3): napalm's `nxos_ssh`, which
parses the text outputs).

The login stays the collector's (collectors/cli/transport.py: netmiko, the host key checked against
known_hosts, the session closed at the poll's deadline). napalm's driver is handed that logged-in
netmiko connection, as napalm's own tests hand it a test double, and its getters run their
commands on it (netmiko's interactive shell, as under napalm's `open()`); the driver's `open()` and
`close()` are not called, so napalm never logs in by itself nor touches the configuration.

Getters -> records (these functions; collectors/cli/collector.py runs them and notes what fails):
get_interfaces and get_interfaces_counters -> PortSample (napalm's speed is in Mbit/s, its
unknown counters -1), get_facts -> DeviceFacts, get_lldp_neighbors_detail -> LldpNeighbor,
get_interfaces_ip -> InterfaceAddress (IPv4), get_config(retrieve="running") -> the snapshot.
napalm has no getter for egress queues: none are read on these platforms.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from collectors.cli.linux import _reason
from collectors.lldp_id import mac_or_text
from nms.records import U64_MAX, DeviceFacts, InterfaceAddress, LldpNeighbor, PortSample

DRIVERS = {"cisco_ios": "ios"}  # CliSettings.platform (netmiko's device type) -> napalm driver
TEXT_DRIVERS = {"cisco_nxos": "nxos_ssh"}  # ... for a device of a `| json` platform that refuses `| json`
VENDOR = {"ios": "Cisco IOS", "nxos_ssh": "Cisco NX-OS"}
COUNTERS = {"rx_octets": "in_octets", "tx_octets": "out_octets", "rx_errors": "in_errors",
            "tx_errors": "out_errors", "rx_discards": "in_discards", "tx_discards": "out_discards"}
PACKETS = {"in_pkts": "rx", "out_pkts": "tx"}
# running-configuration lines that change without a change of configuration
VOLATILE = {"ios": re.compile(r"^(Building configuration\.\.\.|! (Last configuration change|NVRAM config last "
                              r"updated|No configuration change since last restart)\b.*)\n", re.M),
            "nxos_ssh": re.compile(r"^!(Command|Running configuration last done at|Time):.*\n", re.M)}


def driver(name: str, conn: Any, device: str, timeout: float) -> Any:
    """napalm's driver `name`, on the logged-in netmiko connection `conn`."""
    from napalm import get_network_driver  # imported here: napalm is large, and linux polls never need it

    d = get_network_driver(name)(hostname=device, username="", password="", timeout=int(timeout))
    d.device = conn
    return d


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX else None


def port_samples(device: str, ts: int, interfaces: dict[str, Any], counters: dict[str, Any] | None,
                 keep: Callable[[str], bool], notes: list[str]) -> list[PortSample]:
    """get_interfaces (+ get_interfaces_counters, when read) -> a PortSample per kept interface."""
    samples = []
    for name, body in interfaces.items():
        if not keep(name) or not isinstance(body, dict):
            continue
        c = (counters or {}).get(name) or {}
        values: dict[str, Any] = {f: v for k, f in COUNTERS.items() if (v := _count(c.get(k))) is not None}
        for field, side in PACKETS.items():
            parts = [_count(c.get(f"{side}_{kind}_packets")) for kind in ("unicast", "multicast", "broadcast")]
            if parts[0] is not None:
                values[field] = sum(p for p in parts if p is not None) & U64_MAX
        speed, mtu = body.get("speed"), _count(body.get("mtu"))
        try:
            samples.append(PortSample(
                device=device, port=name[:128], ts=ts, oper_status="up" if body.get("is_up") else "down",
                speed_bps=round(speed * 10**6) if isinstance(speed, (int, float)) and speed > 0 else None,
                mtu=mtu if mtu is not None and mtu <= 1 << 20 else None, **values))
        except ValueError as e:
            notes.append(f"{name!r}: {_reason(e)}")
    return samples


def facts(device: str, ts: int, got: dict[str, Any], driver_name: str) -> DeviceFacts:
    """get_facts -> DeviceFacts (napalm's uptime is in seconds, -1 when unknown)."""
    uptime = got.get("uptime")
    model, version = got.get("model") or "", got.get("os_version") or ""
    names = got.get("interface_list")
    return DeviceFacts(
        device=device, ts=ts, sys_name=(got.get("hostname") or None) and str(got["hostname"])[:255],
        sys_descr=" ".join(p for p in (VENDOR[driver_name], model, version) if p)[:1024],
        uptime_ticks=round(uptime * 100) if isinstance(uptime, (int, float)) and uptime >= 0 else None,
        interfaces=len(names) if isinstance(names, list) else None)


def neighbors(device: str, ts: int, got: dict[str, Any], keep: Callable[[str], bool],
              notes: list[str]) -> list[LldpNeighbor]:
    """get_lldp_neighbors_detail -> an LldpNeighbor per (local port, neighbour)."""
    out = []
    for port, found in got.items():
        if not keep(port):
            continue
        for n in found if isinstance(found, list) else []:
            port_id, desc = _text(n.get("remote_port"), 255), _text(n.get("remote_port_description"), 255)
            if port_id and mac_or_text(port_id) != port_id and desc:
                port_id = desc  # a MAC as port id: the description names the port (as on the other platforms)
            chassis = _text(mac_or_text(str(n.get("remote_chassis_id") or "")), 255)
            name = _text(n.get("remote_system_name"), 255)
            if not (name or port_id or chassis):
                notes.append(f"{port}: a neighbour without name, port or chassis id")
                continue
            try:
                out.append(LldpNeighbor(device=device, port=port[:128], ts=ts, remote_name=name,
                                        remote_port=port_id and mac_or_text(port_id), remote_port_desc=desc,
                                        remote_chassis_id=chassis,
                                        remote_description=_text(n.get("remote_system_description"), 1024)))
            except ValueError as e:
                notes.append(f"{port!r}: {_reason(e)}")
    return out


def addresses(device: str, ts: int, got: dict[str, Any], keep: Callable[[str], bool],
              notes: list[str]) -> list[InterfaceAddress]:
    """get_interfaces_ip -> InterfaceAddress per IPv4 address."""
    found = []
    for port, families in got.items():
        if not keep(port) or not isinstance(families, dict):
            continue
        for address, body in (families.get("ipv4") or {}).items():
            plen = body.get("prefix_length") if isinstance(body, dict) else None
            try:
                if not isinstance(plen, int) or not 0 <= plen <= 32:
                    raise ValueError(f"prefix_length {plen!r} is not 0..32")
                found.append(InterfaceAddress(device=device, port=port[:128], ts=ts, prefix_len=plen,
                                              address=str(ipaddress.IPv4Address(address))))
            except ValueError as e:
                notes.append(f"{port!r} {address!r}: {_reason(e)}")
    return found


def normalize(text: str, driver_name: str) -> str:
    """The running configuration without its VOLATILE lines."""
    return VOLATILE[driver_name].sub("", text)


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None
