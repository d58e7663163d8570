"""The fabric graph: LLDP neighbours reconciled with the configured inventory, and the ECMP path set
between two hosts.

Inputs are plain records, so any source of LLDP (SNMP, gNMI, a host agent) feeds the same graph:

* `neighbors`: the latest LldpNeighbor records per polled device (a device present here with an
  empty list was polled and saw nobody; a device absent was not polled successfully);
* the inventory's cabling: `fabric.links` plus each host NIC's `switch`/`switch_port`;
* optionally the latest oper status and rates per port, and which ports are flapping.

Reconciliation (per cable, ends as `device:port`):
ok (seen as configured), missing (configured, an end's device was polled and did not see it),
miscabled (an end is seen connected to another peer than configured), unexpected (seen, not
configured), unverified (configured, no polled device could confirm it), discovered (seen, and the
inventory lists no cabling at all).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

from nms.config.models import FabricConfig
from nms.records import (
    FabricPath,
    FabricTopology,
    LinkCheck,
    LinkState,
    LldpNeighbor,
    PathHop,
    PortRates,
    TopologyLink,
    TopologyNode,
)

End = tuple[str, str]  # (device, port)


def parse_end(text: str) -> End:
    """'leaf1:swp3' -> ('leaf1', 'swp3')."""
    device, _, port = text.partition(":")
    return device, port


def fmt_end(end: End) -> str:
    return f"{end[0]}:{end[1]}"


def _key(a: End, b: End) -> tuple[End, End]:
    return (a, b) if a <= b else (b, a)


def expected_links(fabric: FabricConfig) -> set[tuple[End, End]]:
    links = {_key(parse_end(link.a), parse_end(link.b)) for link in fabric.links}
    for host in fabric.hosts:
        for nic in host.nics:
            if nic.switch and nic.switch_port:
                links.add(_key((host.name, nic.name), (nic.switch, nic.switch_port)))
    return links


def observed_links(neighbors: Mapping[str, Iterable[LldpNeighbor]]) -> dict[tuple[End, End], set[str]]:
    """{cable: devices that reported it}."""
    seen: dict[tuple[End, End], set[str]] = defaultdict(set)
    for device, items in neighbors.items():
        for n in items:
            if n.remote_name and n.remote_port:
                seen[_key((device, n.port), (n.remote_name, n.remote_port))].add(device)
    return seen


def build_topology(fabric: FabricConfig, neighbors: Mapping[str, Iterable[LldpNeighbor]], *,
                   reachable: Mapping[str, bool] | None = None, oper: Mapping[End, str | None] | None = None,
                   rates: Mapping[End, PortRates] | None = None, flapping: Iterable[End] = (),
                   generated_ns: int = 0) -> FabricTopology:
    reachable = reachable or {}
    oper = oper or {}
    rates = rates or {}
    flapping = set(flapping)
    polled = set(neighbors)
    expected = expected_links(fabric)
    seen = observed_links(neighbors)
    configured_peer: dict[End, End] = {}
    for a, b in expected:
        configured_peer[a], configured_peer[b] = b, a
    seen_peer: dict[End, End] = {}
    for a, b in seen:
        seen_peer[a], seen_peer[b] = b, a

    links: list[TopologyLink] = []

    def add(key: tuple[End, End], check: LinkCheck, expected_text: str | None = None) -> None:
        a, b = key
        ends = [e for e in key if oper.get(e) is not None]
        states = [oper[e] for e in ends]
        if not states:
            state: LinkState = "unknown"
        elif any(s != "up" for s in states):
            state = "down"
        else:
            state = "degraded" if any(e in flapping for e in key) else "up"
        rate_end = a if a in rates else b if b in rates else None
        rate = rates.get(rate_end) if rate_end else None
        links.append(TopologyLink(
            a=fmt_end(a), b=fmt_end(b), check=check, state=state, seen_by=sorted(seen.get(key, ())),
            expected=expected_text, flapping=any(e in flapping for e in key),
            rate_port=fmt_end(rate_end) if rate_end else None, in_bps=rate.in_bps if rate else None,
            out_bps=rate.out_bps if rate else None))

    for key in sorted(expected):
        a, b = key
        if key in seen:
            add(key, "ok")
        elif seen_peer.get(a, b) != b or seen_peer.get(b, a) != a:
            continue  # reported below, as the miscabled link actually seen
        elif a[0] in polled or b[0] in polled:
            add(key, "missing")
        else:
            add(key, "unverified")
    for key in sorted(seen):
        if key in expected:
            continue
        moved = [e for e in key if e in configured_peer]
        if moved:
            text = ", ".join(f"{fmt_end(e)} should connect to {fmt_end(configured_peer[e])}" for e in moved)
            add(key, "miscabled", text)
        else:
            add(key, "discovered" if not expected else "unexpected")

    nodes: dict[str, TopologyNode] = {}
    for s in fabric.switches:
        nodes[s.name] = TopologyNode(name=s.name, kind="switch", role=s.role, configured=True,
                                     reachable=reachable.get(s.name))
    for h in fabric.hosts:
        nodes[h.name] = TopologyNode(name=h.name, kind="host", role="host", configured=True)
    for link in links:
        for end in (link.a, link.b):
            name = parse_end(end)[0]
            if name not in nodes:
                nodes[name] = TopologyNode(name=name, kind="switch" if name in polled else "unknown",
                                           configured=False, reachable=reachable.get(name))
    return FabricTopology(nodes=sorted(nodes.values(), key=lambda n: n.name), links=links,
                          generated_ns=generated_ns)


USABLE_CHECKS = ("ok", "discovered", "unverified", "unexpected", "miscabled")


def ecmp_paths(topology: FabricTopology, src: str, dst: str, *, include_down: bool = False,
               max_paths: int = 10_000) -> list[FabricPath]:
    """Every shortest path (in hops) from host `src` to host `dst` over usable cables.

    Only switches forward: a path never passes through another host. Parallel cables between two
    devices give distinct paths. Cables that are down (or missing) are left out unless
    `include_down`. Many pairs of one topology: `PathFinder` (the graph built once)."""
    return PathFinder(topology, include_down=include_down).paths(src, dst, max_paths=max_paths)


class PathFinder:
    """`ecmp_paths` for many pairs of one topology: the graph, each host's distances and each pair's
    paths built once (a planner asks for the same pairs several times)."""

    def __init__(self, topology: FabricTopology, *, include_down: bool = False):
        self.kinds = {n.name: n.kind for n in topology.nodes}
        adj: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # device -> (peer, local port, peer port)
        for link in topology.links:
            if link.check not in USABLE_CHECKS or (link.state == "down" and not include_down):
                continue
            a, b = parse_end(link.a), parse_end(link.b)
            adj[a[0]].append((b[0], a[1], b[1]))
            adj[b[0]].append((a[0], b[1], a[1]))
        self.adj = {u: sorted(vs) for u, vs in adj.items()}
        self._dist: dict[str, dict[str, int]] = {}
        self._paths: dict[tuple[str, str, int], list[FabricPath]] = {}

    def _forwards(self, device: str) -> bool:
        return self.kinds.get(device) != "host"

    def distances(self, start: str) -> dict[str, int]:
        """Hops from `start` to every device, through switches only (cached)."""
        if start not in self._dist:
            dist = {start: 0}
            queue = deque([start])
            while queue:
                u = queue.popleft()
                if u != start and not self._forwards(u):
                    continue
                for v, _, _ in self.adj[u]:
                    if v not in dist:
                        dist[v] = dist[u] + 1
                        queue.append(v)
            self._dist[start] = dist
        return self._dist[start]

    def paths(self, src: str, dst: str, *, max_paths: int = 10_000) -> list[FabricPath]:
        key = (src, dst, max_paths)
        if key not in self._paths:
            self._paths[key] = self._walk(src, dst, max_paths)
        return self._paths[key]

    def _walk(self, src: str, dst: str, max_paths: int) -> list[FabricPath]:
        adj = self.adj
        if src == dst or src not in adj or dst not in adj:
            return []
        from_src, to_dst = self.distances(src), self.distances(dst)
        if dst not in from_src:
            return []
        length = from_src[dst]
        paths: list[FabricPath] = []

        def walk(u: str, ingress: str | None, hops: list[PathHop]) -> None:
            if len(paths) >= max_paths:
                return
            if u == dst:  # built unvalidated: every field comes from the validated topology's links
                paths.append(FabricPath.model_construct(
                    hops=[*hops, PathHop.model_construct(device=u, ingress=ingress, egress=None)]))
                return
            if u != src and not self._forwards(u):
                return
            for v, out_port, in_port in adj[u]:
                if from_src.get(u, -1) + 1 + to_dst.get(v, length + 1) == length:
                    walk(v, in_port, [*hops, PathHop.model_construct(device=u, ingress=ingress, egress=out_port)])

        walk(src, None, [])
        return paths
