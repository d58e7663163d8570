"""The action planner (pure): an incident -> the actions that would steer traffic off its element.

- congestion, path_imbalance: host_reroute for the hosts whose probe paths cross the link.
- corrupting_link, link_flapping: drain_link on the switch ends of the link, and host_reroute.
- link_down: nothing (routing already avoids a link its switches see down), unless the evidence
  says traffic still goes there: probe paths still fail through it while its switches report it
  up (a gray failure no routing protocol notices).
- anything else (NICs, devices, audits): nothing, with the reason.

Blast radius: `correlator.actions.steering.allowed_avoid` decides whether the element may be avoided at
all, together with what active actions avoid already. Its flow groups are host pairs with their
ECMP paths (`nms.topology.PathFinder`): the affected pairs, and for drain_link every host pair the
topology knows (a drained uplink moves everyone's traffic). A refusal proposes nothing and says why.

avoid_hops: what a traceroute shows for the link. A switch answers a probe from its ingress
interface, so crossing a--b from a shows b's address on that port and the other way a's: the
InterfaceAddress of each switch end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import permutations

from correlator.actions.placement import place
from correlator.actions.steering import Limits, allowed_avoid
from nms.records import ActionKind, FabricPath, FabricTopology, Incident, InterfaceAddress, Job
from nms.topology import PathFinder, parse_end

REROUTE_KINDS = frozenset({"congestion", "path_imbalance"})
DRAIN_KINDS = frozenset({"corrupting_link", "link_flapping"})
SEVERITY_WEIGHT = {"warning": 1.0, "minor": 2.0, "major": 3.0, "critical": 4.0}
ALREADY_AVOIDED = 1e9  # what active actions avoid is kept first: a new element must fit beside it
MAX_PAIRS = 4096  # host pairs considered for a drain's blast radius (beyond: the affected pairs only)
# subflows the service places itself (`plan_routes`; beyond: the agents place theirs by their stripes):
# bounds the plan's time and the action record (each subflow's route is in its params)
MAX_PLANNED_SUBFLOWS = 16384
ROCE_DPORT = 4791


@dataclass(frozen=True)
class Proposal:
    kind: ActionKind
    element: str
    element_kind: str
    targets: list[str]
    params: dict
    reason: str


@dataclass
class Plan:
    proposals: list[Proposal] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # element -> why it may not be avoided
    notes: list[str] = field(default_factory=list)  # why nothing (or less) was proposed


def link_name(a: str, b: str) -> str:
    """A link's element name: its two `dev:port` ends, sorted (as TopologyLink, Finding)."""
    return "--".join(sorted((a, b)))


def path_elements(path: FabricPath) -> frozenset[str]:
    return frozenset(link_name(a, b) for a, b in path.links)


def host_pairs(paths: Iterable[str]) -> dict[str, set[str]]:
    """Probe paths `src_host:nic>dst_host:nic/id` -> source host -> destination hosts."""
    out: dict[str, set[str]] = {}
    for p in paths:
        src, sep, rest = p.partition(">")
        if not sep:
            continue
        s, d = src.split(":", 1)[0], rest.split(":", 1)[0].split("/", 1)[0]
        if s and d and s != d:
            out.setdefault(s, set()).add(d)
    return out


