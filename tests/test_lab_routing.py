"""The lab's static routes (lab/routing.py): ECMP over every spine, failover withdrawal, and a
drained uplink avoided both ways (what the drain_link actuator relies on), computed without a lab."""

from __future__ import annotations

from lab import routing
from lab.topology import Spec, plan


def test_a_drained_uplink_is_avoided_by_its_leaf_and_by_every_other_leaf():
    topo = plan(Spec(spines=2, leaves=3, hosts_per_leaf=1, mgmt_subnet="198.18.99.0/24", prefix="nmsz-"))
    up = {(link.a.node, link.b.node): link for link in topo.links if link.kind == "fabric"}
    spine_of = {link.a.name: link.b.node for link in up.values()}  # leaf port -> its spine

    def spines(table, leaf, to_leaf):
        return {spine_of[dev] for _, dev in table[leaf][topo.leaf_prefix(topo.nodes[to_leaf].index)]}

    clean = routing.compute(topo)
    assert spines(clean, "leaf1", "leaf2") == spines(clean, "leaf3", "leaf1") == {"spine1", "spine2"}
    drained = routing.compute(topo, weights={"leaf1": {up[("leaf1", "spine1")].a.name: 0}})
    assert spines(drained, "leaf1", "leaf2") == {"spine2"}  # leaf1 stops sending up it
    assert spines(drained, "leaf3", "leaf1") == {"spine2"}  # nobody reaches leaf1 through spine1
    assert spines(drained, "leaf2", "leaf3") == {"spine1", "spine2"}  # the rest of the fabric untouched
    assert drained["spine1"] == clean["spine1"]  # the spine keeps its one route down (in-flight packets)
    # draining would leave a group empty: it keeps every path instead (never the last one)
    both = routing.compute(topo, withdrawn=[up[("leaf3", "spine2")].name],
                           weights={"leaf1": {up[("leaf1", "spine1")].a.name: 0}})
    assert spines(both, "leaf3", "leaf1") == {"spine1"}
