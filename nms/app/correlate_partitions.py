"""How a fabric is split for sharded correlation, and which partitions a `correlate` member owns
(docs/cluster.md). Today one member owns every partition; routing windows to partition owners is a
later slice.

cluster.correlate.partitions:
- `fabric`: one partition, the whole fabric (the default: a correlator sees every path);
- `leaf`: one partition per leaf switch (`leaf:<name>`: the leaf and the hosts with a NIC on it; a host
  on several leaves, e.g. one NIC per rail, is in each), and `core`: the spines, superspines and
  other switches. A path between two leaves crosses three partitions (both leaves' and `core`).
Ownership is rendezvous hashing (nms/rendezvous.py) over the live members, as for switches.
"""

from __future__ import annotations

from collections.abc import Iterable

from nms.config.models import FabricConfig
from nms.rendezvous import assign

CORE = "core"
WHOLE = "fabric"


def partitions(fabric: FabricConfig, by: str) -> dict[str, set[str]]:
    """partition name -> the devices (switches and hosts) in it."""
    if by == WHOLE:
        return {WHOLE: {s.name for s in fabric.switches} | {h.name for h in fabric.hosts}}
    if by != "leaf":
        raise ValueError(f"cluster.correlate.partitions: unknown split {by!r} (fabric, leaf)")
    parts: dict[str, set[str]] = {f"leaf:{s.name}": {s.name} for s in fabric.switches if s.role == "leaf"}
    parts[CORE] = {s.name for s in fabric.switches if s.role != "leaf"}
    for host in fabric.hosts:
        for nic in host.nics:
            if nic.switch is not None and f"leaf:{nic.switch}" in parts:
                parts[f"leaf:{nic.switch}"].add(host.name)
    return parts


def owned(parts: Iterable[str], members: Iterable[str], member: str) -> set[str]:
    """The partitions `member` owns among the live `members` (it counts as live itself)."""
    return assign(parts, {*members, member})[member]


def partitions_of(parts: dict[str, set[str]], devices: Iterable[str]) -> set[str]:
    """The partitions holding any of the devices (those a window whose path crosses them concerns)."""
    wanted = set(devices)
    return {name for name, members in parts.items() if members & wanted}
