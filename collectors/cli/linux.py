"""The `linux` platform of the CLI collector: what to run on a Linux switch (Cumulus Linux, a SONiC
host, a namespace of our lab) and how its output becomes records.

Every command's output is JSON where the tool has it (iproute2 `-j`, lldpd's `-f json`), plain
sysfs/procfs text otherwise, so no screen-scraping parser is needed. A parser raises `Bad` with
what is wrong; the collector turns it into a CollectorBadResponse naming the command. Items of an
answer that lack what is needed are left out and noted (`notes`); the rest is kept.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any

from collectors.lldp_id import mac_or_text
from nms import qdisc
from nms.records import U64_MAX, DeviceFacts, InterfaceAddress, LldpNeighbor, OperStatus, PortSample, QueueSample

# before every command: the admin tools' directories (a non-root login's PATH lacks them on Debian)
# and the C locale (untranslated messages)
PREAMBLE = 'export PATH="$PATH:/usr/sbin:/sbin" LC_ALL=C; '
LINKS = "ip -s -s -j link show"
SPEEDS = "grep -s -H . /sys/class/net/*/speed"  # unreadable ones (lo, down ports) are left out
FACTS = "cat /proc/sys/kernel/hostname; uname -a; cat /proc/uptime"  # = hostname; uname -a; uptime
ADDRESSES = "ip -4 -j address show"
LLDP_NEIGHBORS = "lldpctl -f json"
LLDP_CHASSIS = "lldpcli -f json show chassis"
QDISCS = "tc -s -j qdisc show"  # egress queues (nms/qdisc.py); read-only, no root needed
# widths of the counters that are not 64-bit: a qdisc's drops and ECN marks (PollResult.counter_bits)
COUNTER_BITS = dict(qdisc.COUNTER_BITS)

# The running configuration of a Linux switch: (name, what it is, command, required, state to
# remove), each printed under a header. `required` sections must succeed for a snapshot to be
# taken; the others are read when present (empty output: left out), and a failure there (nft when
# not root) is written into the snapshot in place of their output.
CONFIG_SECTIONS: tuple[tuple[str, str, str, bool, str | None], ...] = (
    ("addresses", "ip -d address show", "ip -d address show", True, "ip"),
    ("routes", "ip -4 route show table all", "ip -4 route show table all", True, "ip"),
    ("routes6", "ip -6 route show table all", "ip -6 route show table all", True, "ip"),
    ("rules", "ip -4 rule show", "ip -4 rule show", True, "ip"),
    ("rules6", "ip -6 rule show", "ip -6 rule show", True, "ip"),
    ("nftables", "nft list ruleset", "if command -v nft >/dev/null 2>&1; then nft list ruleset; fi", False, "nft"),
    ("frr", "/etc/frr/frr.conf", "if [ -e /etc/frr/frr.conf ]; then cat /etc/frr/frr.conf; fi", False, None),
    ("interfaces", "/etc/network/interfaces",
     "if [ -e /etc/network/interfaces ]; then cat /etc/network/interfaces; fi", False, None),
)
# State, not configuration, that these commands print: removed so that a snapshot's hash changes
# only when the configuration does. iproute2: an address's remaining lifetime and DAD flags,
# carrier flags, oper and STP port state, tcpdump's promiscuity, bridge timers, a route's expiry
# and linkdown/dead flags; nftables: rule counters and dynamic set elements' expiry.
VOLATILE: dict[str, tuple[tuple[re.Pattern, str], ...]] = {
    "ip": (
        (re.compile(r"^\s+valid_lft \S+ preferred_lft \S+\s*\n", re.M), ""),
        (re.compile(r"\b(LOWER_UP|NO-CARRIER|M-DOWN),|,?\b(LOWER_UP|NO-CARRIER|M-DOWN)\b"), ""),
        (re.compile(r" state \S+"), ""),
        (re.compile(r" (promiscuity|allmulti) \d+"), ""),
        (re.compile(r" \w+_timer\s+[\d.]+"), ""),
        (re.compile(r" expires \S+"), ""),
        (re.compile(r" linkdown\b"), ""),
        (re.compile(r" dead\b"), ""),
        (re.compile(r" (tentative|dadfailed|optimistic)\b"), ""),
    ),
    "nft": (
        (re.compile(r"\bcounter packets \d+ bytes \d+"), "counter"),
        (re.compile(r" expires \S+"), ""),
    ),
}

# Linux operstate (RFC 2863 names, upper case) -> OperStatus
OPER = {"UP": "up", "DOWN": "down", "LOWERLAYERDOWN": "lowerLayerDown", "NOTPRESENT": "notPresent",
        "TESTING": "testing", "DORMANT": "dormant", "UNKNOWN": "unknown"}
# ip -s -s -j link: stats64.<rx|tx>.<key> -> PortSample field
COUNTERS = {("rx", "bytes"): "in_octets", ("tx", "bytes"): "out_octets", ("rx", "packets"): "in_pkts",
            ("tx", "packets"): "out_pkts", ("rx", "errors"): "in_errors", ("tx", "errors"): "out_errors",
            ("rx", "dropped"): "in_discards", ("tx", "dropped"): "out_discards"}
PORT_ID_IS_NAME = ("ifname", "local")  # lldpd's port id subtypes that name the port (LLDP-MIB 5 and 7)


class Bad(ValueError):
    """Output that cannot be used at all."""


def _reason(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
    return str(error)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        if refusal_line := refusal(text):
            raise Bad(f"the device refused the command: {refusal_line!r} (no `| json` for it on this "
                      "device)") from None
        raise Bad(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def refusal(text: str) -> str | None:
    """A switch CLI's error line (`% Invalid command at '^' marker.`, `% Invalid input ...`), if any."""
    return next((line.strip()[:200] for line in text.splitlines() if line.strip().startswith("%")), None)


