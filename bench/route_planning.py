"""The service's planned routes against the agents' own placement, on 3-tier fat trees at full load
(issue #26): the product's planner (`correlator.actions.planner.plan`, a real congestion incident)
and the agents' own steer code (`hostprobe.steer.Steering.steer` on canned traces), no lab.

    .venv/bin/python bench/route_planning.py [--k 4 6] [--seeds 3] [--candidates 16 64]

A k-ary fat tree (k^3/4 hosts, every switch port addressed), one all-to-all job of every host at
full load (each host's NIC at `--load` of a link: 4 subflows per peer), other traffic on a quarter
of the aggregation-core links (`--hot` of a link each way), and a congestion incident on one
aggregation-core link. Each host's flows hash onto random ECMP paths (what the poller's port loads
show); the planner moves every pair whose paths cross the link, both ways. Each mover's agent
traces `--candidates` source ports per peer (each hashed onto a random path) and keeps 4 by its
mode: `avoid` (the lowest ports that avoid: avoid-only), `stripe` (hop_loads, one stripe per
switch: the service's `plan_routes: false`), `planned` (the service's routes, followed where a
candidate takes them, the rest by the stripe; `steering.route_search: 0`), `searched` (the same,
the agents tracing up to `--route-search` further blocks of candidates for a route none takes),
`exact` (searched, the planner fed exact loads: its estimate of what the movers carry now, their
flows spread evenly over their paths, made true). Printed per mode: the busiest link's level (its
other traffic plus its subflows; over 1.0 it overflows) and `opt/level`: the fluid optimum of that
level (a linear program: the movers' subflows split freely over the paths that avoid the link,
everything else where it is) over the mode's, 1.0 = optimal; `ecmp` is before the action;
`traced`: source ports traced per moved pair (the candidates and the search's further blocks).
Also the planner's time (the whole plan: paths, blast radius, routes) and how many planned routes
the agents followed.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from correlator.actions.planner import Routing, plan
from hostprobe.config import SteeringSettings
from hostprobe.steer import Peer, Steering, parse_steer
from nms.records import FabricTopology, Incident, InterfaceAddress, TopologyLink, TopologyNode
from nms.topology import ecmp_paths

PORTS = 4  # subflows per pair (the agents' ports_per_dst)


def fat_tree(k: int) -> tuple[FabricTopology, list[InterfaceAddress]]:
    """Hosts h<n>, edge e<pod>_<i>, aggregation a<pod>_<i>, core c<j>; every switch port addressed."""
    h = k // 2
    nodes, links = [], []
    for pod in range(k):
        for i in range(h):
            nodes += [TopologyNode(name=f"e{pod}_{i}", kind="switch", role="edge", configured=True),
                      TopologyNode(name=f"a{pod}_{i}", kind="switch", role="agg", configured=True)]
            for j in range(h):
                host = f"h{(pod * h + i) * h + j}"
                nodes.append(TopologyNode(name=host, kind="host", configured=True))
                links.append((f"{host}:eth0", f"e{pod}_{i}:{host}"))
                links.append((f"e{pod}_{i}:a{j}", f"a{pod}_{j}:e{i}"))
                links.append((f"a{pod}_{i}:c{j}", f"c{i * h + j}:p{pod}"))
    nodes += [TopologyNode(name=f"c{c}", kind="switch", role="core", configured=True) for c in range(h * h)]
    topo = FabricTopology(nodes=nodes, links=[TopologyLink(a=min(a, b), b=max(a, b), check="ok", state="up")
                                              for a, b in links], generated_ns=1)
    switch_ports = sorted(e for link in links for e in link if not e.startswith("h"))
    addresses = [InterfaceAddress(device=e.split(":")[0], port=e.split(":")[1], ts=1, prefix_len=31,
                                  address=f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
                 for n, e in enumerate(switch_ports, 1)]
    return topo, addresses


class CannedSteering(Steering):
    """The agent's steer with its traces answered by a hash: candidate port -> one ECMP path."""

    def __init__(self, settings: SteeringSettings, path: Path, host: str, routes_to: dict):
        super().__init__(settings, path, b"k" * 16, 1, 8, 1.0, lambda: 1)
        self.host, self.routes_to = host, routes_to  # peer -> [(hop addresses, directed links)]

    def route_of(self, peer_host: str, port: int) -> tuple:
        routes = self.routes_to[peer_host]
        return routes[zlib.crc32(f"{self.host}>{peer_host}:{port}".encode()) % len(routes)]

    def _trace(self, pairs, dport, base):
        return {(peer.local, peer.addr): [(port, list(self.route_of(peer_host, port)[0]))
                                          for port in range(base, base + self.settings.candidates)]
                for peer_host, peer in pairs}


