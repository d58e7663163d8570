"""gNMI Get of openconfig-system /system/state -> DeviceFacts (collectors/gnmi/collector.py).

A target answers the Get either as one JSON (JSON_IETF or JSON) value of the container, at
/system/state or at /system ({"state": {...}}), or as typed leaves under /system/state (PROTO-style).
Module prefixes are dropped; uint64 leaves may come as JSON strings (RFC 7951). A leaf of the wrong
kind is noted and left out. Without an answer the facts fall back to what Capabilities says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pygnmi.spec.v080 import gnmi_pb2

from collectors.gnmi.model import scalar
from nms.records import DeviceFacts, PollProblem

PATH = gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="system"), gnmi_pb2.PathElem(name="state")])
NS_PER_TICK = 10**7  # DeviceFacts.uptime_ticks are sysUpTime's 1/100 s


@dataclass(frozen=True)
class SystemState:
    hostname: str | None = None
    software_version: str | None = None
    boot_ns: int | None = None  # boot-time, else current time - up-time

    def facts(self, device: str, ts: int, interfaces: int, gnmi_version: str) -> DeviceFacts:
        uptime = (ts - self.boot_ns) // NS_PER_TICK if self.boot_ns is not None and ts > self.boot_ns else None
        return DeviceFacts(device=device, ts=ts, sys_name=(self.hostname or device)[:255], interfaces=interfaces,
                           sys_descr=(self.software_version or f"gNMI {gnmi_version or '?'} target")[:1024],
                           uptime_ticks=uptime)


def _name(text: str) -> str:
    return text.split(":", 1)[-1]


def _leaves(notifications) -> dict[str, Any]:
    """The /system/state leaves of a GetResponse's notifications, however the target shaped them."""
    found: dict[str, Any] = {}
    for n in notifications:
        base = [_name(e.name) for e in n.prefix.elem] if n.HasField("prefix") else []
        for u in n.update:
            names = base + [_name(e.name) for e in u.path.elem]
            value = scalar(u.val)
            if names == ["system"] and isinstance(value, dict):
                value = next((v for k, v in value.items() if _name(k) == "state"), None)
                names = ["system", "state"]
            if names == ["system", "state"] and isinstance(value, dict):
                found.update({_name(k): v for k, v in value.items()})
            elif len(names) == 3 and names[:2] == ["system", "state"]:
                found[names[2]] = value
    return found


def _ns(raw: Any) -> int:
    number = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < 1 << 64:
        raise ValueError(f"expected nanoseconds (uint64), got {raw!r}")
    return number


def system_state(response: gnmi_pb2.GetResponse, now_ns: int, problems: list[PollProblem]) -> SystemState:
    try:
        leaves = _leaves(response.notification)
    except json.JSONDecodeError as e:
        problems.append(PollProblem(what="/system/state", reason=f"not JSON: {e}"))
        return SystemState()
    texts = {}
    for leaf in ("hostname", "software-version"):
        value = leaves.get(leaf)
        if value is not None and not isinstance(value, str):
            problems.append(PollProblem(what=f"/system/state/{leaf}", reason=f"expected a string, got {value!r}"))
        elif value:
            texts[leaf] = value
    boot_ns = None
    for leaf in ("boot-time", "up-time"):
        if leaf in leaves and boot_ns is None:
            try:
                value = _ns(leaves[leaf])
                boot_ns = value if leaf == "boot-time" else now_ns - value
            except ValueError as e:
                problems.append(PollProblem(what=f"/system/state/{leaf}", reason=str(e)))
    return SystemState(texts.get("hostname"), texts.get("software-version"), boot_ns)
