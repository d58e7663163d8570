"""The lab's plan: nodes, ports, links and every address, computed from a few numbers.

Addressing (all inside 198.18.0.0/15, RFC 2544's benchmarking range, which no real network routes):

* management: one /24 (default 198.18.0.0/24) on a bridge in the root namespace. The gateway
  (.1) is the root namespace itself; nodes get .10, .11, ... (spines, then leaves, then hosts).
  It is the only lab range that exists in the root namespace, so two labs need different ones.
* fabric: 198.19.0.0/16, present only inside the lab's namespaces. Leaf N owns 198.19.N.0/24:
  host port k is 198.19.N.(2k-2)/31 on the leaf and .(2k-1) on the host; the uplink to spine s is
  198.19.N.(126+2s)/31 on the spine and .(127+2s) on the leaf. So a leaf's whole world is one /24
  and routing is one prefix per leaf.

Names: spineS, leafL, hostH (H counts across leaves). Switch ports are swpN like Cumulus/SONiC
(a leaf's host ports first, then its uplinks); a host has eth0 (fabric NIC) and mgmt0.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

FABRIC_NET = ipaddress.ip_network("198.19.0.0/16")
LAB_RANGE = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_MGMT = "198.18.0.0/24"
DEFAULT_PREFIX = "nmsl-"
IFNAMSIZ = 15
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,6}-$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bps|b)?\s*$", re.I)
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
SOUTHBOUND = ("snmp", "gnmi", "cli")  # what the switches can serve the NMS (`nms lab up --southbound`), in this order
DEFAULT_SOUTHBOUND = ("snmp", "gnmi")


def parse_rate(text: str | int) -> int:
    """'100M', '100mbit', '1G', '500k', 2500000 -> bits per second."""
    if isinstance(text, int):
        return text
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"bad rate {text!r}: use e.g. 100M, 1G, 500k (bits per second)")
    bps = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if bps <= 0:
        raise ValueError(f"rate must be positive, got {text!r}")
    return bps


def format_rate(bps: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g}{unit}"
    return f"{bps:.0f}"


@dataclass(frozen=True)
class Spec:
    spines: int = 2
    leaves: int = 2
    hosts_per_leaf: int = 2
    link_rate_bps: int = 100_000_000
    mtu: int = 9000
    mgmt_subnet: str = DEFAULT_MGMT
    prefix: str = DEFAULT_PREFIX
    southbound: tuple[str, ...] = DEFAULT_SOUTHBOUND  # also given as "snmp,gnmi" or a list (state.json)

    def __post_init__(self) -> None:  # one canonical form, so specs compare equal however given
        sb = self.southbound.split(",") if isinstance(self.southbound, str) else self.southbound
        names = {s.strip() for s in sb if s.strip()}
        order = {name: i for i, name in enumerate(SOUTHBOUND)}
        object.__setattr__(self, "southbound", tuple(sorted(names, key=lambda n: (order.get(n, len(order)), n))))

    def validate(self) -> None:
        unknown = [s for s in self.southbound if s not in SOUTHBOUND]
        if unknown or not self.southbound:
            raise ValueError(f"southbound {','.join(self.southbound) or '(none)'}: choose from {', '.join(SOUTHBOUND)} "
                             "(comma-separated)")
        if not (1 <= self.spines <= 64 and 1 <= self.leaves <= 250 and 1 <= self.hosts_per_leaf <= 63):
            raise ValueError("need 1-64 spines, 1-250 leaves, 1-63 hosts per leaf")
        if not 1280 <= self.mtu <= 9216:
            raise ValueError("mtu must be within 1280..9216")
        if not _PREFIX_RE.match(self.prefix):
            raise ValueError(f"prefix {self.prefix!r}: 2-8 chars, lowercase letters/digits, ending in '-'")
        try:
            net = ipaddress.ip_network(self.mgmt_subnet)
        except ValueError as e:
            raise ValueError(f"mgmt subnet: {e}") from None
        if net.version != 4 or not net.subnet_of(LAB_RANGE) or net.overlaps(FABRIC_NET):
            raise ValueError("mgmt subnet must be an IPv4 network inside 198.18.0.0/16 "
                             "(the lab never configures addresses outside 198.18.0.0/15)")
        nodes = self.spines + self.leaves + self.leaves * self.hosts_per_leaf
        if nodes + 10 > net.num_addresses - 1:
            raise ValueError(f"{nodes} nodes do not fit the management subnet {net}: use a larger one")


@dataclass(frozen=True)
class Port:
    node: str
    name: str
    address: str  # with prefix length, e.g. 198.19.1.129/31

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    def __str__(self) -> str:
        return f"{self.node}:{self.name}"


@dataclass(frozen=True)
class Link:
    name: str      # "leaf1-spine2", "leaf1-host1"
    kind: str      # "fabric" (leaf-spine) or "access" (leaf-host)
    a: Port        # always the leaf end
    b: Port
    wire_a: str    # the link's two ends in the wire namespace (see builder.py)
    wire_b: str

    def end(self, node: str) -> Port:
        for p in (self.a, self.b):
            if p.node == node:
                return p
        raise KeyError(f"{node} is not an end of link {self.name}")

    def other(self, node: str) -> Port:
        return self.b if self.end(node) is self.a else self.a


@dataclass
class Node:
    name: str
    role: str      # spine, leaf, host
    index: int     # 1-based within its role
    mgmt_address: str
    leaf: int | None = None  # for hosts: the leaf they hang off
    ports: list[Port] = field(default_factory=list)


@dataclass
class Topology:
    spec: Spec
    nodes: dict[str, Node]
    links: list[Link]

    # -- names -----------------------------------------------------------------------------
    def netns(self, node: str) -> str:
        return f"{self.spec.prefix}{node}"

    @property
    def wire_ns(self) -> str:
        return f"{self.spec.prefix}wire"

    @property
    def bridge(self) -> str:
        return f"{self.spec.prefix}br"

    def mgmt_veth(self, node: str) -> str:
        """The root-namespace end of a node's management link."""
        return f"{self.spec.prefix}{node}"

    @property
    def mgmt_net(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(self.spec.mgmt_subnet)

    @property
    def mgmt_gateway(self) -> str:
        return str(self.mgmt_net.network_address + 1)

    # -- lookups ---------------------------------------------------------------------------
    def by_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == role]

    @property
    def switches(self) -> list[Node]:
        return self.by_role("spine") + self.by_role("leaf")

    def link(self, name: str) -> Link:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(name)

    def link_of_port(self, node: str, port: str) -> Link:
        for link in self.links:
            if (link.a.node, link.a.name) == (node, port) or (link.b.node, link.b.name) == (node, port):
                return link
        raise KeyError(f"{node}:{port}")

    def find_link(self, target: str) -> Link:
        """Accept 'leaf1-spine2', 'spine2-leaf1' or one end 'leaf1:swp3'."""
        if ":" in target:
            node, _, port = target.partition(":")
            try:
                return self.link_of_port(node, port)
            except KeyError:
                raise ValueError(f"no link has the end {target!r}") from None
        x, sep, y = target.partition("-")
        for link in self.links:
            if sep and {link.a.node, link.b.node} == {x, y}:
                return link
        names = ", ".join(link.name for link in self.links[:4])
        raise ValueError(f"no link {target!r}: name it as NODE-NODE (e.g. {names}, ...) or NODE:PORT")

    def host_port(self, host: str) -> Port:
        return self.nodes[host].ports[0]

    def leaf_prefix(self, leaf: int) -> str:
        return str(ipaddress.ip_network(f"198.19.{leaf}.0/24"))


