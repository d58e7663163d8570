"""UFM REST objects -> the shared records: systems -> DeviceFacts, switch ports -> PortSample, links ->
LldpNeighbor, a Monitoring snapshot -> PortSample counters (docs/ufm.md has the field mapping).

Ports are identified by UFM's port name, `<node GUID>_<port number>` (what links, alarms and events
point at). Records name a switch by its UFM `system_name` and a port by its `dname` (the port label,
"1/26/2" on NDR/XDR switches, the number elsewhere); a host port (a link's far end) by the HCA part of
its node description ("gpu-01 mlx5_0" -> "mlx5_0"), the name the host itself and the inventory use.

An item that lacks a needed field or carries an unusable value is left out and noted in `Problems`
(route, item, what was wrong); the rest of the answer is kept.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from nms.records import DeviceFacts, LldpNeighbor, OperStatus, PollProblem, PortSample

U64 = (1 << 64) - 1
NS = 10**9
# IB lane signalling rates by speed name, in bit/s (4x NDR = 400G, 4x HDR = 200G, ...)
LANE_BPS = {"SDR": 2_500_000_000, "DDR": 5_000_000_000, "QDR": 10_000_000_000, "FDR10": 10_000_000_000,
            "FDR": 14_000_000_000, "EDR": 25_000_000_000, "HDR": 50_000_000_000, "NDR": 100_000_000_000,
            "XDR": 200_000_000_000}
# PortSample counter <- (Monitoring attribute, multiplier). The Monitoring REST API's data attributes
# count "data octets, divided by 4 ... reported as a multiple of four octets" (the IB PortXmitData /
# PortRcvData semantics), hence x 4.
COUNTERS: dict[str, tuple[str, int]] = {
    "in_octets": ("Infiniband_MBIn", 4),
    "out_octets": ("Infiniband_MBOut", 4),
    "in_pkts": ("Infiniband_PckIn", 1),
    "out_pkts": ("Infiniband_PckOut", 1),
    "in_errors": ("Infiniband_RcvErrors", 1),
    "out_discards": ("Infiniband_XmtDiscards", 1),
}
AGGREGATION_NODE = "Aggregation Node"  # SHARP aggregation nodes' links are not cables
_IDENT = re.compile(r"^[^\x00-\x1f\\]{1,128}$")


class Problems:
    """Items left out of an answer, per route: reported once per poll (collectors/ufm/collector.py)."""

    def __init__(self) -> None:
        self.by_route: dict[str, list[str]] = defaultdict(list)
        self.totals: dict[str, int] = {}

    def note(self, route: str, index: int, item: Any, what: str) -> None:
        name = item.get("name") or item.get("system_name") or item.get("id") if isinstance(item, dict) else None
        self.by_route[route].append(f"item {index}{f' ({name!r})' if name is not None else ''}: {what}")

    def found(self) -> list[PollProblem]:
        """One problem per route: how many of its items were left out, the first five and why."""
        out = []
        for route, notes in self.by_route.items():
            shown = "; ".join(notes[:5]) + (f"; and {len(notes) - 5} more" if len(notes) > 5 else "")
            out.append(PollProblem(what=route, reason=f"{len(notes)} of {self.totals.get(route, len(notes))} "
                                                      f"items left out: {shown}"))
        return out


class Bad(ValueError):
    """One item's problem (what is missing or wrong)."""


def text(item: dict, key: str, required: bool = True) -> str | None:
    value = item.get(key)
    if isinstance(value, str) and value and value != "N/A":
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if required:
        raise Bad(f"no {key!r}" if value is None else f"{key!r} is {value!r}")
    return None


def ident(value: str, what: str) -> str:
    if not _IDENT.match(value):
        raise Bad(f"{what} {value[:40]!r} cannot name a device or port")
    return value


def guid_of(value: str) -> str:
    return value.lower().removeprefix("0x")


@dataclass(frozen=True)
class PortRef:
    name: str  # UFM port name, <node GUID>_<number>
    device: str
    port: str
    switch: bool
    guid: str
    item: dict = field(compare=False, repr=False)


@dataclass
class Fabric:
    """One poll's systems and ports, indexed."""

    switches: dict[str, dict] = field(default_factory=dict)  # guid -> system (reported switches)
    system_names: dict[str, str] = field(default_factory=dict)  # guid -> system name (every system)
    switch_guids: set[str] = field(default_factory=set)  # every switch, reported or not
    ports: dict[str, PortRef] = field(default_factory=dict)  # UFM port name -> port

    def switch_ports(self) -> list[PortRef]:
        return [p for p in self.ports.values() if p.switch]