def oper_status(link: dict[str, Any]) -> OperStatus:
    """The kernel's operstate; UNKNOWN (lo, tun and other drivers that do not report one) counts as
    up when the interface is administratively up with a carrier (flags UP and LOWER_UP)."""
    state = OPER.get(str(link.get("operstate", "UNKNOWN")).upper(), "unknown")
    flags = link.get("flags") or []
    if state == "unknown" and "UP" in flags and "LOWER_UP" in flags:
        return "up"
    return state  # type: ignore[return-value]


def speeds(text: str) -> dict[str, int]:
    """`grep -H . /sys/class/net/*/speed` -> interface -> bits/s (Mb/s in sysfs; -1 and 0: unknown)."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"/sys/class/net/([^/]+)/speed:(-?\d+)", line.strip())
        if m and 0 < int(m.group(2)) <= U64_MAX // 1_000_000:
            out[m.group(1)] = int(m.group(2)) * 1_000_000
    return out


def port_samples(device: str, text: str, ts: int, speed_bps: dict[str, int], keep: Callable[[str], bool],
                 notes: list[str]) -> tuple[list[PortSample], int]:
    """`ip -s -s -j link show` -> a PortSample per kept interface (64-bit counters), and how many
    interfaces the device has."""
    links = _json(text)
    if not isinstance(links, list):
        raise Bad(f"expected a JSON list of interfaces, got {type(links).__name__}")
    samples = []
    for i, link in enumerate(links):
        name = link.get("ifname") if isinstance(link, dict) else None
        if not isinstance(name, str) or not name:
            notes.append(f"item {i}: no 'ifname'")
            continue
        if not keep(name):
            continue
        stats = link.get("stats64") or link.get("stats")
        if not isinstance(stats, dict):
            notes.append(f"{name}: no 'stats64' (run with -s)")
            continue
        values: dict[str, Any] = {}
        for (direction, key), field in COUNTERS.items():
            value = (stats.get(direction) or {}).get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX:
                values[field] = value
        mtu = link.get("mtu")
        try:
            samples.append(PortSample(
                device=device, port=name[:128], ts=ts, oper_status=oper_status(link), speed_bps=speed_bps.get(name),
                mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) and 0 <= mtu <= 1 << 20 else None,
                **values))
        except ValueError as e:  # a name the records cannot carry
            notes.append(f"{name!r}: {_reason(e)}")
    if links and not samples and notes:
        raise Bad(f"none of its {len(links)} interfaces is usable: {notes[0]}")
    return samples, len(links)


def queue_samples(device: str, text: str, ts: int, keep: Callable[[str], bool], notes: list[str]) -> list[QueueSample]:
    """`tc -s -j qdisc show` -> a QueueSample per egress queue (leaf qdisc) of a kept interface:
    transmitted packets/octets, drops, ECN marks where the qdisc counts them (nms/qdisc.py)."""
    try:
        return qdisc.queue_samples(device, text, ts, keep, notes)
    except qdisc.QdiscError as e:
        raise Bad(str(e)) from None


def facts(device: str, text: str, ts: int, interfaces: int, chassis_id: str | None) -> DeviceFacts:
    """hostname, `uname -a`, /proc/uptime (seconds) -> DeviceFacts (uptime in 1/100 s, like sysUpTime)."""
    lines = text.splitlines()
    if len(lines) < 3:
        raise Bad(f"expected 3 lines (hostname, uname -a, /proc/uptime), got {len(lines)}")
    try:
        uptime = round(float(lines[2].split()[0]) * 100)
    except (ValueError, IndexError):
        raise Bad(f"/proc/uptime: {lines[2][:80]!r} is not seconds") from None
    return DeviceFacts(device=device, ts=ts, sys_name=lines[0].strip()[:255] or None,
                       sys_descr=lines[1].strip()[:1024] or None, uptime_ticks=uptime if uptime >= 0 else None,
                       interfaces=interfaces, lldp_chassis_id=chassis_id[:255] if chassis_id else None)


def addresses(device: str, text: str, ts: int, keep: Callable[[str], bool],
              notes: list[str]) -> list[InterfaceAddress]:
    """`ip -4 -j address show` -> InterfaceAddress per IPv4 address of a kept interface."""
    items = _json(text)
    if not isinstance(items, list):
        raise Bad(f"expected a JSON list of interfaces, got {type(items).__name__}")
    found = []
    for link in items:
        name = link.get("ifname") if isinstance(link, dict) else None
        if not isinstance(name, str) or not keep(name):
            continue
        for a in link.get("addr_info") or []:
            if not isinstance(a, dict) or a.get("family") != "inet":
                continue
            local, plen = a.get("local"), a.get("prefixlen")
            try:
                if not isinstance(plen, int) or isinstance(plen, bool) or not 0 <= plen <= 32:
                    raise ValueError(f"prefixlen {plen!r} is not 0..32")
                found.append(InterfaceAddress(device=device, port=name[:128], ts=ts,
                                              address=str(ipaddress.IPv4Address(local)), prefix_len=plen))
            except ValueError as e:
                notes.append(f"{name!r} {local!r}: {_reason(e)}")
    return found


def _named(value: Any) -> list[tuple[str | None, dict]]:
    """lldpctl's JSON: one item is {name: {...}}, several are [{name: {...}}, ...]; a chassis
    without a name is its body ({"id": ...}) directly."""
    items = value if isinstance(value, list) else [value]
    out: list[tuple[str | None, dict]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "id" in item:
            out.append((None, item))
        else:
            out += [(k, v) for k, v in item.items() if isinstance(v, dict)]
    return out


def _id(body: dict) -> tuple[str | None, str | None]:
    ident = body.get("id")
    if isinstance(ident, dict):
        return ident.get("type"), ident.get("value")
    return None, None


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _id_text(value: Any) -> str | None:
    """An LLDP chassis or port id: a MAC in the one form of collectors/lldp_id.py, other ids as given."""
    return _text(mac_or_text(value), 255) if isinstance(value, str) else None


def neighbors(device: str, text: str, ts: int, keep: Callable[[str], bool], notes: list[str]) -> list[LldpNeighbor]:
    """`lldpctl -f json` -> an LldpNeighbor per (local port, neighbour)."""
    doc = _json(text)
    lldp = doc.get("lldp") if isinstance(doc, dict) else None
    if lldp is None or not isinstance(lldp, (dict, list)):
        raise Bad("no 'lldp' object")
    out = []
    for port, body in _named(lldp.get("interface", []) if isinstance(lldp, dict) else []):
        if port is None:
            notes.append("an interface without a name")
            continue
        if not keep(port):
            continue
        chassis = _named(body.get("chassis", {}))
        name, chassis_body = chassis[0] if chassis else (None, {})
        _, chassis_id = _id(chassis_body)
        port_body = body.get("port") if isinstance(body.get("port"), dict) else {}
        port_type, port_id = _id(port_body)
        port_desc = _text(port_body.get("descr"), 255)
        remote_port = port_id if port_type in PORT_ID_IS_NAME else (port_desc or port_id)
        if not (name or remote_port or chassis_id):
            notes.append(f"{port}: a neighbour without name, port or chassis id")
            continue
        try:
            out.append(LldpNeighbor(
                device=device, port=port[:128], ts=ts, remote_name=_text(name, 255),
                remote_port=_id_text(remote_port), remote_port_desc=port_desc,
                remote_chassis_id=_id_text(chassis_id), remote_description=_text(chassis_body.get("descr"), 1024)))
        except ValueError as e:
            notes.append(f"{port!r}: {_reason(e)}")
    return out


def local_chassis_id(text: str) -> str | None:
    """`lldpcli -f json show chassis` -> this device's chassis id (a MAC: lower-case hex with ':')."""
    doc = _json(text)
    local = doc.get("local-chassis") if isinstance(doc, dict) else None
    chassis = _named(local.get("chassis", {})) if isinstance(local, dict) else []
    return _id_text(_id(chassis[0][1])[1]) if chassis else None


def normalize(text: str, kind: str | None) -> str:
    """A section's text without the VOLATILE state of its `kind` of command."""
    for pattern, replacement in VOLATILE.get(kind or "", ()):
        text = pattern.sub(replacement, text)
    return text


def config_text(sections: list[tuple[str, str, str]]) -> str:
    """The snapshot: (name, what, text) sections, each under a header `### name: what`."""
    return "".join(f"### {name}: {what}\n{body.rstrip()}\n" if body.strip() else f"### {name}: {what}\n"
                   for name, what, body in sections)
