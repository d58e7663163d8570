"""The SNMP collector: IF-MIB counters and state, LLDP-MIB neighbours, system facts, interface
addresses, extra objects.

Per poll and device: one GET (system group, LLDP local system), one multi-column GETBULK walk of
the interface columns (ifXTable HC counters, ifHighSpeed, ifTable status/errors/discards/MTU),
one of the LLDP-MIB local port and remote tables, and the configured extra objects. One pysnmp
engine serves every device; at most `polling.max_concurrency` devices are polled at once.

Interface addresses (InterfaceAddress: IPv4 address, port, prefix length; the correlator turns
traceroute hops into devices and ports with them) come from IP-MIB ipAddrTable, or from the newer
ipAddressTable when a device's ipAddrTable is empty. Addresses rarely change, so they are walked
on a device's first poll, then on the first poll `address_refresh_s` (5 minutes) after the last
complete walk, and at once after the device rebooted (sysUpTime went back) or its settings changed;
only those polls carry InterfaceAddress records (and `PollResult.addresses_walked`): the consumer
keeps the latest set. Every interface's addresses are reported, whatever the `interfaces` filter
says (that filter limits counters; a traceroute hop may land on any interface). Loopback addresses
(127/8) and addresses on an ifIndex the interface table does not list are left out. A device
without either table (or one hiding them from our view) just yields no addresses.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from typing import Any

from collectors.base import Collector, CollectorBadResponse, CollectorConfigError, PollResult
from collectors.snmp_walk import EnginePool, Oid, SnmpTarget, dotted, oid
from nms.config.models import SnmpSettings, SwitchConfig
from nms.records import U64_MAX, DeviceFacts, GenericPoint, InterfaceAddress, LldpNeighbor, PortSample

log = logging.getLogger(__name__)

SYS_DESCR, SYS_OBJECT_ID, SYS_UPTIME, SYS_NAME = (oid(f"1.3.6.1.2.1.1.{i}.0") for i in (1, 2, 3, 5))
LLDP_LOC_CHASSIS_SUBTYPE, LLDP_LOC_CHASSIS_ID = oid("1.0.8802.1.1.2.1.3.1.0"), oid("1.0.8802.1.1.2.1.3.2.0")

IFX = "1.3.6.1.2.1.31.1.1.1"
IF = "1.3.6.1.2.1.2.2.1"
# column -> (PortSample attribute or helper name, how to read the value)
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
TEXT_FIELDS = {"name"}
OPER_STATUS = {1: "up", 2: "down", 3: "testing", 4: "unknown", 5: "dormant", 6: "notPresent", 7: "lowerLayerDown"}

LLDP_LOC_PORT = "1.0.8802.1.1.2.1.3.7.1"  # index: lldpLocPortNum
LLDP_REM = "1.0.8802.1.1.2.1.4.1.1"  # index: lldpRemTimeMark.lldpRemLocalPortNum.lldpRemIndex
LLDP_COLUMNS: dict[Oid, str] = {
    oid(f"{LLDP_LOC_PORT}.2"): "loc_port_subtype",
    oid(f"{LLDP_LOC_PORT}.3"): "loc_port_id",
    oid(f"{LLDP_REM}.4"): "chassis_subtype",
    oid(f"{LLDP_REM}.5"): "chassis_id",
    oid(f"{LLDP_REM}.6"): "port_subtype",
    oid(f"{LLDP_REM}.7"): "port_id",
    oid(f"{LLDP_REM}.8"): "port_desc",
    oid(f"{LLDP_REM}.9"): "sys_name",
    oid(f"{LLDP_REM}.10"): "sys_desc",
}
PORT_ID_IS_NAME = (5, 7)  # interfaceName, local
CHASSIS_IS_MAC = 4

# IP-MIB ipAddrTable (IPv4 only), index: ipAdEntAddr as its 4 octets, so ipAdEntAddr (.1) itself is
# not walked
IP_ADDR = "1.3.6.1.2.1.4.20.1"
IP_ADDR_COLUMNS: dict[Oid, str] = {oid(f"{IP_ADDR}.2"): "if_index", oid(f"{IP_ADDR}.3"): "netmask"}
# IP-MIB ipAddressTable (the fallback), index: ipAddressAddrType.<length>.<octets>; ipAddressPrefix
# points into ipAddressPrefixTable, whose index ends with the prefix length
IP_ADDRESS = "1.3.6.1.2.1.4.34.1"
IP_ADDRESS_COLUMNS: dict[Oid, str] = {oid(f"{IP_ADDRESS}.3"): "if_index", oid(f"{IP_ADDRESS}.4"): "type",
                                      oid(f"{IP_ADDRESS}.5"): "prefix"}
IP_ADDRESS_PREFIX_ORIGIN = oid("1.3.6.1.2.1.4.32.1.5")
INET_IPV4, ADDRESS_UNICAST = 1, 1
ADDRESS_REFRESH_S = 300.0


def _text(value: Any) -> str:
    raw = bytes(value.asOctets())
    try:
        text = raw.decode()
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return raw.hex(":")


def _fields(value: Any) -> dict[str, int | str]:
    """An SNMP value as store fields: numbers in `value` (an integer), everything else in `text`.
    One field key keeps one type (InfluxDB refuses a key whose type changes within a measurement);
    a Counter64 past 2^63 goes to `text` rather than become an inexact float."""
    if hasattr(value, "asOctets"):
        return {"text": _text(value)[:4096]}
    if hasattr(value, "asTuple"):
        return {"text": dotted(value.asTuple())}
    number = int(value)
    return {"value": number} if -(1 << 63) <= number <= (1 << 63) - 1 else {"text": str(number)}


class SnmpCollector(Collector):
    name = "snmp"
    # ifTable errors/discards are Counter32; the octet and packet counters come from ifXTable (64-bit)
    counter_bits = {"in_errors": 32, "out_errors": 32, "in_discards": 32, "out_discards": 32}

    def __init__(self, max_concurrency: int = 64, mib_dirs: list[str] | None = None,
                 address_refresh_s: float = ADDRESS_REFRESH_S):
        self.max_concurrency = max_concurrency
        self.mib_dirs = mib_dirs
        self.address_refresh_s = address_refresh_s  # 0: walk the addresses on every poll
        self._addresses_due: dict[str, float] = {}  # device -> time.monotonic() of its next address walk
        self._uptimes: dict[str, int] = {}  # device -> sysUpTime at its last good poll (reboots)
        self._engines = EnginePool()
        self._semaphore: asyncio.Semaphore | None = None
        self._targets: dict[str, tuple[SnmpSettings, str, SnmpTarget]] = {}
        self._extras: dict[str, tuple[list[tuple[str, Oid]], list[tuple[str, Oid]]]] = {}

    @classmethod
    def from_config(cls, config: Any) -> SnmpCollector:
        return cls(max_concurrency=config.polling.max_concurrency,
                   mib_dirs=[str(d) for d in config.polling.mib_dirs])

    def _target(self, device: SwitchConfig) -> SnmpTarget:
        settings = self.settings(device)
        if settings is None:
            raise CollectorConfigError(device.name, "has no collectors.snmp settings")
        cached = self._targets.get(device.name)
        if cached is None or cached[0] is not settings or cached[1] != device.mgmt_address:
            # one engine for every device (its setup costs ~0.3 s), see EnginePool for the exception
            target = SnmpTarget(self._engines.engine_for(settings), device.name, device.mgmt_address, settings)
            self._targets[device.name] = (settings, device.mgmt_address, target)
            self._extras.pop(device.name, None)
            self._addresses_due.pop(device.name, None)
            return target
        return cached[2]

    def _extra_oids(self, device: str, settings: SnmpSettings) -> tuple[list[tuple[str, Oid]], list[tuple[str, Oid]]]:
        """(scalars to GET, subtrees to walk) as (label, oid), resolved once per device."""
        if device not in self._extras:
            from collectors.snmp_mibs import resolve  # MIB names need pysmi: imported only when used

            scalars, trees = [], []
            for text in settings.extra_oids:
                try:
                    o = resolve(text, self.mib_dirs)
                except ValueError as e:
                    raise CollectorConfigError(device, str(e)) from None
                (scalars if o[-1] == 0 and len(o) > 1 and text.endswith(".0") else trees).append((text, o))
            self._extras[device] = (scalars, trees)
        return self._extras[device]

    async def collect(self, device: SwitchConfig) -> PollResult:
        target = self._target(device)
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        async with self._semaphore:
            return await self._poll(device, target)

    async def _poll(self, device: SwitchConfig, target: SnmpTarget) -> PollResult:
        s = target.settings
        started_ns, t0 = time.time_ns(), time.perf_counter()
        target.values = 0
        scalars, trees = self._extra_oids(device.name, s)
        system = await target.get([SYS_UPTIME, SYS_NAME, SYS_DESCR, SYS_OBJECT_ID,
                                   *((LLDP_LOC_CHASSIS_SUBTYPE, LLDP_LOC_CHASSIS_ID) if s.lldp else ()),
                                   *(o for _, o in scalars)])
        uptime = int(system[SYS_UPTIME]) if SYS_UPTIME in system else None
        ts = time.time_ns()
        table = await target.walk(list(IF_COLUMNS), s.max_repetitions)
        rows = _rows(table, IF_COLUMNS)
        samples = [sample for index, row in sorted(rows.items())
                   if (sample := _port_sample(device.name, index, row, ts, uptime, s.interfaces)) is not None]
        records: list[Any] = list(samples)
        names = {index[0]: row["name"] for index, row in rows.items() if len(index) == 1 and row.get("name")}
        walk_addresses = self._addresses_wanted(device.name, uptime)
        if walk_addresses:
            ports = {index[0]: _port_name(index, row) for index, row in rows.items() if len(index) == 1}
            records += await self._addresses(device.name, target, ports)
        if s.lldp:
            lldp = await target.walk(list(LLDP_COLUMNS), s.max_repetitions)
            records += _neighbors(device.name, lldp, names, time.time_ns())
        if trees:
            walked = await target.walk([o for _, o in trees], s.max_repetitions)
            for label, o in trees:
                for index, value in walked[o].items():
                    records.append(_extra(device.name, label, dotted(index), value, ts))
        for label, o in scalars:
            if o in system:
                records.append(_extra(device.name, label, "0", system[o], ts))
        chassis = None
        if LLDP_LOC_CHASSIS_ID in system:
            value = system[LLDP_LOC_CHASSIS_ID]
            chassis = (bytes(value.asOctets()).hex(":") if int(system.get(LLDP_LOC_CHASSIS_SUBTYPE, 0)) == CHASSIS_IS_MAC
                       else _text(value))
        records.append(DeviceFacts(
            device=device.name, ts=ts, uptime_ticks=uptime, interfaces=len(rows),
            sys_name=_text(system[SYS_NAME])[:255] if SYS_NAME in system else None,
            sys_descr=_text(system[SYS_DESCR])[:1024] if SYS_DESCR in system else None,
            sys_object_id=dotted(system[SYS_OBJECT_ID].asTuple()) if SYS_OBJECT_ID in system else None,
            lldp_chassis_id=chassis))
        # only a poll that completes counts: one cut off by its deadline walks the addresses again
        if walk_addresses:
            self._addresses_due[device.name] = time.monotonic() + self.address_refresh_s
        if uptime is not None:
            self._uptimes[device.name] = uptime
        return PollResult(device=device.name, collector=self.name, started_ns=started_ns,
                          duration_s=time.perf_counter() - t0, records=records, counter_bits=self.counter_bits,
                          values=target.values, addresses_walked=walk_addresses)

    def _addresses_wanted(self, device: str, uptime: int | None) -> bool:
        due = self._addresses_due.get(device)
        previous = self._uptimes.get(device)
        rebooted = uptime is not None and previous is not None and uptime < previous
        return due is None or time.monotonic() >= due or rebooted

    async def _addresses(self, device: str, target: SnmpTarget, ports: dict[int, str]) -> list[InterfaceAddress]:
        """The device's IPv4 interface addresses: ipAddrTable, else ipAddressTable. A device that
        answers these tables with garbage loses only its addresses (logged), not the poll."""
        s = target.settings
        ts = time.time_ns()
        try:
            found = _ip_addr_table(await target.walk(list(IP_ADDR_COLUMNS), s.max_repetitions))
            if not found:
                found = _ip_address_table(await target.walk(list(IP_ADDRESS_COLUMNS), s.max_repetitions))
        except CollectorBadResponse as e:
            log.warning("no interface addresses this time: %s", e)
            return []
        except (ValueError, TypeError) as e:  # a column of an unexpected type
            log.warning("no interface addresses this time: %s: unreadable IP-MIB address table: %s", device, e)
            return []
        return [InterfaceAddress(device=device, port=ports[if_index], ts=ts, address=address,
                                 prefix_len=32 if prefix_len is None else prefix_len)
                for address, if_index, prefix_len in sorted(found, key=_address_order)
                if if_index in ports and not address.startswith("127.")]

    async def close(self) -> None:
        self._engines.close()
        self._targets.clear()
        self._semaphore = None
        self._addresses_due.clear()
        self._uptimes.clear()


def _rows(table: dict[Oid, dict[Oid, Any]], columns: dict[Oid, str]) -> dict[Oid, dict[str, Any]]:
    rows: dict[Oid, dict[str, Any]] = {}
    for column, values in table.items():
        field = columns[column]
        for index, value in values.items():
            rows.setdefault(index, {})[field] = value
    return rows


def _num(row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    return None if value is None else int(value)


def _sum(row: dict[str, Any], *keys: str) -> int | None:
    parts = [_num(row, k) for k in keys]
    if parts[0] is None:
        return None
    return sum(p for p in parts if p is not None) & U64_MAX


def _port_name(index: Oid, row: dict[str, Any]) -> str:
    """A port's name in every record: its ifName, or `if<ifIndex>` when it has none."""
    name = _text(row["name"]) if "name" in row else ""
    return (name if name and name.isprintable() else f"if{index[0]}")[:128]