def index_systems(items: list, route: str, problems: Problems, wanted) -> Fabric:
    """Systems by GUID. A name that several systems share (UFM's default names of unnamed switches)
    would merge their ports: those systems are named by their GUID instead."""
    fabric = Fabric()
    problems.totals[route] = len(items)
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise Bad("not an object")
            guid = guid_of(text(item, "guid"))
            fabric.system_names[guid] = ident(text(item, "system_name", required=False) or guid, "system_name")
        except Bad as e:
            problems.note(route, i, item, str(e))
            continue
        if str(item.get("type", "")).lower() == "switch":
            fabric.switch_guids.add(guid)
            fabric.switches[guid] = item
    shared = {n for n, count in Counter(fabric.system_names.values()).items() if count > 1}
    for guid, name in fabric.system_names.items():
        if name in shared:
            fabric.system_names[guid] = guid
    fabric.switches = {g: s for g, s in fabric.switches.items() if wanted(fabric.system_names[g])}
    return fabric


def index_ports(fabric: Fabric, items: list, route: str, problems: Problems) -> None:
    problems.totals[route] = len(items)
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise Bad("not an object")
            name = text(item, "name")
            guid, _, number = name.rpartition("_")
            guid = guid_of(guid)
            if not guid or not number.isdigit():
                raise Bad(f"name {name!r} is not <GUID>_<port number>")
            system_guid = _system_of(fabric, item, guid)
            system = fabric.system_names.get(system_guid) or text(item, "system_name", required=False)
            if system is None:
                raise Bad("no 'system_name', and neither its systemID nor its GUID is a known system's")
            port = text(item, "dname", required=False) or number
            if system_guid not in fabric.switch_guids:
                port = _hca(item, system) or port
            switch = system_guid in fabric.switches
            ref = PortRef(f"{guid}_{number}", ident(system, "system_name"), ident(port, "port name"), switch,
                          system_guid, item)
            if switch:
                oper_status(item)  # a switch port without a usable state is no sample
        except Bad as e:
            problems.note(route, i, item, str(e))
            continue
        fabric.ports[ref.name] = ref


def _system_of(fabric: Fabric, item: dict, guid: str) -> str:
    """The port's system GUID: `systemID` when UFM gives a known one (a multi-ASIC switch's ports carry
    their ASIC's node GUID in the name, the chassis' in systemID; an HCA's port GUID is not its
    host's), else the GUID of the port's name."""
    system_id = item.get("systemID")
    if isinstance(system_id, str) and guid_of(system_id) in fabric.system_names:
        return guid_of(system_id)
    return guid


def _hca(item: dict, system: str) -> str | None:
    """'gpu-01 mlx5_0' -> 'mlx5_0' (the node description is the host name and the HCA's)."""
    description = item.get("node_description")
    if isinstance(description, str) and description.startswith(system + " ") and len(description) > len(system) + 1:
        return description[len(system) + 1:].strip() or None
    return None


def oper_status(item: dict) -> OperStatus:
    """UFM logical/physical state -> IF-MIB-style oper status: Active is up; Down (physical Polling,
    Disabled, ...) is down; Init/Armed (trained, waiting for the subnet manager) is dormant."""
    logical = str(item.get("logical_state") or "").lower()
    if logical == "active":
        return "up"
    if logical == "down":
        return "down"
    if logical in ("init", "initialize", "armed"):
        return "dormant"
    if "logical_state" not in item:
        raise Bad("no 'logical_state'")
    physical = str(item.get("physical_state") or "").lower()
    return "down" if physical in ("disabled", "polling", "sleep") else "unknown"


def speed_bps(item: dict) -> int | None:
    speed, width = item.get("active_speed"), item.get("active_width")
    if not isinstance(speed, str) or not isinstance(width, str):
        return None
    lane = LANE_BPS.get(speed.upper().removeprefix("IB_").split()[0] if speed.strip() else "")
    lanes = re.search(r"(\d+)\s*[xX]", width)
    return lane * int(lanes.group(1)) if lane and lanes else None


def port_sample(ref: PortRef, ts: int, counters: dict[str, int]) -> PortSample:
    mtu = ref.item.get("mtu")
    return PortSample(device=ref.device, port=ref.port, ts=ts, oper_status=oper_status(ref.item),
                      speed_bps=speed_bps(ref.item),
                      mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) and 0 < mtu <= 1 << 20 else None,
                      **counters)


def device_facts(fabric: Fabric, ts: int) -> list[DeviceFacts]:
    ports: dict[str, int] = defaultdict(int)
    for ref in fabric.switch_ports():
        ports[ref.device] += 1
    out = []
    for guid, item in fabric.switches.items():
        name = fabric.system_names[guid]
        words = [w for w in (item.get("vendor"), item.get("model") or item.get("description"))
                 if isinstance(w, str) and w and w != "N/A"]  # UFM 6.1 names the model only in description
        descr = " ".join(words)
        if isinstance(item.get("fw_version"), str) and item["fw_version"] not in ("", "N/A"):
            descr += f", firmware {item['fw_version']}"
        out.append(DeviceFacts(device=name, ts=ts, sys_name=name[:255], sys_descr=descr[:1024] or None,
                               interfaces=ports[name], lldp_chassis_id=guid))
    return out


