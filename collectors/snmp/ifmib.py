"""IF-MIB interface rows -> PortSample: the columns read, port names, and the ifTable fallback.

ifXTable (RFC 2863) gives 64-bit octet and packet counters, ifName and ifHighSpeed. Many older
or out-of-band devices (PDUs, console servers, management switches) serve only the ifTable:
32-bit ifIn/OutOctets and ifIn/Out(N)UcastPkts, ifSpeed, ifDescr. Per interface, what ifXTable
lacks is taken from the ifTable, and the sample's `counter_bits` = 32 makes the rate math wrap
its octet and packet counters at 2^32.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from collectors.snmp.transport import Oid, oid, row_int
from nms.records import U64_MAX, PortSample

IFX = "1.3.6.1.2.1.31.1.1.1"
IF = "1.3.6.1.2.1.2.2.1"
# read on every poll: ifXTable, and the ifTable columns ifXTable has no version of
IF_COLUMNS: dict[Oid, str] = {
    oid(f"{IFX}.1"): "name",
    oid(f"{IFX}.6"): "in_octets",
    oid(f"{IFX}.7"): "in_ucast",
    oid(f"{IFX}.8"): "in_mcast",
    oid(f"{IFX}.9"): "in_bcast",
    oid(f"{IFX}.10"): "out_octets",
    oid(f"{IFX}.11"): "out_ucast",
    oid(f"{IFX}.12"): "out_mcast",
    oid(f"{IFX}.13"): "out_bcast",
    oid(f"{IFX}.15"): "high_speed",
    oid(f"{IFX}.19"): "discontinuity_ticks",
    oid(f"{IF}.4"): "mtu",
    oid(f"{IF}.8"): "oper",
    oid(f"{IF}.9"): "last_change_ticks",
    oid(f"{IF}.13"): "in_discards",
    oid(f"{IF}.14"): "in_errors",
    oid(f"{IF}.19"): "out_discards",
    oid(f"{IF}.20"): "out_errors",
}
# the ifTable's own versions of what ifXTable gives: read only from devices that lack some of it
IF_TABLE_COLUMNS: dict[Oid, str] = {
    oid(f"{IF}.2"): "descr",
    oid(f"{IF}.5"): "speed",
    oid(f"{IF}.10"): "in_octets_32",
    oid(f"{IF}.11"): "in_ucast_32",
    oid(f"{IF}.12"): "in_nucast_32",
    oid(f"{IF}.16"): "out_octets_32",
    oid(f"{IF}.17"): "out_ucast_32",
    oid(f"{IF}.18"): "out_nucast_32",
}
COUNTERS_32 = ("in_octets_32", "in_ucast_32", "in_nucast_32", "out_octets_32", "out_ucast_32", "out_nucast_32")
U32_MAX = (1 << 32) - 1
IF_SPEED_MAX = U32_MAX  # ifSpeed's "faster than this: see ifHighSpeed"
OPER_STATUS = {1: "up", 2: "down", 3: "testing", 4: "unknown", 5: "dormant", 6: "notPresent", 7: "lowerLayerDown"}


def is_port(index: Oid, row: dict[str, Any]) -> bool:
    return len(index) == 1 and ("oper" in row or "in_octets" in row or "in_octets_32" in row)


def needs_if_table(rows: dict[Oid, dict[str, Any]]) -> bool:
    """True when an interface lacks something only ifXTable gives: a name, 64-bit octets, ifHighSpeed."""
    return any(is_port(index, row) and not (_label(row.get("name")) and "in_octets" in row and "high_speed" in row)
               for index, row in rows.items())


def _label(value: Any) -> str | None:
    """An ifName or ifDescr as a port name; None when empty or unusable (not UTF-8, control
    characters, a backslash: see records.Ident)."""
    if value is None:
        return None
    try:
        text = bytes(value.asOctets()).rstrip(b"\0").decode().strip()  # some agents NUL-terminate ifDescr
    except UnicodeDecodeError:
        return None
    return text[:128] if text and text.isprintable() and "\\" not in text else None


def port_names(rows: dict[Oid, dict[str, Any]]) -> dict[int, str]:
    """ifIndex -> the port's name in every record: its ifName, else its ifDescr, else `if<ifIndex>`.
    ifDescr need not be unique: a name several interfaces share gets ` #<ifIndex>` on each."""
    names = {index[0]: _label(row.get("name")) or _label(row.get("descr")) or f"if{index[0]}"
             for index, row in rows.items() if is_port(index, row)}
    shared = Counter(names.values())
    return {i: name if shared[name] == 1 else f"{name[:116]} #{i}" for i, name in names.items()}


def _sum(row: dict[str, Any], mask: int, *keys: str) -> int | None:
    """The sum of packet counters, itself a counter of the same width (the sum modulo 2^width has
    the right delta across a wrap of any part); None without the first (unicast) part."""
    parts = [row_int(row, k) for k in keys]
    if parts[0] is None:
        return None
    return sum(p for p in parts if p is not None) & mask


def _speed_bps(row: dict[str, Any]) -> int | None:
    high_speed = row_int(row, "high_speed")  # Mbit/s
    if high_speed is not None:
        return high_speed * 10**6
    speed = row_int(row, "speed")  # bit/s, a Gauge32
    # its maximum means "faster than 4.29 Gbit/s, read ifHighSpeed", which this device lacks:
    # unknown, rather than a speed that would cap the plausible rates and inflate utilization
    return None if speed is None or speed >= IF_SPEED_MAX else speed


def port_sample(device: str, index: Oid, row: dict[str, Any], name: str, ts: int, uptime: int | None) -> PortSample:
    if "in_octets" in row or "out_octets" in row:  # ifXTable, 64-bit
        bits = None
        in_octets, out_octets = row_int(row, "in_octets"), row_int(row, "out_octets")
        in_pkts = _sum(row, U64_MAX, "in_ucast", "in_mcast", "in_bcast")
        out_pkts = _sum(row, U64_MAX, "out_ucast", "out_mcast", "out_bcast")
    else:  # ifTable only: NUcast is multicast + broadcast, so these are every packet as above
        bits = 32 if any(k in row for k in COUNTERS_32) else None
        in_octets, out_octets = row_int(row, "in_octets_32"), row_int(row, "out_octets_32")
        in_pkts = _sum(row, U32_MAX, "in_ucast_32", "in_nucast_32")
        out_pkts = _sum(row, U32_MAX, "out_ucast_32", "out_nucast_32")
    mtu = row_int(row, "mtu")
    return PortSample(
        device=device, port=name, ts=ts, counter_bits=bits,
        in_octets=in_octets, out_octets=out_octets, in_pkts=in_pkts, out_pkts=out_pkts,
        in_errors=row_int(row, "in_errors"), out_errors=row_int(row, "out_errors"),
        in_discards=row_int(row, "in_discards"), out_discards=row_int(row, "out_discards"),
        oper_status=OPER_STATUS.get(row_int(row, "oper"), "unknown") if "oper" in row else None,
        speed_bps=_speed_bps(row),
        mtu=mtu if mtu is not None and 0 <= mtu <= 1 << 20 else None,
        uptime_ticks=uptime, discontinuity_ticks=row_int(row, "discontinuity_ticks"),
        last_change_ticks=row_int(row, "last_change_ticks"))