def _port_sample(device: str, index: Oid, row: dict[str, Any], ts: int, uptime: int | None,
                 patterns: list[str]) -> PortSample | None:
    if len(index) != 1 or "oper" not in row and "in_octets" not in row:
        return None
    name = _port_name(index, row)
    if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
        return None
    high_speed = _num(row, "high_speed")
    mtu = _num(row, "mtu")
    return PortSample(
        device=device, port=name, ts=ts,
        in_octets=_num(row, "in_octets"), out_octets=_num(row, "out_octets"),
        in_pkts=_sum(row, "in_ucast", "in_mcast", "in_bcast"),
        out_pkts=_sum(row, "out_ucast", "out_mcast", "out_bcast"),
        in_errors=_num(row, "in_errors"), out_errors=_num(row, "out_errors"),
        in_discards=_num(row, "in_discards"), out_discards=_num(row, "out_discards"),
        oper_status=OPER_STATUS.get(_num(row, "oper"), "unknown") if "oper" in row else None,
        speed_bps=high_speed * 10**6 if high_speed is not None else None,
        mtu=mtu if mtu is not None and 0 <= mtu <= 1 << 20 else None,
        uptime_ticks=uptime, discontinuity_ticks=_num(row, "discontinuity_ticks"),
        last_change_ticks=_num(row, "last_change_ticks"))


