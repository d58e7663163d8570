"""The openconfig-interfaces tree the lab's gNMI target serves (lab/gnmi_target.py): its leaves,
how each is read from sysfs, which leaves a gNMI path selects, and the messages that carry them.

Every leaf lives under /interfaces/interface[name=X] and is a scalar: counters, MTU and ifindex
are unsigned integers (`uint_val`), the rest strings (`string_val`). Values are read straight from
the kernel of the network namespace the process runs in (/sys/class/net/X/...), so they are the
same numbers `ip -s link` and snmpd show there.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import time
from dataclasses import dataclass

from pygnmi.spec.v080 import gnmi_pb2

SYS_NET = "/sys/class/net"
# leaf under the interface -> sysfs file under /sys/class/net/<if>/
COUNTERS = {
    "state/counters/in-octets": "statistics/rx_bytes", "state/counters/out-octets": "statistics/tx_bytes",
    "state/counters/in-pkts": "statistics/rx_packets", "state/counters/out-pkts": "statistics/tx_packets",
    "state/counters/in-errors": "statistics/rx_errors", "state/counters/out-errors": "statistics/tx_errors",
    "state/counters/in-discards": "statistics/rx_dropped", "state/counters/out-discards": "statistics/tx_dropped",
    "state/counters/in-multicast-pkts": "statistics/multicast",
}
# leaves that change rarely: served ON_CHANGE (TARGET_DEFINED) and watched through rtnetlink
STATUS = ("state/name", "state/oper-status", "state/admin-status", "state/mtu", "state/ifindex",
          "ethernet/state/port-speed")
LEAVES = (*COUNTERS, *STATUS)
# /sys/class/net/<if>/operstate (RFC 2863 words) -> openconfig-interfaces oper-status
OPER = {"up": "UP", "down": "DOWN", "testing": "TESTING", "unknown": "UNKNOWN", "dormant": "DORMANT",
        "notpresent": "NOT_PRESENT", "lowerlayerdown": "LOWER_LAYER_DOWN"}
IFF_UP = 0x1
# openconfig-if-ethernet ETHERNET_SPEED identities
SPEEDS = {10**7: "SPEED_10MB", 10**8: "SPEED_100MB", 10**9: "SPEED_1GB", 25 * 10**8: "SPEED_2500MB",
          5 * 10**9: "SPEED_5GB", 10**10: "SPEED_10GB", 25 * 10**9: "SPEED_25GB", 40 * 10**9: "SPEED_40GB",
          50 * 10**9: "SPEED_50GB", 10**11: "SPEED_100GB", 2 * 10**11: "SPEED_200GB", 4 * 10**11: "SPEED_400GB",
          8 * 10**11: "SPEED_800GB"}
ORIGINS = ("", "openconfig", "openconfig-interfaces")

Values = dict[str, int | str]  # leaf -> value, one interface
Snapshot = dict[str, tuple[int, Values]]  # interface -> (time.time_ns() when read, values)


def speed_identity(bps: int) -> str:
    return "openconfig-if-ethernet:" + SPEEDS.get(bps, "SPEED_UNKNOWN")


class PathError(Exception):
    """A path this target does not serve; `code` is the grpc.StatusCode name to answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Selection:
    """What one path selects: an interface (None = every one) and leaves under it."""

    name: str | None
    leaves: frozenset[str]

    def only(self, leaves) -> Selection:
        return Selection(self.name, self.leaves & frozenset(leaves))


def path_text(prefix: gnmi_pb2.Path | None, path: gnmi_pb2.Path) -> str:
    elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
    return "/" + "/".join(e.name + "".join(f"[{k}={v}]" for k, v in sorted(e.key.items())) for e in elems)


def select(prefix: gnmi_pb2.Path | None, path: gnmi_pb2.Path) -> Selection:
    """The selection of prefix + path: elements match by name (module prefixes dropped); the list
    key `name` is an interface name, `*` or absent (every interface). Raises PathError."""
    text = path_text(prefix, path)
    for p in (prefix, path):
        if p is not None and p.origin not in ORIGINS:
            raise PathError("NOT_FOUND", f"{text}: unknown origin {p.origin!r} (this target serves openconfig)")
        if p is not None and p.element:
            raise PathError("INVALID_ARGUMENT", f"{text}: the deprecated string path `element` is not supported; "
                                                "use `elem`")
    elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
    names = [e.name.split(":", 1)[-1] for e in elems]
    if not elems:
        return Selection(None, frozenset(LEAVES))
    if names[0] != "interfaces" or (len(names) > 1 and names[1] != "interface"):
        raise PathError("NOT_FOUND", f"no such path {text}: this target serves /interfaces/interface "
                                     "(openconfig-interfaces)")
    if any(e.key for i, e in enumerate(elems) if i != 1):
        raise PathError("NOT_FOUND", f"no such path {text}: only interface has a key (name)")
    key = dict(elems[1].key) if len(elems) > 1 else {}
    if set(key) - {"name"}:
        raise PathError("NOT_FOUND", f"no such path {text}: interface has one key, name")
    rest = names[2:]
    leaves = frozenset(leaf for leaf in LEAVES if leaf.split("/")[:len(rest)] == rest)
    if not leaves:
        raise PathError("NOT_FOUND", f"no such path {text}")
    name = key.get("name")
    return Selection(None if name in (None, "*") else name, leaves)