def optimum(fixed: dict[str, float], movers: dict[str, list[list[str]]], demand: float) -> float:
    """The lowest busiest-link level with the movers' demand split freely over their paths."""
    elems = sorted(set(fixed) | {e for ps in movers.values() for p in ps for e in p})
    index = {e: i for i, e in enumerate(elems)}
    cols = [(g, p) for g, ps in movers.items() for p in ps]
    n = len(cols)  # variables: the cols' rates, then t
    rows, cs = [], []
    for c, (_g, p) in enumerate(cols):
        for e in set(p):
            rows.append(index[e])
            cs.append(c)
    a_ub = sp.hstack([sp.csr_matrix((np.ones(len(rows)), (rows, cs)), shape=(len(elems), n)),
                      sp.csr_matrix(-np.ones((len(elems), 1)))])
    b_ub = -np.array([fixed.get(e, 0.0) for e in elems])
    groups = list(movers)
    g_of = {g: i for i, g in enumerate(groups)}
    a_eq = sp.csr_matrix((np.ones(n), ([g_of[g] for g, _ in cols], range(n))), shape=(len(groups), n + 1))
    c = np.zeros(n + 1)
    c[-1] = 1
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.full(len(groups), demand), method="highs")
    if not res.success:
        raise RuntimeError(res.message)
    return float(res.x[-1])