def _neighbors(device: str, table: dict[Oid, dict[Oid, Any]], if_names: dict[int, str], ts: int) -> list[LldpNeighbor]:
    rows = _rows(table, LLDP_COLUMNS)
    local: dict[int, str] = {}
    for index, row in rows.items():
        if len(index) == 1 and "loc_port_id" in row:
            port_id = _text(row["loc_port_id"])
            if _num(row, "loc_port_subtype") in PORT_ID_IS_NAME and port_id:
                local[index[0]] = port_id
    out = []
    for index, row in sorted(rows.items()):
        if len(index) != 3 or "sys_name" not in row and "port_id" not in row:
            continue
        port_num = index[1]
        port = local.get(port_num) or (_text(if_names[port_num]) if port_num in if_names else f"lldp{port_num}")
        port_id = _text(row["port_id"]) if "port_id" in row else None
        port_desc = _text(row["port_desc"]) if "port_desc" in row else None
        remote_port = port_id if _num(row, "port_subtype") in PORT_ID_IS_NAME else (port_desc or port_id)
        chassis = None
        if "chassis_id" in row:
            chassis = (bytes(row["chassis_id"].asOctets()).hex(":") if _num(row, "chassis_subtype") == CHASSIS_IS_MAC
                       else _text(row["chassis_id"]))
        out.append(LldpNeighbor(
            device=device, port=port[:128], ts=ts,
            remote_name=_text(row["sys_name"])[:255] if "sys_name" in row else None,
            remote_port=remote_port[:255] if remote_port else None,
            remote_port_desc=port_desc[:255] if port_desc else None,
            remote_chassis_id=chassis[:255] if chassis else None,
            remote_description=_text(row["sys_desc"])[:1024] if "sys_desc" in row else None))
    return out