def end_of(fabric: Fabric, guid: Any, number: Any, dname: Any) -> PortRef | None:
    if not isinstance(guid, str) or not isinstance(number, (str, int)) or isinstance(number, bool):
        return None
    ref = fabric.ports.get(f"{guid_of(guid)}_{number}")
    if ref is not None:
        return ref
    system = fabric.system_names.get(guid_of(guid))
    port = dname if isinstance(dname, str) and dname and dname != "N/A" else str(number)
    if system is None or not _IDENT.match(port):
        return None
    return PortRef(f"{guid_of(guid)}_{number}", system, port, guid_of(guid) in fabric.switches, guid_of(guid), {})


def neighbors(fabric: Fabric, items: list, route: str, problems: Problems, ts: int
              ) -> tuple[list[LldpNeighbor], dict[str, PortRef]]:
    """LldpNeighbor records for each reported switch end of each link, and each end's peer."""
    out: list[LldpNeighbor] = []
    peers: dict[str, PortRef] = {}
    problems.totals[route] = len(items)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            problems.note(route, i, item, "not an object")
            continue
        descriptions = (item.get("source_port_node_description"), item.get("destination_port_node_description"))
        if any(isinstance(d, str) and AGGREGATION_NODE in d for d in descriptions):
            continue  # a SHARP aggregation node inside a switch, not a cable
        a = end_of(fabric, item.get("source_guid"), item.get("source_port"), item.get("source_port_dname"))
        b = end_of(fabric, item.get("destination_guid"), item.get("destination_port"),
                   item.get("destination_port_dname"))
        if a is None or b is None:
            missing = [k for k in ("source_guid", "source_port", "destination_guid", "destination_port")
                       if k not in item]
            problems.note(route, i, item,
                          f"no {', '.join(map(repr, missing))}" if missing else "an end is no known port")
            continue
        peers[a.name], peers[b.name] = b, a
        for local, remote in ((a, b), (b, a)):
            if local.switch:
                out.append(LldpNeighbor(device=local.device, port=local.port, ts=ts, remote_name=remote.device[:255],
                                        remote_port=remote.port[:255], remote_chassis_id=remote.guid))
    return out, peers


def parse_time(value: Any, zone: ZoneInfo) -> int | None:
    """UFM times -> ns: epoch numbers (s, ms, us or ns by size) or 'YYYY-MM-DD HH:MM:SS[.fff]' in the
    UFM server's zone."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        scale = NS if value < 1e11 else 10**6 if value < 1e14 else 10**3 if value < 1e17 else 1
        return int(value * scale)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace(" ", "T", 1))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return int(moment.timestamp()) * NS + moment.microsecond * 1000
    return None


def snapshot_counters(answer: Any, zone: ZoneInfo) -> tuple[int | None, dict[str, Any]]:
    """A Monitoring snapshot answer {"<time>": {"Port": {"<port name>": {"statistics": {"<attribute>":
    value}, "guid": ..., "name": ...}}}} -> (the newest time in ns, each port's entry). Raises Bad when
    the shape is different."""
    if not isinstance(answer, dict) or not answer:
        raise Bad("expected an object keyed by time")
    key = max(answer, key=lambda k: parse_time(k, zone) or 0)
    scope = answer[key]
    ports = scope.get("Port") if isinstance(scope, dict) else None
    if not isinstance(ports, dict):
        raise Bad(f"no \"Port\" object under {key!r}")
    return parse_time(key, zone), {guid_of(k): v for k, v in ports.items()}


def counter_values(entry: Any) -> dict[str, int]:
    """One port's snapshot entry -> PortSample counters, from its "statistics" object. Raises Bad when
    there is none. A raw value is an integer (or an integral float below 2^53), possibly under its
    function name ({"RAW": n}); others are left out."""
    statistics = entry.get("statistics") if isinstance(entry, dict) else None
    if not isinstance(statistics, dict):
        raise Bad("no \"statistics\" object")
    out = {}
    for counter, (attribute, scale) in COUNTERS.items():
        value = statistics.get(attribute)
        if isinstance(value, dict):
            value = value.get("RAW")
        value = exact(value)
        if value is not None:
            out[counter] = (value * scale) & U64  # a 64-bit counter of octets, wrapping like one
    return out


def exact(value: Any) -> int | None:
    """A counter value as an exact unsigned 64-bit integer; a float only where it is exact (integral,
    below 2^53)."""
    if isinstance(value, float) and value.is_integer() and 0 <= value < 2**53:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64:
        return value
    return None