def run(k: int, seed: int, candidates: list[int], load: float, hot: float, route_search: int) -> list[tuple]:
    rng = random.Random(seed)
    topo, addresses = fat_tree(k)
    hosts = sorted((n.name for n in topo.nodes if n.kind == "host"), key=lambda x: int(x[1:]))
    address_of = {(a.device, a.port): a.address for a in addresses}
    unit = load / (PORTS * (len(hosts) - 1))
    paths = {}  # (s, d) -> [(hop addresses, directed links by ingress end)]
    for s, d in itertools.permutations(hosts, 2):
        paths[s, d] = [(tuple(address_of[(x.device, x.ingress)] for x in p.hops[1:-1]),
                        tuple(f"{x.device}:{x.ingress}" for x in p.hops[1:])) for p in ecmp_paths(topo, s, d)]
    other: dict[str, float] = {}
    h = k // 2
    for pod, i, j in itertools.product(range(k), range(h), range(h)):
        if rng.random() < 0.25:
            other[f"c{i * h + j}:p{pod}"] = hot  # up: aggregation -> core
        if rng.random() < 0.25:
            other[f"a{pod}_{i}:c{j}"] = hot      # down
    home = {(s, d): [rng.randrange(len(ps)) for _ in range(PORTS)] for (s, d), ps in paths.items()}
    before = dict(other)
    for (s, d), js in home.items():
        for j in js:
            for e in paths[s, d][j][1]:
                before[e] = before.get(e, 0.0) + unit
    element = "a0_0:c0--c0:p0"  # pod 0's first aggregation switch to its first core
    loads = {tuple(e.split(":")): u for e, u in before.items() if not e.startswith("h")}
    incident = Incident(id=1, dedup_key=f"link:{element}", kind="congestion", element=element,
                        element_kind="link", severity="major", summary="congestion", confidence=0.9,
                        paths=[f"{hosts[0]}:eth0>{hosts[-1]}:eth0/1"], opened_ns=1, updated_ns=1, last_seen_ns=1)
    out = [("ecmp", "-", max(before.values()), None, "", None, None)]
    t0 = time.perf_counter()
    planned = plan(incident, topo, addresses, port_loads=loads, routing=Routing(PORTS, unit))
    plan_s = time.perf_counter() - t0
    (reroute,) = [p for p in planned.proposals if p.kind == "host_reroute"]
    params = reroute.params
    moved = {(s, d) for s, ds in params["dsts"].items() for d in ds}
    fixed = dict(other)
    for (s, d), js in home.items():
        if (s, d) not in moved:
            for j in js:
                for e in paths[s, d][j][1]:
                    fixed[e] = fixed.get(e, 0.0) + unit
    avoid_links = set(element.split("--"))  # the link's ingress ends, both ways
    free = {f"{s}>{d}": [list(p[1]) for p in paths[s, d] if not avoid_links & set(p[1])] for s, d in moved}
    best = optimum(fixed, free, PORTS * unit)
    # `exact`: the same planner fed loads whose even spread of the movers' flows is exact (what it takes
    # off is what they carry), so the placement's own quality shows apart from the estimate's error
    exact = dict(fixed)
    for s, d in moved:
        for p in paths[s, d]:
            for e in p[1]:
                exact[e] = exact.get(e, 0.0) + PORTS * unit / len(paths[s, d])
    exact_loads = {tuple(e.split(":")): u for e, u in exact.items() if not e.startswith("h")}
    routes = {"planned": params["routes"], "searched": params["routes"],
              "exact": plan(incident, topo, addresses, port_loads=exact_loads,
                            routing=Routing(PORTS, unit)).proposals[0].params["routes"]}
    with tempfile.TemporaryDirectory() as tmp:
        for n_cand, mode in itertools.product(candidates, ("avoid", "stripe", "planned", "searched", "exact")):
            level = dict(fixed)
            followed = wanted = ports_traced = 0
            for host in params["dsts"]:
                settings = SteeringSettings(candidates=n_cand, ports_per_dst=PORTS,
                                            port_load=0.0 if mode == "avoid" else unit,
                                            route_search=0 if mode == "planned" else route_search)
                agent = CannedSteering(settings, Path(tmp) / f"{host}-{mode}-{n_cand}.json", host,
                                       {d: paths[host, d] for d in params["dsts"][host]})
                rank, movers = params["stripe"][host]
                args = {"action_id": 1, "avoid_hops": params["avoid_hops"], "dsts": params["dsts"][host],
                        "expires_ns": time.time_ns() + 10**12, "rank": rank, "movers": movers,
                        "hop_loads": {} if mode == "avoid" else params["hop_loads"],
                        "routes": routes[mode].get(host, {}) if mode in routes else {}}
                peers = {d: [Peer(host, d, routers=len(paths[host, d][0][0]))] for d in params["dsts"][host]}
                result = agent.steer(parse_steer(args), peers)
                for d, r in result["dsts"].items():
                    followed += r["planned"]
                    wanted += len(args["routes"].get(d, []))
                    ports_traced += r["candidates"]
                    for port in r["ports"]:
                        for e in agent.route_of(d, port)[1]:
                            level[e] = level.get(e, 0.0) + unit
            top = max(level.values())
            out.append((mode, n_cand, top, best / top, f"{followed}/{wanted}" if mode in routes else "", plan_s,
                        ports_traced / len(moved)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--candidates", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--load", type=float, default=1.0, help="each host's NIC, as a share of a link")
    ap.add_argument("--route-search", type=int, default=3, help="the agents' steering.route_search (searched, exact)")
    ap.add_argument("--hot", type=float, default=0.5, help="other traffic on a hot aggregation-core link")
    args = ap.parse_args()
    print(f"{'k':>2} {'mode':8} {'cand':>4} {'busiest level p50 (min..max)':>29} {'opt/level p50 (min)':>20} "
          f"{'traced':>6} {'routes followed':>16} {'plan s':>6}")
    for k in args.k:
        rows: dict[tuple, list] = {}
        for seed in range(args.seeds):
            for mode, cand, top, ratio, followed, plan_s, traced in run(k, seed, args.candidates, args.load,
                                                                        args.hot, args.route_search):
                rows.setdefault((mode, cand), []).append((top, ratio, followed, plan_s, traced))
        for (mode, cand), rs in rows.items():
            tops = [r[0] for r in rs]
            ratios = [r[1] for r in rs if r[1] is not None]
            ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"
            plan_s = f"{statistics.median(r[3] for r in rs):.2f}" if rs[0][3] is not None else "-"
            traced = f"{statistics.mean(r[4] for r in rs):.1f}" if rs[0][4] is not None else "-"
            print(f"{k:>2} {mode:8} {cand:>4} {statistics.median(tops):>14.3f} ({min(tops):.3f}..{max(tops):.3f}) "
                  f"{ratio:>20} {traced:>6} {' '.join(r[2] for r in rs):>16} {plan_s:>6}")


if __name__ == "__main__":
    main()
