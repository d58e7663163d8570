"""gNMI notifications -> PortSample (collectors/gnmi/collector.py).

The paths are openconfig-interfaces' (and openconfig-if-ethernet's port speed) under
/interfaces/interface[name=...]. A Notification's prefix and each update's path are joined, module
prefixes ("openconfig-interfaces:") dropped, so a target that sends full paths and one that sends a
prefix read the same. Values may be typed (uint_val, string_val) or JSON scalars (JSON_IETF sends
uint64 as a string); a value of the wrong kind is noted as a problem and left out, the rest kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nms.records import PollProblem, PortSample

# leaf under the interface -> PortSample field
COUNTERS = {
    "state/counters/in-octets": "in_octets", "state/counters/out-octets": "out_octets",
    "state/counters/in-pkts": "in_pkts", "state/counters/out-pkts": "out_pkts",
    "state/counters/in-errors": "in_errors", "state/counters/out-errors": "out_errors",
    "state/counters/in-discards": "in_discards", "state/counters/out-discards": "out_discards",
}
OPER = {"UP": "up", "DOWN": "down", "TESTING": "testing", "UNKNOWN": "unknown", "DORMANT": "dormant",
        "NOT_PRESENT": "notPresent", "LOWER_LAYER_DOWN": "lowerLayerDown"}
STATUS_LEAVES = ("state/oper-status", "state/mtu", "ethernet/state/port-speed")
# openconfig-if-ethernet ETHERNET_SPEED identities
SPEEDS = {"SPEED_10MB": 10**7, "SPEED_100MB": 10**8, "SPEED_1GB": 10**9, "SPEED_2500MB": 25 * 10**8,
          "SPEED_5GB": 5 * 10**9, "SPEED_10GB": 10**10, "SPEED_25GB": 25 * 10**9, "SPEED_40GB": 40 * 10**9,
          "SPEED_50GB": 50 * 10**9, "SPEED_100GB": 10**11, "SPEED_200GB": 2 * 10**11, "SPEED_400GB": 4 * 10**11,
          "SPEED_800GB": 8 * 10**11}
U64 = (1 << 64) - 1


@dataclass
class Port:
    """What is known of one interface: the latest value of every leaf, and when counters last came."""

    leaves: dict[str, Any] = field(default_factory=dict)
    counters_ts: int | None = None


@dataclass
class Update:
    """One notification's meaning: interfaces whose counters it carried, whose status changed."""

    counters: set[str] = field(default_factory=set)
    status: set[str] = field(default_factory=set)
    problems: list[PollProblem] = field(default_factory=list)


def _name(elem) -> str:
    return elem.name.split(":", 1)[-1]


def _locate(elems) -> tuple[str, list[str]] | None:
    """(interface name, the element names under it) of a path, or None when it is not about one."""
    names = [_name(e) for e in elems]
    for i in range(1, len(names)):
        if names[i] == "interface" and names[i - 1] == "interfaces":
            key = elems[i].key.get("name")
            return (key, names[i + 1:]) if key else None
    return None


def interface_leaf(prefix, path) -> tuple[str, str] | None:
    """(interface name, leaf path under it) of an update, or None when it is not about an interface."""
    found = _locate([*(prefix.elem if prefix is not None else ()), *path.elem])
    return (found[0], "/".join(found[1])) if found is not None else None


def scalar(value) -> Any:
    kind = value.WhichOneof("value")
    if kind in ("json_ietf_val", "json_val"):
        return json.loads(getattr(value, kind))
    return getattr(value, kind) if kind else None


def _convert(leaf: str, raw: Any) -> Any:
    """The leaf's value as the record wants it; ValueError when it is not of the leaf's kind."""
    if leaf in COUNTERS or leaf == "state/mtu":
        number = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= U64:
            raise ValueError(f"expected an unsigned integer, got {raw!r}")
        return number
    if leaf == "state/oper-status":
        status = OPER.get(str(raw).split(":", 1)[-1].upper())
        if status is None:
            raise ValueError(f"unknown oper-status {raw!r}")
        return status
    if leaf == "ethernet/state/port-speed":
        return SPEEDS.get(str(raw).split(":", 1)[-1].upper(), 0)
    return raw


def apply(ports: dict[str, Port], notification, wanted=lambda name: True) -> Update:
    """Fold one Notification into `ports`."""
    out = Update()
    # most targets put the interface in the prefix: find it once per notification, not per leaf
    in_prefix = _locate(notification.prefix.elem) if notification.HasField("prefix") else None
    for upd in notification.update:
        if in_prefix is not None:
            found = (in_prefix[0], "/".join([*in_prefix[1], *(_name(e) for e in upd.path.elem)]))
        else:
            found = interface_leaf(notification.prefix, upd.path)
        if found is None or not wanted(found[0]):
            continue
        name, leaf = found
        if leaf not in COUNTERS and leaf not in STATUS_LEAVES:
            continue
        try:
            value = _convert(leaf, scalar(upd.val))
        except (ValueError, json.JSONDecodeError) as e:
            out.problems.append(PollProblem(what=f"{name} {leaf}", reason=str(e)))
            continue
        port = ports.setdefault(name, Port())
        if leaf in COUNTERS:
            out.counters.add(name)
        elif port.leaves.get(leaf) != value:
            out.status.add(name)
        port.leaves[leaf] = value
    for name in out.counters:
        ports[name].counters_ts = notification.timestamp or None
    for path in notification.delete:  # an interface removed: forget it
        found = interface_leaf(notification.prefix, path)
        if found is not None and found[1] == "":
            ports.pop(found[0], None)
    return out


def sample(device: str, name: str, port: Port, ts: int, counters: bool) -> PortSample:
    """A PortSample of the interface: with its counters (at the time the target read them), or the
    status alone (a streamed change, which must not feed the rate math)."""
    leaves = port.leaves
    values = {f: leaves[leaf] for leaf, f in COUNTERS.items() if leaf in leaves} if counters else {}
    return PortSample(device=device, port=name, ts=ts, oper_status=leaves.get("state/oper-status"),
                      mtu=leaves.get("state/mtu") if (leaves.get("state/mtu") or 0) <= 1 << 20 else None,
                      speed_bps=leaves.get("ethernet/state/port-speed") or None, **values)
