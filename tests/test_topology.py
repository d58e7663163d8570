"""Topology from LLDP reconciled with the inventory, and ECMP path enumeration (pure functions)."""

from __future__ import annotations

import pytest

from nms.config.models import FabricConfig
from nms.records import LldpNeighbor
from nms.topology import build_topology, ecmp_paths

T0 = 1_700_000_000 * 10**9


def fabric(spines=2, leaves=2, hosts_per_leaf=1) -> FabricConfig:
    """Leaf-spine cabled like the lab: leafL swp1..H to hosts, swpH+s to spine s (its swpL)."""
    switches = [{"name": f"spine{s}", "mgmt_address": f"127.0.1.{s}", "role": "spine"} for s in range(1, spines + 1)]
    switches += [{"name": f"leaf{n}", "mgmt_address": f"127.0.2.{n}", "role": "leaf"} for n in range(1, leaves + 1)]
    hosts, links = [], []
    for l in range(1, leaves + 1):  # noqa: E741
        for k in range(1, hosts_per_leaf + 1):
            h = f"host{(l - 1) * hosts_per_leaf + k}"
            hosts.append({"name": h, "nics": [{"name": "eth0", "address": f"127.0.3.{len(hosts) + 1}",
                                               "switch": f"leaf{l}", "switch_port": f"swp{k}"}]})
        for s in range(1, spines + 1):
            links.append({"a": f"leaf{l}:swp{hosts_per_leaf + s}", "b": f"spine{s}:swp{l}"})
    return FabricConfig(switches=switches, hosts=hosts, links=links)


def lldp_as_cabled(f: FabricConfig) -> dict[str, list[LldpNeighbor]]:
    """What every switch's LLDP would report if the cabling is exactly as configured."""
    out: dict[str, list[LldpNeighbor]] = {s.name: [] for s in f.switches}
    pairs = [(link.a, link.b) for link in f.links]
    pairs += [(f"{n.switch}:{n.switch_port}", f"{h.name}:{n.name}") for h in f.hosts for n in h.nics]
    for a, b in pairs:
        for here, there in ((a, b), (b, a)):
            dev, port = here.split(":")
            if dev in out:
                rdev, rport = there.split(":")
                out[dev].append(LldpNeighbor(device=dev, port=port, ts=T0, remote_name=rdev, remote_port=rport))
    return out


def checks(topo) -> dict[tuple[str, str], str]:
    return {(link.a, link.b): link.check for link in topo.links}


def test_as_cabled_everything_is_ok_and_both_ends_report_fabric_links():
    f = fabric()
    topo = build_topology(f, lldp_as_cabled(f))
    assert set(checks(topo).values()) == {"ok"} and len(topo.links) == 6
    fabric_link = next(link for link in topo.links if link.a == "leaf1:swp2")
    assert fabric_link.b == "spine1:swp1" and fabric_link.seen_by == ["leaf1", "spine1"]
    assert {n.name: n.kind for n in topo.nodes} == {"spine1": "switch", "spine2": "switch", "leaf1": "switch",
                                                     "leaf2": "switch", "host1": "host", "host2": "host"}
    assert topo.problems() == []


def test_missing_miscabled_unexpected_and_unverified():
    f = fabric()
    seen = lldp_as_cabled(f)
    # leaf1:swp3 - spine2:swp1 is unplugged (neither end sees it)
    seen["leaf1"] = [n for n in seen["leaf1"] if n.port != "swp3"]
    seen["spine2"] = [n for n in seen["spine2"] if n.port != "swp1"]
    # host2 was moved from leaf2:swp1 to leaf2:swp9
    seen["leaf2"] = [n for n in seen["leaf2"] if n.port != "swp1"]
    seen["leaf2"].append(LldpNeighbor(device="leaf2", port="swp9", ts=T0, remote_name="host2", remote_port="eth0"))
    # a rogue box on spine1
    seen["spine1"].append(LldpNeighbor(device="spine1", port="swp7", ts=T0, remote_name="rogue", remote_port="p1"))
    # spine2 did not answer its last poll: links only it could confirm are unverified, not missing
    topo = build_topology(f, seen)
    c = checks(topo)
    assert c[("leaf1:swp3", "spine2:swp1")] == "missing"  # leaf1 was polled and does not see it
    assert c[("host2:eth0", "leaf2:swp9")] == "miscabled"
    moved = next(link for link in topo.links if link.check == "miscabled")
    assert moved.expected == "host2:eth0 should connect to leaf2:swp1"
    assert ("host2:eth0", "leaf2:swp1") not in c  # reported once, as the miscabled cable
    assert c[("rogue:p1", "spine1:swp7")] == "unexpected"
    assert next(n for n in topo.nodes if n.name == "rogue").configured is False
    assert len(topo.problems()) == 3

    del seen["leaf1"], seen["spine2"]
    c = checks(build_topology(f, seen))
    assert c[("leaf1:swp3", "spine2:swp1")] == "unverified" and c[("host1:eth0", "leaf1:swp1")] == "unverified"


