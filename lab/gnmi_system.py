"""The lab gNMI target's openconfig-system state: /system/state of the switch (Get only), what a
collector reads for inventory (hostname, software version, boot time, uptime).

Namespaces share the machine's UTS name, so the hostname is the switch's name given on the command
line; boot time and uptime are the machine's (/proc/stat btime, /proc/uptime).
"""

from __future__ import annotations

import json
import platform
import time
from datetime import UTC, datetime

from pygnmi.spec.v080 import gnmi_pb2

import nms

LEAVES = ("hostname", "software-version", "boot-time", "up-time", "current-datetime")
UINT64 = ("boot-time", "up-time")  # timeticks64: nanoseconds
PATH = gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="system"), gnmi_pb2.PathElem(name="state")])


def is_system(prefix: gnmi_pb2.Path | None, path: gnmi_pb2.Path) -> bool:
    elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
    return bool(elems) and elems[0].name.split(":", 1)[-1] == "system"


def selected(prefix: gnmi_pb2.Path | None, path: gnmi_pb2.Path) -> tuple[str, ...] | None:
    """The leaves of /system/state a system path selects; None when it selects nothing served here."""
    names = [e.name.split(":", 1)[-1] for e in [*(prefix.elem if prefix is not None else ()), *path.elem]]
    if len(names) == 1 or (len(names) == 2 and names[1] == "state"):
        return LEAVES
    if len(names) == 3 and names[1] == "state" and names[2] in LEAVES:
        return (names[2],)
    return None


def state(hostname: str) -> dict[str, str | int]:
    now_ns = time.time_ns()
    with open("/proc/stat") as fh:
        btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    with open("/proc/uptime") as fh:
        uptime_s = float(fh.read().split()[0])
    return {"hostname": hostname,
            "software-version": f"nms-lab gNMI target {nms.__version__} (Linux {platform.release()})",
            "boot-time": btime * 10**9, "up-time": int(uptime_s * 1e9),
            "current-datetime": datetime.fromtimestamp(now_ns / 1e9, UTC).isoformat(timespec="seconds")}


def notification(values: dict[str, str | int], leaves: tuple[str, ...], encoding: int) -> gnmi_pb2.Notification:
    """PROTO: an update per leaf under prefix /system/state; JSON/JSON_IETF: one update at
    /system/state whose value is the container (uint64 as strings in JSON_IETF, RFC 7951)."""
    n = gnmi_pb2.Notification(timestamp=time.time_ns())
    if encoding == gnmi_pb2.PROTO:
        n.prefix.CopyFrom(PATH)
        for leaf in leaves:
            u = n.update.add()
            u.path.elem.add(name=leaf)
            if leaf in UINT64:
                u.val.uint_val = values[leaf]
            else:
                u.val.string_val = values[leaf]
        return n
    ietf = encoding == gnmi_pb2.JSON_IETF
    doc = {leaf: str(values[leaf]) if ietf and leaf in UINT64 else values[leaf] for leaf in leaves}
    u = n.update.add()
    u.path.CopyFrom(PATH)
    if ietf:
        u.val.json_ietf_val = json.dumps({f"openconfig-system:{k}": v for k, v in doc.items()}).encode()
    else:
        u.val.json_val = json.dumps(doc).encode()
    return n