def plan(spec: Spec) -> Topology:
    spec.validate()
    S, L, H = spec.spines, spec.leaves, spec.hosts_per_leaf
    mgmt = ipaddress.ip_network(spec.mgmt_subnet)
    nodes: dict[str, Node] = {}
    order = ([("spine", i, None) for i in range(1, S + 1)] + [("leaf", i, None) for i in range(1, L + 1)]
             + [("host", (lf - 1) * H + k, lf) for lf in range(1, L + 1) for k in range(1, H + 1)])
    for n, (role, idx, leaf) in enumerate(order):
        name = f"{role}{idx}"
        nodes[name] = Node(name, role, idx, str(mgmt.network_address + 10 + n), leaf)
        if len(spec.prefix + name) > IFNAMSIZ:
            raise ValueError(f"prefix {spec.prefix!r} + node {name!r} exceeds {IFNAMSIZ} characters")

    links: list[Link] = []

    def connect(kind: str, a: Port, b: Port) -> None:
        n = len(links) + 1
        link = Link(f"{a.node}-{b.node}", kind, a, b, f"w{n}a", f"w{n}b")
        nodes[a.node].ports.append(a)
        nodes[b.node].ports.append(b)
        links.append(link)

    for l in range(1, L + 1):  # noqa: E741
        for k in range(1, H + 1):
            host = f"host{(l - 1) * H + k}"
            connect("access", Port(f"leaf{l}", f"swp{k}", f"198.19.{l}.{2 * k - 2}/31"),
                    Port(host, "eth0", f"198.19.{l}.{2 * k - 1}/31"))
        for s in range(1, S + 1):
            connect("fabric", Port(f"leaf{l}", f"swp{H + s}", f"198.19.{l}.{127 + 2 * s}/31"),
                    Port(f"spine{s}", f"swp{l}", f"198.19.{l}.{126 + 2 * s}/31"))
    for node in nodes.values():  # ports in swpN order for readable tables
        node.ports.sort(key=lambda p: (len(p.name), p.name))
    return Topology(spec, nodes, links)