def _extra(device: str, label: str, index: str, value: Any, ts: int) -> GenericPoint:
    return GenericPoint(measurement="snmp_extra", tags={"device": device, "object": label, "index": index},
                        fields=_fields(value), ts=ts)


Address = tuple[str, int, int | None]  # (dotted IPv4 address, ifIndex, prefix length)


def _prefix_len(mask: Any) -> int | None:
    """An IpAddress netmask as a prefix length; None when missing or not contiguous."""
    raw = bytes(mask.asOctets()) if mask is not None and hasattr(mask, "asOctets") else b""
    if len(raw) != 4:
        return None
    host = ~int.from_bytes(raw, "big") & 0xFFFFFFFF
    return 32 - host.bit_length() if host & (host + 1) == 0 else None


def _ipv4(octets: Oid) -> str | None:
    return ".".join(map(str, octets)) if len(octets) == 4 and all(0 <= b <= 255 for b in octets) else None


def _ip_addr_table(table: dict[Oid, dict[Oid, Any]]) -> list[Address]:
    """ipAddrTable rows -> addresses (index: the address itself)."""
    out = []
    for index, row in _rows(table, IP_ADDR_COLUMNS).items():
        if (address := _ipv4(index)) is not None and "if_index" in row:
            out.append((address, int(row["if_index"]), _prefix_len(row.get("netmask"))))
    return out