def test_no_configured_cabling_means_discovered():
    f = fabric()
    seen = lldp_as_cabled(f)
    bare = FabricConfig(switches=f.switches)
    assert set(checks(build_topology(bare, seen)).values()) == {"discovered"}


def test_link_state_from_port_status_and_flapping():
    f = fabric()
    oper = {("leaf1", "swp2"): "up", ("spine1", "swp1"): "down", ("leaf1", "swp3"): "up", ("spine2", "swp1"): "up",
            ("leaf2", "swp2"): "up"}
    topo = build_topology(f, lldp_as_cabled(f), oper=oper, flapping=[("leaf2", "swp2")])
    state = {(link.a, link.b): link.state for link in topo.links}
    assert state[("leaf1:swp2", "spine1:swp1")] == "down"
    assert state[("leaf1:swp3", "spine2:swp1")] == "up"
    assert state[("leaf2:swp2", "spine1:swp2")] == "degraded"
    assert state[("host1:eth0", "leaf1:swp1")] == "unknown"


def hop_devices(paths):
    return sorted(tuple(p.devices) for p in paths)


def test_ecmp_paths_across_spines_and_within_a_leaf():
    f = fabric(spines=4, leaves=2, hosts_per_leaf=2)
    topo = build_topology(f, lldp_as_cabled(f))
    paths = ecmp_paths(topo, "host1", "host3")
    assert hop_devices(paths) == [("host1", "leaf1", f"spine{s}", "leaf2", "host3") for s in range(1, 5)]
    first = paths[0]
    assert first.hops[0].egress == "eth0" and first.hops[1].ingress == "swp1" and first.hops[-1].ingress == "eth0"
    assert first.links[1] == ("leaf1:swp3", "spine1:swp1")
    assert hop_devices(ecmp_paths(topo, "host1", "host2")) == [("host1", "leaf1", "host2")]
    assert ecmp_paths(topo, "host1", "host1") == [] and ecmp_paths(topo, "host1", "nobody") == []


def test_down_links_leave_the_path_set_unless_asked():
    f = fabric(spines=2, leaves=2)
    topo = build_topology(f, lldp_as_cabled(f), oper={("leaf1", "swp2"): "down", ("spine1", "swp1"): "down"})
    assert hop_devices(ecmp_paths(topo, "host1", "host2")) == [("host1", "leaf1", "spine2", "leaf2", "host2")]
    assert len(ecmp_paths(topo, "host1", "host2", include_down=True)) == 2


def test_paths_never_transit_a_host_and_parallel_cables_count_twice():
    f = fabric(spines=1, leaves=2)
    seen = lldp_as_cabled(f)
    # a second cable leaf1:swp7 - spine1:swp7, and host1 dual-homed to leaf2 (must not become a transit)
    seen["leaf1"].append(LldpNeighbor(device="leaf1", port="swp7", ts=T0, remote_name="spine1", remote_port="swp7"))
    seen["leaf2"].append(LldpNeighbor(device="leaf2", port="swp8", ts=T0, remote_name="host1", remote_port="eth1"))
    topo = build_topology(FabricConfig(switches=f.switches, hosts=f.hosts), seen)
    paths = ecmp_paths(topo, "host1", "host2")
    assert hop_devices(paths) == [("host1", "leaf2", "host2")]  # the direct second NIC is shorter
    seen["leaf2"].pop()
    topo = build_topology(FabricConfig(switches=f.switches, hosts=f.hosts), seen)
    paths = ecmp_paths(topo, "host1", "host2")
    assert len(paths) == 2 and {p.hops[1].egress for p in paths} == {"swp2", "swp7"}


@pytest.mark.parametrize("spines,leaves", [(8, 4), (16, 2)])
def test_path_count_is_the_spine_count(spines, leaves):
    f = fabric(spines=spines, leaves=leaves)
    topo = build_topology(f, lldp_as_cabled(f))
    assert len(ecmp_paths(topo, "host1", f"host{leaves}")) == spines


def test_a_dual_homed_host_is_no_transit_between_leaves():
    f = fabric(spines=1, leaves=2, hosts_per_leaf=2)
    seen = lldp_as_cabled(f)
    seen["leaf2"].append(LldpNeighbor(device="leaf2", port="swp8", ts=T0, remote_name="host1", remote_port="eth1"))
    down = {("leaf1", "swp3"): "down", ("leaf2", "swp3"): "down"}  # both uplinks to the spine
    topo = build_topology(FabricConfig(switches=f.switches, hosts=f.hosts), seen, oper=down)
    assert ecmp_paths(topo, "host2", "host3") == []  # leaf1 -> host1 -> leaf2 would be shorter than nothing
    assert hop_devices(ecmp_paths(topo, "host1", "host3")) == [("host1", "leaf2", "host3")]
