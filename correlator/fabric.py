"""The element index: every link, NIC and switch the correlator may name, with stable integer ids.

Links come from the inventory (`fabric.links` plus each NIC's `switch`/`switch_port`) and from the
service's reconciled topology (LLDP). Ids only grow (a link once known keeps its id), so per-path
geometry built earlier stays valid when the topology adds links. A link's ends are sorted
`(device, port)` pairs; directed link id `2 * link + 0` runs a -> b, `2 * link + 1` runs b -> a.
Only elements found here are ever named in a finding: nothing is invented from raw addresses.
"""

from __future__ import annotations

from nms.config.models import FabricConfig
from nms.records import FabricTopology, TopologyLink
from nms.topology import End, fmt_end, parse_end

Nic = tuple[str, str]  # (host, nic)


class FabricIndex:
    def __init__(self, fabric: FabricConfig):
        self.links: list[tuple[End, End]] = []
        self.link_id: dict[tuple[End, End], int] = {}
        self.by_end: dict[End, int] = {}
        self.between: dict[tuple[str, str], list[int]] = {}  # sorted device pair -> links
        self.topo: dict[int, TopologyLink] = {}  # the latest topology's view of a link
        self.hosts = {h.name for h in fabric.hosts}
        self.switch_role = {s.name: s.role for s in fabric.switches}
        self.reachable: dict[str, bool | None] = {}
        self.nics: list[Nic] = []
        self.nic_id: dict[Nic, int] = {}
        self.nic_switch: dict[Nic, str] = {}
        self.nic_access: dict[Nic, int] = {}  # NIC -> its access link
        self.nic_by_address: dict[str, Nic] = {}  # the inventory's NIC addresses
        self.devices: list[str] = []
        self.device_id: dict[str, int] = {}
        self.version = 0  # bumped whenever a link or device is added
        self._links_of_version = -1
        for s in fabric.switches:
            self._device(s.name)
        for link in fabric.links:
            self.add_link(parse_end(link.a), parse_end(link.b))
        for host in fabric.hosts:
            for nic in host.nics:
                key = (host.name, nic.name)
                self.nic_id[key] = len(self.nics)
                self.nics.append(key)
                self.nic_by_address.setdefault(nic.address, key)
                if nic.switch and nic.switch_port:
                    self.nic_switch[key] = nic.switch
                    self.nic_access[key] = self.add_link((host.name, nic.name), (nic.switch, nic.switch_port))

    # -- building ----------------------------------------------------------------------------
    def _device(self, name: str) -> int | None:
        if name in self.hosts:
            return None
        if name not in self.device_id:
            self.device_id[name] = len(self.devices)
            self.devices.append(name)
            self.version += 1
        return self.device_id[name]

    def add_link(self, a: End, b: End, *, actual: bool = True) -> int:
        """Register a cable; `actual` (seen or configured and not contradicted) makes it the link
        of its ends' ports when a port appears on several (miscabled: inventory vs seen)."""
        key = (a, b) if a <= b else (b, a)
        lid = self.link_id.get(key)
        if lid is None:
            lid = self.link_id[key] = len(self.links)
            self.links.append(key)
            pair = tuple(sorted((a[0], b[0])))
            self.between.setdefault(pair, []).append(lid)
            for end in key:
                self._device(end[0])
            self.version += 1
        for end in key:
            if actual or end not in self.by_end:
                self.by_end[end] = lid
        return lid

    def links_of(self, device: str) -> list[int]:
        if self._links_of_version != self.version:
            self._links_of: dict[str, list[int]] = {}
            for lid, (a, b) in enumerate(self.links):
                for dev in {a[0], b[0]}:
                    self._links_of.setdefault(dev, []).append(lid)
            self._links_of_version = self.version
        return self._links_of.get(device, [])

    def update_topology(self, topology: FabricTopology) -> None:
        self.topo = {}
        for link in topology.links:
            lid = self.add_link(parse_end(link.a), parse_end(link.b), actual=link.check != "missing")
            self.topo[lid] = link
        for node in topology.nodes:
            if node.kind == "switch":
                self._device(node.name)
            self.reachable[node.name] = node.reachable

    # -- naming ------------------------------------------------------------------------------
    def name(self, lid: int) -> str:
        a, b = self.links[lid]
        return f"{fmt_end(a)}--{fmt_end(b)}"

    def ends(self, did: int) -> tuple[End, End]:
        """(egress end, ingress end) of a directed link."""
        a, b = self.links[did >> 1]
        return (a, b) if did & 1 == 0 else (b, a)

    def dname(self, did: int) -> str:
        src, dst = self.ends(did)
        return f"{fmt_end(src)}->{fmt_end(dst)}"

    def into(self, lid: int, end: End) -> int:
        """The directed link of `lid` arriving at `end`."""
        return 2 * lid + (1 if self.links[lid][0] == end else 0)

    def other(self, lid: int, end: End) -> End:
        a, b = self.links[lid]
        return b if a == end else a

    def is_uplink(self, lid: int) -> tuple[End, End] | None:
        """(lower end, upper end) when the link joins a leaf to a spine (or a spine to a superspine)."""
        rank = {"leaf": 1, "spine": 2, "superspine": 3}
        a, b = self.links[lid]
        ra, rb = rank.get(self.switch_role.get(a[0], ""), 0), rank.get(self.switch_role.get(b[0], ""), 0)
        if ra and rb and ra != rb:
            return (a, b) if ra < rb else (b, a)
        return None