def _ip_address_table(table: dict[Oid, dict[Oid, Any]]) -> list[Address]:
    """ipAddressTable rows -> IPv4 unicast addresses (index: type 1, length 4, the octets); the
    prefix length is the last sub-identifier of the ipAddressPrefix row pointer (zeroDotZero: unknown)."""
    out = []
    for index, row in _rows(table, IP_ADDRESS_COLUMNS).items():
        if len(index) != 6 or index[:2] != (INET_IPV4, 4) or (address := _ipv4(index[2:])) is None:
            continue
        if "if_index" not in row or _num(row, "type") not in (None, ADDRESS_UNICAST):
            continue  # broadcast / anycast entries
        prefix = row["prefix"].asTuple() if hasattr(row.get("prefix"), "asTuple") else ()
        prefix_len = (prefix[-1] if prefix[:len(IP_ADDRESS_PREFIX_ORIGIN)] == IP_ADDRESS_PREFIX_ORIGIN
                      and len(prefix) > len(IP_ADDRESS_PREFIX_ORIGIN) and 0 <= prefix[-1] <= 32 else None)
        out.append((address, int(row["if_index"]), prefix_len))
    return out


def _address_order(a: Address) -> tuple[int, tuple[int, ...]]:
    return a[1], tuple(map(int, a[0].split(".")))