class Kernel:
    """Reads the interfaces of this process's network namespace from sysfs (under `ip netns exec`,
    /sys is that namespace's)."""

    def __init__(self, patterns: list[str] | None = None, speed_bps: int = 0, root: str = SYS_NET):
        self.patterns, self.root = patterns, root
        self.speed = speed_identity(speed_bps)

    def wanted(self, name: str) -> bool:
        if not self.patterns:
            return name != "lo"
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root) if self.wanted(n))
        except FileNotFoundError:
            return []

    def read(self, counters: bool = True, status: bool = True, names=None) -> Snapshot:
        """One pass over the interfaces (all served ones, or `names`); an interface that vanishes
        meanwhile is left out."""
        out: Snapshot = {}
        files = list(COUNTERS.items()) if counters else []
        for name in self.names() if names is None else [n for n in names if self.wanted(n)]:
            base = f"{self.root}/{name}/"
            ts = time.time_ns()
            try:
                values: Values = {leaf: int(_read(base + f)) for leaf, f in files}
                if status:
                    values["state/name"] = name
                    values["state/oper-status"] = OPER.get(_read(base + "operstate").strip().decode(), "UNKNOWN")
                    values["state/admin-status"] = "UP" if int(_read(base + "flags"), 16) & IFF_UP else "DOWN"
                    values["state/mtu"] = int(_read(base + "mtu"))
                    values["state/ifindex"] = int(_read(base + "ifindex"))
                    values["ethernet/state/port-speed"] = self.speed
            except (OSError, ValueError):  # gone between listdir and read (ENOENT, ENODEV)
                continue
            out[name] = (ts, values)
        return out


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


# --- messages --------------------------------------------------------------------------------

def _elems(text: str) -> list[gnmi_pb2.PathElem]:
    return [gnmi_pb2.PathElem(name=p) for p in text.split("/")]


LEAF_PATH = {leaf: gnmi_pb2.Path(elem=_elems(leaf)) for leaf in LEAVES}
INTERFACES = gnmi_pb2.Path(elem=_elems("interfaces"))


@functools.lru_cache(maxsize=65536)
def prefix_of(name: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="interfaces"),
                               gnmi_pb2.PathElem(name="interface", key={"name": name})])


def fill(n: gnmi_pb2.Notification, name: str, ts: int, values: Values, leaves) -> None:
    """Make `n` the notification of interface `name`: the prefix, then one update per leaf (in
    LEAVES order) that `values` has."""
    n.timestamp = ts
    n.prefix.CopyFrom(prefix_of(name))
    for leaf in LEAVES:
        if leaf in leaves and leaf in values:
            v = values[leaf]
            u = n.update.add()
            u.path.CopyFrom(LEAF_PATH[leaf])
            if isinstance(v, int):
                u.val.uint_val = v
            else:
                u.val.string_val = v


def responses(snapshot: Snapshot, wanted: dict[str, frozenset[str]]) -> list[gnmi_pb2.SubscribeResponse]:
    """A SubscribeResponse per interface of `wanted` (interface -> leaves) found in `snapshot`."""
    out = []
    for name, leaves in wanted.items():
        if name in snapshot and leaves:
            r = gnmi_pb2.SubscribeResponse()
            ts, values = snapshot[name]
            fill(r.update, name, ts, values, leaves)
            out.append(r)
    return out


def deleted(name: str) -> gnmi_pb2.SubscribeResponse:
    """The interface is gone: a delete of the whole list entry (the prefix itself)."""
    r = gnmi_pb2.SubscribeResponse()
    r.update.timestamp = time.time_ns()
    r.update.prefix.CopyFrom(prefix_of(name))
    r.update.delete.add()
    return r


def names_of(selections) -> list[str] | None:
    """The interfaces the selections name, or None when one takes them all (read them all)."""
    if any(sel.name is None for sel in selections):
        return None
    return sorted({sel.name for sel in selections})


def wanted_of(selections, names) -> dict[str, frozenset[str]]:
    """interface -> union of the leaves every selection asks of it."""
    out: dict[str, frozenset[str]] = {}
    for sel in selections:
        for name in names if sel.name is None else [sel.name] if sel.name in names else []:
            out[name] = out.get(name, frozenset()) | sel.leaves
    return out


def json_doc(snapshot: Snapshot, wanted: dict[str, frozenset[str]], ietf: bool) -> bytes:
    """The value of /interfaces, pruned to `wanted`: {"openconfig-interfaces:interface": [...]}.
    JSON_IETF (RFC 7951) writes 64-bit counters as strings and qualifies the augmenting module's node."""
    entries = []
    for name, leaves in wanted.items():
        if name not in snapshot:
            continue
        entry: dict = {"name": name}
        values = snapshot[name][1]
        for leaf in LEAVES:
            if leaf not in leaves or leaf not in values:
                continue
            v = values[leaf]
            node, parts = entry, leaf.split("/")
            for part in parts[:-1]:
                node = node.setdefault("openconfig-if-ethernet:ethernet" if ietf and part == "ethernet" else part, {})
            node[parts[-1]] = str(v) if ietf and leaf in COUNTERS else v
        entries.append(entry)
    return json.dumps({"openconfig-interfaces:interface": entries}).encode()