def _pairs_to_move(pairs: dict[str, set[str]], every: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """The host pairs whose flows may have to leave the element: every pair of the fabric (those
    crossing it are kept later). The incident's probe paths are a sample (a congested link takes
    some of them down for a while, a finding lists at most 1000), not the flows that cross it.
    A fabric too big for that: each source of the incident's paths to each of their destinations."""
    if len(every) <= MAX_PAIRS:
        return set(every)
    dsts = set().union(*pairs.values()) if pairs else set()
    if len(pairs) * len(dsts) <= MAX_PAIRS:
        return {(s, d) for s in pairs for d in dsts if d != s}
    return {(s, d) for s, ds in pairs.items() for d in ds}


def job_peers(jobs: Iterable[Job]) -> dict[str, set[str]]:
    """Host -> the hosts it exchanges a job's traffic with, from the running jobs: its ranks' peers'
    hosts where the job knows them (the NCCL plugin's data, or the scheduler's), else every other
    host of the job. A host in no job is absent (its flows are not known)."""
    out: dict[str, set[str]] = {}
    for job in jobs:
        host_of = {r.rank: r.host for r in job.ranks}
        if any(r.peers for r in job.ranks):
            for r in job.ranks:
                out.setdefault(r.host, set()).update(host_of[p] for p in r.peers if p in host_of)
        else:
            for h in job.hosts:
                out.setdefault(h, set()).update(job.hosts)
    for host, peers in out.items():
        peers.discard(host)
    return out


def stripes(topology: FabricTopology, hosts: Iterable[str]) -> dict[str, list[int]]:
    """Host -> [rank, movers] among the given hosts behind the same switch: the movers whose flows
    share that switch's uplinks place their ports as one stripe (correlator.actions.steering.stripe);
    those behind other switches use other uplinks. A host with no known switch is a stripe alone."""
    host_set = set(hosts)
    switch_of: dict[str, str] = {}
    for link in topology.links:
        (a, _), (b, _) = parse_end(link.a), parse_end(link.b)
        if a in host_set and b not in host_set:
            switch_of.setdefault(a, b)
        elif b in host_set and a not in host_set:
            switch_of.setdefault(b, a)
    groups: dict[str, list[str]] = {}
    for h in sorted(host_set):
        groups.setdefault(switch_of.get(h, h), []).append(h)
    return {h: [i, len(g)] for g in groups.values() for i, h in enumerate(g)}


def _crosses(finder: PathFinder, src: str, dst: str, element: str, direction: str | None) -> bool:
    """Whether an ECMP path src -> dst crosses `element` (in `direction` `dev:port->dev:port`, if given)."""
    return any(link_name(a, b) == element and (direction is None or f"{a}->{b}" == direction)
               for path in finder.paths(src, dst) for a, b in path.links)


def avoid_hops(element: str, topology: FabricTopology, addresses: Iterable[InterfaceAddress]) -> list[str]:
    """The addresses a traceroute shows for a link: those of its switch ends' ports."""
    switches = {n.name for n in topology.nodes if n.kind == "switch"}
    ends = {parse_end(e) for e in element.split("--")}
    return sorted({a.address for a in addresses if (a.device, a.port) in ends and a.device in switches})


def hop_loads(links: Iterable[str], addresses: Iterable[InterfaceAddress],
              port_loads: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """What a trace's hop address stands for in load: the utilization of the link into that
    interface (its port's inbound utilization, the poller's latest rates), for the switch ports of
    `links`. The agent ranks the ports that avoid the element by it (`correlator.actions.steering.choose`)."""
    ends = {parse_end(e) for link in links for e in link.split("--")}
    return {a.address: round(float(port_loads[(a.device, a.port)]), 4) for a in addresses
            if (a.device, a.port) in ends and (a.device, a.port) in port_loads}


@dataclass(frozen=True)
class Routing:
    """How the service plans a reroute's routes (`plan_routes`): the subflows each mover sends to
    each destination and what one adds to a link's utilization, as the agents' `steering.ports_per_dst`
    and `steering.port_load`."""

    ports_per_dst: int = 4
    port_load: float = 0.25


def plan_routes(topology: FabricTopology, movers: Mapping[str, Iterable[str]], addresses: Iterable[InterfaceAddress],
                port_loads: Mapping[tuple[str, str], float], avoid: Iterable[str], routing: Routing = Routing(),
                finder: PathFinder | None = None) -> dict[str, dict[str, list[list[str]]]]:
    """Mover -> destination -> the route of each of its subflows, as the hop addresses a trace shows
    (each switch's ingress port): every mover's subflows placed at once on the ECMP paths that cross
    nothing in `avoid` (correlator.actions.placement). The links' loads count other traffic only: the
    movers' own, spread by the hash over all their paths now, is taken off. A path with no known
    address is not offered (an agent could not recognise it); a pair with none gets no routes."""
    address_of = {(a.device, a.port): a.address for a in addresses}
    finder = finder or PathFinder(topology)
    avoid = set(avoid)
    groups: dict[str, list[list[str]]] = {}
    hops: dict[str, list[list[str]]] = {}
    allowed: dict[str, list[int]] = {}
    for s, dsts in movers.items():
        for d in dsts:
            paths = finder.paths(s, d)
            key = f"{s}>{d}"
            groups[key] = [[f"{h.device}:{h.ingress}" for h in p.hops[1:]] for p in paths]
            hops[key] = [[address_of[(h.device, h.ingress)] for h in p.hops[1:-1]
                          if (h.device, h.ingress) in address_of] for p in paths]
            allowed[key] = [j for j, p in enumerate(paths) if hops[key][j] and not path_elements(p) & avoid]
    load = {f"{d}:{p}": float(u) for (d, p), u in port_loads.items()}
    for paths in groups.values():
        for p in paths:
            for e in p:
                if e in load:
                    load[e] = max(0.0, load[e] - routing.ports_per_dst * routing.port_load / len(paths))
    out: dict[str, dict[str, list[list[str]]]] = {}
    for key, js in place(groups, routing.ports_per_dst, load, routing.port_load, allowed).items():
        if js:
            s, d = key.split(">", 1)
            out.setdefault(s, {})[d] = [hops[key][j] for j in js]
    return out


def flow_groups(finder: PathFinder, pairs: Iterable[tuple[str, str]]) -> dict[str, list[frozenset[str]]]:
    return {f"{s}>{d}": [path_elements(p) for p in finder.paths(s, d)] for s, d in pairs}


def moved_to(element: str, groups: Mapping[str, list[frozenset[str]]]) -> list[str]:
    """The elements traffic may move onto when it avoids `element`: those of the paths that avoid
    it, in the groups that crossed it, less what every path of a group crosses anyway (its access
    links). A new incident on one of them after acting means the action may have made it worse."""
    out: set[str] = set()
    for paths in groups.values():
        if not any(element in p for p in paths):
            continue
        common = frozenset.intersection(*paths)
        for p in paths:
            if element not in p:
                out |= p - common
    return sorted(out)


def evidence_level(incident: Incident) -> dict[str, float]:
    """The numbers "worse" is judged on: loss % and median delay inflation (us), where evidenced."""
    ev, out = incident.evidence, {}
    loss, delay = ev.get("loss"), ev.get("delay")
    if isinstance(loss, dict) and isinstance(loss.get("loss_pct"), (int, float)):
        out["loss_pct"] = float(loss["loss_pct"])
    if isinstance(delay, dict) and isinstance(delay.get("inflation_us"), (int, float)):
        out["inflation_us"] = float(delay["inflation_us"])
    return out


def worse(baseline: Mapping[str, float], now: Mapping[str, float], factor: float) -> str | None:
    """Why `now` is worse than `baseline` (a number rose by `factor` or more), or None."""
    for key in sorted(set(baseline) & set(now)):
        if baseline[key] > 0 and now[key] >= factor * baseline[key]:
            return f"{key} rose from {baseline[key]:g} to {now[key]:g} (x{now[key] / baseline[key]:.1f})"
    return None


def drain_ends(element: str, topology: FabricTopology) -> dict[str, str]:
    """{device: port} of the link's switch ends nearest the hosts: a link is drained where it is an
    uplink (a leaf's port to a spine, an aggregation switch's to a core), whose ECMP groups can drop
    it; the spine end has one route down and nothing to choose. Both ends when they are as near."""
    switches = {n.name for n in topology.nodes if n.kind == "switch"}
    ends = [parse_end(e) for e in element.split("--")]
    ends = [(d, p) for d, p in ends if d in switches]
    if not ends:
        return {}
    depth = {n.name: 0 for n in topology.nodes if n.kind == "host"}  # hops from the nearest host
    frontier = list(depth)
    neighbours: dict[str, set[str]] = {}
    for link in topology.links:
        a, b = parse_end(link.a)[0], parse_end(link.b)[0]
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    while frontier:
        nxt = []
        for node in frontier:
            for other in neighbours.get(node, ()):
                if other not in depth:
                    depth[other] = depth[node] + 1
                    nxt.append(other)
        frontier = nxt
    nearest = min(depth.get(d, 1 << 30) for d, _ in ends)
    return {d: p for d, p in ends if depth.get(d, 1 << 30) == nearest}


def blast_radius(element: str, topology: FabricTopology, limits: Limits = Limits(),
                 avoided: Mapping[str, object] | None = None) -> str | None:
    """Why avoiding `element` (beside `avoided`) breaks the limits for some host pair, or None."""
    hosts = sorted(n.name for n in topology.nodes if n.kind == "host")
    groups = flow_groups(PathFinder(topology), list(permutations(hosts, 2))[:MAX_PAIRS])
    bad = {e: ALREADY_AVOIDED for e in (avoided or {})} | {element: 1.0}
    _, refused = allowed_avoid(bad, groups, limits)
    return refused.get(element)


def _still_carries_traffic(incident: Incident) -> bool:
    ev = incident.evidence
    return bool(ev.get("paths_down")) and ev.get("oper") not in ("down", "lowerLayerDown", "notPresent")


def fitting_kinds(incident: Incident) -> tuple[frozenset[str], str]:
    """The action kinds that fit the incident as it is now, whatever is active already; when none,
    why not."""
    kind = incident.kind
    if incident.element_kind != "link":
        return frozenset(), f"{kind} on a {incident.element_kind}: no action steers off a {incident.element_kind}"
    if kind == "link_down" and not _still_carries_traffic(incident):
        return frozenset(), "link down: routing already avoids it"
    if kind in REROUTE_KINDS or kind == "link_down":
        return frozenset({"host_reroute"}), ""
    if kind in DRAIN_KINDS:
        return frozenset({"drain_link", "host_reroute"}), ""
    return frozenset(), f"no action for {kind}"


def plan(incident: Incident, topology: FabricTopology, addresses: Iterable[InterfaceAddress],
         limits: Limits = Limits(), avoided: Mapping[str, Iterable[str]] | None = None,
         dport: int = ROCE_DPORT, port_loads: Mapping[tuple[str, str], float] | None = None,
         peers: Callable[[], Mapping[str, set[str]]] | None = None, routing: Routing | None = None) -> Plan:
    """What to do about one incident. `avoided`: element -> the kinds of the active actions that
    steer off it already (a drain may still join a host reroute on the same element).
    `port_loads`: (device, port) -> inbound utilization, for the reroute's `hop_loads`.
    `peers`: gives `job_peers` of the running jobs, asked only when a reroute is built: a host in a
    job steers only its flows to its job peers, the traffic it has; a host in none, every pair.
    `routing`: with `port_loads`, the service places every mover's subflows itself (`plan_routes`)
    and sends them as `routes`; the agents follow them where a traced port takes the route."""
    out = Plan()
    kinds, why_not = fitting_kinds(incident)
    active = set((avoided or {}).get(incident.element, ()))
    if kinds and kinds <= active:
        out.notes.append(f"{incident.element} is avoided already")
        return out
    kinds -= active
    if not kinds:
        out.notes.append(why_not)
        return out
    drain = "drain_link" in kinds
    # the element carries traffic (a flapping link between flaps, a gray failure): its paths count
    # even when the topology caught it down
    topology = topology.model_copy(update={"links": [
        link.model_copy(update={"state": "up", "check": "ok" if link.check == "missing" else link.check})
        if link_name(link.a, link.b) == incident.element else link for link in topology.links]})
    element = incident.element
    pairs = host_pairs(incident.paths)
    every = list(permutations(sorted(n.name for n in topology.nodes if n.kind == "host"), 2))
    considered = _pairs_to_move(pairs, every)
    if drain:
        considered |= set(every[:MAX_PAIRS])
    finder = PathFinder(topology)
    groups = flow_groups(finder, sorted(considered))
    if not any(element in p for paths in groups.values() for p in paths):
        out.notes.append(f"no ECMP path of the affected host pairs crosses {element}")
        return out
    bad = {e: ALREADY_AVOIDED for e in (avoided or {})}
    bad[element] = SEVERITY_WEIGHT[incident.severity] + incident.confidence
    accepted, refused = allowed_avoid(bad, groups, limits)
    if element not in accepted:
        out.refused = {element: refused.get(element, "not allowed")}
        out.notes.append(f"avoiding {element} refused: {out.refused[element]}")
        return out
    why = f"incident {incident.id}: {incident.summary}"
    common = {"moved_to": moved_to(element, groups), "baseline": evidence_level(incident)}
    if drain:
        ends = drain_ends(element, topology)
        if ends:
            out.proposals.append(Proposal("drain_link", element, "link", sorted(ends), {"ports": ends} | common, why))
        else:
            out.notes.append(f"{element} has no switch end to drain")
    if pairs and "host_reroute" in kinds:
        hops = avoid_hops(element, topology, addresses)
        if not hops:
            out.notes.append(f"host_reroute not proposed: no interface address known for the switch ends of {element}")
        else:
            # the loaded / lossy direction's flows (both when both or neither is known)
            direction = None if incident.evidence.get("also_direction") else incident.direction
            movers: dict[str, list[str]] = {}
            talks = peers() if peers is not None else {}
            for s, d in sorted(considered):
                if s in talks and d not in talks[s]:
                    continue  # no job traffic between them
                if any(element in p for p in groups[f"{s}>{d}"]) and _crosses(finder, s, d, element, direction):
                    movers.setdefault(s, []).append(d)
            if movers:
                loads = hop_loads(common["moved_to"], addresses, port_loads or {})
                params = {"avoid_hops": hops, "dsts": movers, "proto": "udp", "dport": dport,
                          "hop_loads": loads, "stripe": stripes(topology, movers)}
                subflows = sum(map(len, movers.values())) * (routing.ports_per_dst if routing else 0)
                if port_loads and routing is not None and subflows <= MAX_PLANNED_SUBFLOWS:
                    params["routes"] = plan_routes(topology, movers, addresses, port_loads, bad, routing,
                                                   finder)
                elif port_loads and routing is not None:
                    out.notes.append(f"routes not planned: {subflows} subflows (max {MAX_PLANNED_SUBFLOWS}); "
                                     "the agents place theirs")
                out.proposals.append(Proposal("host_reroute", element, "link", sorted(movers), params | common, why))
    return out
