"""How a fabric is split for sharded correlation, which partitions a `correlate` member owns, which
partitions a record concerns and which one owns a finding's element (docs/cluster.md). Pure.

cluster.correlate.partitions:
- `fabric`: one partition, the whole fabric (the default: one member correlates everything);
- `leaf`: one partition per leaf switch (`leaf:<name>`: the leaf and the hosts with a NIC on it; a host
  on several leaves, e.g. one NIC per rail, is in each), and `core`: the spines, superspines and
  other switches. In a 2-tier fabric a path between two leaves crosses exactly its two leaves and a
  spine, so a probe window concerns its ends' leaves, and `core` when they differ: no trace needed.
- `pod`: one partition per pod of a 3-tier fabric (`pod:<its first switch>`: the leaves and spines the
  configured cables connect below the superspines, and their hosts), and `core`: the superspines. A
  path between two pods crosses its two pods and the superspines; within a pod, the pod only: the
  same rule as `leaf`. A 2-tier fabric is one pod.
Ownership is rendezvous hashing (nms/rendezvous.py) over the live members, as for switches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nms.config.models import FabricConfig
from nms.rendezvous import assign

CORE = "core"
WHOLE = "fabric"
# kinds every member takes: the clock solve is one least-squares over the whole probe graph (the network
# effect), a job's NCCL records and slowdowns span partitions, and a switch's ports end links of several
# partitions (a spine's port to leaf2 is evidence on a link leaf2's owner judges; traceroute hops map to
# any switch's addresses). Switch records are few beside probe windows (one per port per poll).
EVERY_MEMBER = frozenset({"clock_edges", "clock_solutions", "nccl_comms", "nccl_collectives", "nccl_proxy_ops",
                          "nccl_proxy_steps", "nccl_step_stats", "nccl_rdma_qps", "port_samples", "port_rates",
                          "queue_samples", "queue_rates", "link_events", "interface_addresses"})


def partitions(fabric: FabricConfig, by: str) -> dict[str, set[str]]:
    """partition name -> the devices (switches and hosts) in it."""
    if by == WHOLE:
        return {WHOLE: {s.name for s in fabric.switches} | {h.name for h in fabric.hosts}}
    if by == "leaf":
        groups = {f"leaf:{s.name}": {s.name} for s in fabric.switches if s.role == "leaf"}
    elif by == "pod":
        groups = _pods(fabric)
    else:
        raise ValueError(f"cluster.correlate.partitions: unknown split {by!r} (fabric, leaf, pod)")
    grouped = set().union(*groups.values())
    parts = {**groups, CORE: {s.name for s in fabric.switches if s.name not in grouped}}
    part_of = {switch: name for name, switches in groups.items() for switch in switches}
    for host in fabric.hosts:
        for nic in host.nics:
            if nic.switch in part_of:
                parts[part_of[nic.switch]].add(host.name)
    return parts


def _pods(fabric: FabricConfig) -> dict[str, set[str]]:
    """The pods of a 3-tier fabric: the switches below the superspines that the configured cables
    connect (leaves and their spines), each named after its first switch; the superspines are core.
    A 2-tier fabric is one pod."""
    below = {s.name for s in fabric.switches if s.role != "superspine"}
    pod = {name: name for name in below}  # union-find: switch -> a switch of its pod

    def root(name: str) -> str:
        while pod[name] != name:
            pod[name] = pod[pod[name]]
            name = pod[name]
        return name

    for link in fabric.links:
        a, b = link.a.split(":", 1)[0], link.b.split(":", 1)[0]
        if a in below and b in below:
            pod[root(a)] = root(b)
    groups: dict[str, set[str]] = {}
    for name in below:
        groups.setdefault(root(name), set()).add(name)
    return {f"pod:{min(members)}": members for members in groups.values()}


def owned(parts: Iterable[str], members: Iterable[str], member: str) -> set[str]:
    """The partitions `member` owns among the live `members` (it counts as live itself)."""
    return assign(parts, {*members, member})[member]


def partitions_of(parts: dict[str, set[str]], devices: Iterable[str]) -> set[str]:
    """The partitions holding any of the devices (those a window whose path crosses them concerns)."""
    wanted = set(devices)
    return {name for name, members in parts.items() if members & wanted}


class Split:
    """A fabric's partitions, with the two questions a sharded member asks: which partitions does a
    record concern (routing), and which one partition owns a finding's element (incidents)."""

    def __init__(self, fabric: FabricConfig, by: str) -> None:
        self.by = by
        self.parts = partitions(fabric, by)
        self.of_device: dict[str, set[str]] = {}
        for name, devices in self.parts.items():
            for device in devices:
                self.of_device.setdefault(device, set()).add(name)
        # a switch -> its partition, where it is not core (a leaf's own; a pod's leaves and spines)
        switches = {s.name for s in fabric.switches}
        self.switch_part = {d: name for name, devices in self.parts.items() if name != CORE
                            for d in devices & switches}
        self.of_nic = {(h.name, n.name): self.switch_part[n.switch] for h in fabric.hosts for n in h.nics
                       if n.switch in self.switch_part}

    def _end(self, host: str, nic: str | None) -> set[str]:
        if nic is not None and (host, nic) in self.of_nic:
            return {self.of_nic[(host, nic)]}
        return self.of_device.get(host, set())

    def of_record(self, kind: str, record: Any) -> set[str] | None:
        """The partitions a record concerns; None: every member takes it (EVERY_MEMBER, or a record
        naming nothing this split knows: better correlated twice than by no one)."""
        if self.by == WHOLE:
            return {WHOLE}
        if kind in EVERY_MEMBER:
            return None
        src, dst = getattr(record, "src_host", None), getattr(record, "dst_host", None)
        if src is not None and dst is not None:  # probe windows, path events, probe paths
            ends = [self._end(src, getattr(record, "src_nic", None)), self._end(dst, getattr(record, "dst_nic", None))]
            if not ends[0] or not ends[1]:
                return None
            return ends[0] | ends[1] | ({CORE} if ends[0] != ends[1] else set())
        tags = getattr(record, "tags", None)  # a generic point
        host = tags.get("host") if isinstance(tags, dict) else getattr(record, "host", None)
        if host is not None:
            return self._end(host, getattr(record, "nic", None)) or None
        device = tags.get("device") if isinstance(tags, dict) else getattr(record, "device", None)
        return (self.of_device.get(device) or None) if device is not None else None

    def _device_in(self, side: str) -> str | None:
        """The known device or host a link end `dev:port` names (names may hold ':': the longest wins)."""
        cuts = [i for i, c in enumerate(side) if c == ":"]
        for i in reversed(cuts):
            if side[:i] in self.of_device:
                return side[:i]
        return side if side in self.of_device else None

    def owner(self, element_kind: str, element: str) -> str:
        """The one partition whose owner opens incidents of this element: a link with a switch end
        outside core (a leaf-spine link, a host's access link: the leaf's; in a pod split a spine's
        link to a superspine too: the pod's) that switch's partition (the first in name order); a
        NIC its switch's; a switch its own; a host its first partition (in name order); core
        switches and anything else (core-only links, jobs, host pairs, roles, what the inventory
        does not name) `core`."""
        if self.by == WHOLE:
            return WHOLE
        if element_kind == "link":
            ends = [(d, side[len(d) + 1:]) for side in element.split("--") if (d := self._device_in(side)) is not None]
            switches = sorted(self.switch_part[d] for d, _ in ends if d in self.switch_part)
            hosts = sorted(p for d, port in ends for p in self._end(d, port) if p != CORE)  # a host's NIC end
            return (switches or hosts or [CORE])[0]
        if element_kind == "nic":
            host, _, nic = element.partition(":")
            ends = sorted(self._end(host, nic) - {CORE})
            return ends[0] if ends else CORE
        if element_kind in ("device", "host"):
            if element in self.switch_part:
                return self.switch_part[element]
            ends = sorted(self.of_device.get(element, set()) - {CORE})
            return ends[0] if ends else CORE
        return CORE


def owned_findings(findings: Sequence[Any], owner: Callable[[str, str], str], owned_parts: set[str]) -> list[Any]:
    """The findings whose incidents this member opens: those whose element's partition it owns. A finding
    explained by another (a dead switch's links: `explains`) goes with the explaining one's owner, so
    parent and children stay in one member."""
    parent_of = {key: f for f in findings for key in f.explains if key != f.dedup_key}
    kept = []
    for f in findings:
        decides = parent_of.get(f.dedup_key, f)
        if owner(decides.element_kind, decides.element) in owned_parts:
            kept.append(f)
    return kept
