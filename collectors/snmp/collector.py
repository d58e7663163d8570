"""The SNMP collector: IF-MIB counters and state, LLDP-MIB neighbours, system facts, interface
addresses, extra objects.

Per poll and device: one GET (system group, LLDP local system), one multi-column GETBULK walk of
the interface columns (ifXTable HC counters, ifHighSpeed, ifTable status/errors/discards/MTU),
one of the LLDP-MIB local port and remote tables, and the configured extra objects. One pysnmp
engine serves every device; at most `polling.max_concurrency` devices are polled at once.

A device without ifXTable, or with interfaces it leaves out, gets the ifTable's 32-bit counters,
ifSpeed and ifDescr instead (collectors/snmp/ifmib.py): a second walk on the poll that finds the
gap, and from then on those columns are part of the device's one interface walk.

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

What a poll leaves out is in its `problems`: address tables that answered with garbage (the rest of
the poll is kept), and configured extra objects the agent does not have.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from typing import Any

from collectors.base import (
    Collector,
    CollectorBadResponse,
    CollectorConfigError,
    DeviceCache,
    PollProblem,
    PollResult,
    PollStart,
)
from collectors.lldp_id import mac_octets, mac_or_text
from collectors.snmp.ifmib import IF_COLUMNS, IF_TABLE_COLUMNS, is_port, needs_if_table, port_names, port_sample
from collectors.snmp.settings import SnmpSettings
from collectors.snmp.transport import EnginePool, Oid, SnmpTarget, as_text, dotted, oid, row_int, table_rows
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint, InterfaceAddress, LldpNeighbor, PortSample

log = logging.getLogger(__name__)

SYS_DESCR, SYS_OBJECT_ID, SYS_UPTIME, SYS_NAME = (oid(f"1.3.6.1.2.1.1.{i}.0") for i in (1, 2, 3, 5))
LLDP_LOC_CHASSIS_SUBTYPE, LLDP_LOC_CHASSIS_ID = oid("1.0.8802.1.1.2.1.3.1.0"), oid("1.0.8802.1.1.2.1.3.2.0")

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
U32_BITS = (1 << 32) * 8  # what a 32-bit octet counter holds, in bits


def _fields(value: Any) -> dict[str, int | str]:
    """An SNMP value as store fields: numbers in `value` (an integer), everything else in `text`.
    One field key keeps one type (InfluxDB refuses a key whose type changes within a measurement);
    a Counter64 past 2^63 goes to `text` rather than become an inexact float."""
    if hasattr(value, "asOctets"):
        return {"text": as_text(value)[:4096]}
    if hasattr(value, "asTuple"):
        return {"text": dotted(value.asTuple())}
    number = int(value)
    return {"value": number} if -(1 << 63) <= number <= (1 << 63) - 1 else {"text": str(number)}


class SnmpCollector(Collector):
    name = "snmp"
    settings_model = SnmpSettings
    # ifTable errors/discards are Counter32; the octet and packet counters come from ifXTable (64-bit),
    # or from the ifTable (32-bit) where a sample says so (PortSample.counter_bits)
    link_state_rank = 30  # agents answer ifOperStatus from a cache (net-snmp: up to 15 s old)
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
        # one engine for every device (its setup costs ~0.3 s), see EnginePool for the exception
        self._targets: DeviceCache[SnmpTarget] = DeviceCache(
            lambda device, settings: SnmpTarget(self._engines.engine_for(settings), device.name, device.mgmt_address,
                                                settings),
            forget=self._forget)
        self._extras: dict[str, tuple[list[tuple[str, Oid]], list[tuple[str, Oid]]]] = {}
        self._if_table: set[str] = set()  # devices whose interface walk includes the ifTable fallback columns

    @classmethod
    def from_config(cls, config: Any) -> SnmpCollector:
        return cls(max_concurrency=config.polling.max_concurrency,
                   mib_dirs=[str(d) for d in config.polling.mib_dirs])

    def _forget(self, device: str) -> None:
        """A new target for `device`: what was learnt through the old one is read again."""
        self._extras.pop(device, None)
        self._addresses_due.pop(device, None)
        self._if_table.discard(device)

    def _extra_oids(self, device: str, settings: SnmpSettings) -> tuple[list[tuple[str, Oid]], list[tuple[str, Oid]]]:
        """(scalars to GET, subtrees to walk) as (label, oid), resolved once per device."""
        if device not in self._extras:
            from collectors.snmp.mibs import resolve  # MIB names need pysmi: imported only when used

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
        target = await self._targets.get(device, self.required_settings(device))
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        async with self._semaphore:
            return await self._poll(device, target)

    async def _poll(self, device: SwitchConfig, target: SnmpTarget) -> PollResult:
        s = target.settings
        started = PollStart()
        target.values = 0
        scalars, trees = self._extra_oids(device.name, s)
        system = await target.get([SYS_UPTIME, SYS_NAME, SYS_DESCR, SYS_OBJECT_ID,
                                   *((LLDP_LOC_CHASSIS_SUBTYPE, LLDP_LOC_CHASSIS_ID) if s.lldp else ()),
                                   *(o for _, o in scalars)])
        uptime = int(system[SYS_UPTIME]) if SYS_UPTIME in system else None
        ts = time.time_ns()
        rows, fell_back = await self._interface_rows(device.name, target)
        names = port_names(rows)
        samples = [port_sample(device.name, index, row, names[index[0]], ts, uptime)
                   for index, row in sorted(rows.items()) if is_port(index, row)
                   and (not s.interfaces or any(fnmatch.fnmatchcase(names[index[0]], p) for p in s.interfaces))]
        if fell_back:
            _log_fallback(device.name, samples, s.interval)
        records: list[Any] = list(samples)
        problems: list[PollProblem] = []
        walk_addresses = self._addresses_wanted(device.name, uptime)
        if walk_addresses:
            addresses = await self._addresses(target, names, problems)
            walk_addresses = addresses is not None  # unreadable: the consumer keeps the set it has
            records += addresses or []
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
            else:
                problems.append(PollProblem(what=f"extra object {label}", reason="the agent has no such object "
                                            "(noSuchObject or noSuchInstance)"))
        chassis = None
        if LLDP_LOC_CHASSIS_ID in system:
            value = system[LLDP_LOC_CHASSIS_ID]
            chassis = (
                mac_octets(bytes(value.asOctets()))
                if int(system.get(LLDP_LOC_CHASSIS_SUBTYPE, 0)) == CHASSIS_IS_MAC
                else mac_or_text(as_text(value))
            )
        facts = DeviceFacts(
            device=device.name, ts=ts, uptime_ticks=uptime, interfaces=len(rows),
            sys_name=as_text(system[SYS_NAME])[:255] if SYS_NAME in system else None,
            sys_descr=as_text(system[SYS_DESCR])[:1024] if SYS_DESCR in system else None,
            sys_object_id=dotted(system[SYS_OBJECT_ID].asTuple()) if SYS_OBJECT_ID in system else None,
            lldp_chassis_id=chassis)
        # only a poll that completes counts: one cut off by its deadline walks the addresses again
        if walk_addresses:
            self._addresses_due[device.name] = time.monotonic() + self.address_refresh_s
        if uptime is not None:
            self._uptimes[device.name] = uptime
        return self.result(device.name, started, [facts, *records], values=target.values,
                           addresses_walked=walk_addresses, problems=problems)

    async def _interface_rows(self, device: str, target: SnmpTarget) -> tuple[dict[Oid, dict[str, Any]], bool]:
        """IF-MIB rows by ifIndex, with the ifTable fallback columns when the device needs them; and
        whether this poll found out that it does."""
        repetitions = target.settings.max_repetitions
        columns = {**IF_COLUMNS, **IF_TABLE_COLUMNS} if device in self._if_table else IF_COLUMNS
        rows = table_rows(await target.walk(list(columns), repetitions), columns)
        if device in self._if_table or not needs_if_table(rows):
            return rows, False
        more = table_rows(await target.walk(list(IF_TABLE_COLUMNS), repetitions), IF_TABLE_COLUMNS)
        for index, row in more.items():
            if index in rows:
                rows[index].update(row)
        self._if_table.add(device)  # from now on in the one interface walk
        return rows, True

    def _addresses_wanted(self, device: str, uptime: int | None) -> bool:
        due = self._addresses_due.get(device)
        previous = self._uptimes.get(device)
        rebooted = uptime is not None and previous is not None and uptime < previous
        return due is None or time.monotonic() >= due or rebooted

    async def _addresses(self, target: SnmpTarget, ports: dict[int, str],
                         problems: list[PollProblem]) -> list[InterfaceAddress] | None:
        """The device's IPv4 interface addresses: ipAddrTable, else ipAddressTable. A device that
        answers these tables with garbage loses only its addresses this poll (None, a problem; walked
        again at the next), not the poll."""
        s = target.settings
        ts = time.time_ns()
        what = "IP-MIB address tables"
        try:
            found = _ip_addr_table(await target.walk(list(IP_ADDR_COLUMNS), s.max_repetitions))
            if not found:
                found = _ip_address_table(await target.walk(list(IP_ADDRESS_COLUMNS), s.max_repetitions))
        except CollectorBadResponse as e:
            problems.append(e.problem(what, "no interface addresses this poll"))
            return None
        except (ValueError, TypeError) as e:  # a column of an unexpected type
            problems.append(PollProblem(what=what, reason=f"unreadable at {target.address}: {e}; "
                                                          "no interface addresses this poll"))
            return None
        return [InterfaceAddress(device=target.device, port=ports[if_index], ts=ts, address=address,
                                 prefix_len=32 if prefix_len is None else prefix_len)
                for address, if_index, prefix_len in sorted(found, key=_address_order)
                if if_index in ports and not address.startswith("127.")]

    async def forget(self, device_name: str) -> None:
        """Given to another member: its target, extra OIDs and sysUpTime dropped (taken back later, its
        first poll walks its addresses again and judges no reboot, as at a member new to it)."""
        self._targets.pop(device_name)
        self._forget(device_name)
        self._uptimes.pop(device_name, None)

    async def close(self) -> None:
        self._engines.close()
        await self._targets.close_all()
        self._semaphore = None
        self._addresses_due.clear()
        self._uptimes.clear()
        self._if_table.clear()


def _log_fallback(device: str, samples: list[PortSample], interval_s: float) -> None:
    """Said once per device. A 32-bit octet counter wraps every 2^32 x 8 / speed seconds (34 s at
    1 Gbit/s): over a longer poll interval it can wrap more than once unseen, and the rate is low."""
    fast = [x.port for x in samples if x.counter_bits == 32 and x.speed_bps and U32_BITS / x.speed_bps < interval_s]
    if fast:
        more = f" and {len(fast) - 10} more" if len(fast) > 10 else ""
        log.warning("%s has no ifXTable for some interfaces: their 32-bit octet counters can wrap more than once in "
                    "the %g s poll interval at line rate, making the rates of busy ports too low: %s%s",
                    device, interval_s, ", ".join(fast[:10]), more)
    else:
        log.info("%s has no ifXTable for some interfaces: reading their ifTable counters (32-bit), ifSpeed and "
                 "ifDescr", device)


def _neighbors(device: str, table: dict[Oid, dict[Oid, Any]], if_names: dict[int, str], ts: int) -> list[LldpNeighbor]:
    rows = table_rows(table, LLDP_COLUMNS)
    local: dict[int, str] = {}
    for index, row in rows.items():
        if len(index) == 1 and "loc_port_id" in row:
            port_id = as_text(row["loc_port_id"])
            if row_int(row, "loc_port_subtype") in PORT_ID_IS_NAME and port_id:
                local[index[0]] = port_id
    out = []
    for index, row in sorted(rows.items()):
        if len(index) != 3 or "sys_name" not in row and "port_id" not in row:
            continue
        port_num = index[1]
        port = local.get(port_num) or if_names.get(port_num) or f"lldp{port_num}"
        port_id = as_text(row["port_id"]) if "port_id" in row else None
        port_desc = as_text(row["port_desc"]) if "port_desc" in row else None
        remote_port = port_id if row_int(row, "port_subtype") in PORT_ID_IS_NAME else (port_desc or port_id)
        chassis = None
        if "chassis_id" in row:
            value = row["chassis_id"]
            is_mac = row_int(row, "chassis_subtype") == CHASSIS_IS_MAC
            chassis = mac_octets(bytes(value.asOctets())) if is_mac else mac_or_text(as_text(value))
        out.append(LldpNeighbor(
            device=device, port=port[:128], ts=ts,
            remote_name=as_text(row["sys_name"])[:255] if "sys_name" in row else None,
            remote_port=remote_port[:255] if remote_port else None,
            remote_port_desc=port_desc[:255] if port_desc else None,
            remote_chassis_id=chassis[:255] if chassis else None,
            remote_description=as_text(row["sys_desc"])[:1024] if "sys_desc" in row else None))
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
    for index, row in table_rows(table, IP_ADDR_COLUMNS).items():
        if (address := _ipv4(index)) is not None and "if_index" in row:
            out.append((address, int(row["if_index"]), _prefix_len(row.get("netmask"))))
    return out


def _ip_address_table(table: dict[Oid, dict[Oid, Any]]) -> list[Address]:
    """ipAddressTable rows -> IPv4 unicast addresses (index: type 1, length 4, the octets); the
    prefix length is the last sub-identifier of the ipAddressPrefix row pointer (zeroDotZero: unknown)."""
    out = []
    for index, row in table_rows(table, IP_ADDRESS_COLUMNS).items():
        if len(index) != 6 or index[:2] != (INET_IPV4, 4) or (address := _ipv4(index[2:])) is None:
            continue
        if "if_index" not in row or row_int(row, "type") not in (None, ADDRESS_UNICAST):
            continue  # broadcast / anycast entries
        prefix = row["prefix"].asTuple() if hasattr(row.get("prefix"), "asTuple") else ()
        prefix_len = (prefix[-1] if prefix[:len(IP_ADDRESS_PREFIX_ORIGIN)] == IP_ADDRESS_PREFIX_ORIGIN
                      and len(prefix) > len(IP_ADDRESS_PREFIX_ORIGIN) and 0 <= prefix[-1] <= 32 else None)
        out.append((address, int(row["if_index"]), prefix_len))
    return out


def _address_order(a: Address) -> tuple[int, tuple[int, ...]]:
    return a[1], tuple(map(int, a[0].split(".")))
