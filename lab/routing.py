"""Static routes of the fabric, computed from the plan minus the links withdrawn by failover faults.

No routing daemon runs: the lab itself plays the converged control plane. With nothing withdrawn a
leaf reaches every other leaf's /24 over an ECMP route through all spines (hashed on the 5-tuple,
see builder.SWITCH_SYSCTLS); a spine has one route per leaf. A "failover" link-down withdraws the
link here, as BGP would after the session drops, and the routes are reprogrammed at once.

ECMP weights (the lab gNMI target's Set of /ecmp/uplinks/uplink[name=X]/config/weight,
lab/gnmi_set.py) live in the lab state as `ecmp_weights` {leaf: {port: weight}}: every
recompute applies them, so failover never silently undoes a drain. Weight 0 drains the uplink
both ways, as a BGP graceful shutdown of its session does: its nexthop leaves the leaf's ECMP
groups, and the other leaves stop reaching that leaf through the uplink's spine (unless either
would leave a group empty).
"""

from __future__ import annotations

from collections.abc import Iterable

from lab import sh
from lab.topology import FABRIC_NET, Topology

Nexthop = tuple[str, str]             # (gateway address, device)
Routes = dict[str, list[Nexthop]]     # prefix -> nexthops (empty: no route)


Weights = dict[str, dict[str, int]]   # node -> port -> ECMP weight (absent: 1)


def compute(topo: Topology, withdrawn: Iterable[str] = (), weights: Weights | None = None) -> dict[str, Routes]:
    gone = set(withdrawn)
    weights = weights or {}
    uplink = {}  # (leaf index, spine index) -> link, for links still in service
    for link in topo.links:
        if link.kind == "fabric" and link.name not in gone:
            uplink[(topo.nodes[link.a.node].index, topo.nodes[link.b.node].index)] = link
    spines = [n.index for n in topo.by_role("spine")]
    leaves = [n.index for n in topo.by_role("leaf")]
    out: dict[str, Routes] = {}
    for host in topo.by_role("host"):
        link = topo.link_of_port(host.name, "eth0")
        out[host.name] = {str(FABRIC_NET): [(link.a.ip, "eth0")]}
    for s in spines:
        out[f"spine{s}"] = {
            topo.leaf_prefix(l): ([(uplink[(l, s)].a.ip, uplink[(l, s)].b.name)] if (l, s) in uplink else [])
            for l in leaves  # noqa: E741
        }
    # a drained uplink is avoided both ways, as a BGP graceful shutdown of its session would: its
    # leaf stops sending over it, and every other leaf stops reaching that leaf through its spine
    drained = {(leaf, s) for (leaf, s), link in uplink.items()
               if weights.get(f"leaf{leaf}", {}).get(link.a.name, 1) == 0}
    for l in leaves:  # noqa: E741
        routes: Routes = {}
        for m in leaves:
            if m != l:
                both = [s for s in spines if (l, s) in uplink and (m, s) in uplink]
                kept = [s for s in both if (l, s) not in drained and (m, s) not in drained] or both
                routes[topo.leaf_prefix(m)] = [(uplink[(l, s)].b.ip, uplink[(l, s)].a.name) for s in kept]
        out[f"leaf{l}"] = routes
    return out


def commands(routes: Routes, weights: dict[str, int] | None = None) -> list[str]:
    """`ip -batch` lines that make the node's table match `routes` (replace is idempotent)."""
    weights = weights or {}
    lines = []
    for prefix, hops in routes.items():
        if not hops:
            lines.append(f"route del {prefix}")
        elif len(hops) == 1:
            lines.append(f"route replace {prefix} via {hops[0][0]} dev {hops[0][1]}")
        else:
            nexthops = " ".join(f"nexthop via {gw} dev {dev} weight {max(1, weights.get(dev, 1))}"
                                for gw, dev in hops)
            lines.append(f"route replace {prefix} {nexthops}")
    return lines


def apply(topo: Topology, withdrawn: Iterable[str] = (), nodes: Iterable[str] | None = None,
          weights: Weights | None = None) -> None:
    """Program the routes of `nodes` (default: every switch); deleting an absent route is fine."""
    table = compute(topo, withdrawn, weights)
    for name in nodes if nodes is not None else [n.name for n in topo.switches]:
        lines = commands(table[name], (weights or {}).get(name))
        sh.ip_batch(topo.netns(name), [x for x in lines if not x.startswith("route del")])
        sh.ip_batch(topo.netns(name), [x for x in lines if x.startswith("route del")], force=True)
