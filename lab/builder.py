"""Build the fabric: namespaces, links through the wire namespace, shaping, management bridge, routes.

Every fabric link is two veth pairs joined in one "wire" namespace by tc mirred (frames go straight
across, LLDP included). That is what makes "link down" real: setting the two wire ends down drops
carrier on *both* switch ports while neither is administratively down, exactly like a pulled cable
(an admin-down veth end would delete that side's static routes instead).

Ports carry TBF at the link rate and gso_max_segs 1, so frames on the "wire" are MTU-sized like
on a real link (a 64 KB GSO super-frame would dodge MTU checks and per-packet drops).
"""

from __future__ import annotations

import ipaddress
import json
import time

from lab import netns, routing, sh
from lab.topology import Topology

WIRE_MTU = 9600  # above any lab MTU: the wire must never be the MTU limit
MGMT_MTU = 1500

COMMON_SYSCTLS = {
    # no IPv6 chatter (router solicitations, MLD) in the interface counters
    "net.ipv6.conf.all.disable_ipv6": 1,
    "net.ipv6.conf.default.disable_ipv6": 1,
    # ECMP return paths differ from forward paths: strict reverse-path filtering would drop them
    "net.ipv4.conf.all.rp_filter": 0,
    "net.ipv4.conf.default.rp_filter": 0,
    # blackhole semantics by default: a nexthop that lost carrier is still used (see faults.py)
    "net.ipv4.conf.all.ignore_routes_with_linkdown": 0,
}
SWITCH_SYSCTLS = {
    "net.ipv4.ip_forward": 1,
    # Hash policy 3 = custom fields; 0x37 = src ip, dst ip, ip proto, src port, dst port.
    # Policy 1 reuses the sender's socket hash for TCP, so a TCP flow's path changes run to run.
    "net.ipv4.fib_multipath_hash_policy": 3,
    "net.ipv4.fib_multipath_hash_fields": "0x0037",
    # Answer traceroute like a fabric switch: ICMP errors from the ingress interface's address, so a
    # hop names the link the probe came in by, and no per-destination ICMP limit (Linux: 1/s after a
    # burst of 6; switches police ICMP per box, as the global icmp_msgs_per_sec limit still does here).
    "net.ipv4.icmp_errors_use_inbound_ifaddr": 1,
    "net.ipv4.icmp_ratelimit": 0,
}


def tbf(dev: str, rate_bps: int, mtu: int) -> str:
    """A `tc -batch` line shaping `dev` to `rate_bps`."""
    burst = max(rate_bps // 8 // 500, 3 * (mtu + 14))  # 2 ms of traffic, at least 3 frames
    return f"qdisc replace dev {dev} root tbf rate {rate_bps}bit burst {burst} latency 20ms"


def check_mgmt_free(topo: Topology) -> None:
    """Refuse to build if anything outside the lab already uses the management subnet."""
    net = topo.mgmt_net
    ours = topo.spec.prefix
    for iface in json.loads(sh.run(["ip", "-j", "addr", "show"]).stdout or "[]"):
        for a in iface.get("addr_info", []):
            if a.get("family") == "inet" and not iface["ifname"].startswith(ours):
                if ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False).overlaps(net):
                    raise sh.LabError(f"{iface['ifname']} already has {a['local']}/{a['prefixlen']}, inside "
                                      f"the lab management subnet {net}: pass another --mgmt-subnet")
    for r in json.loads(sh.run(["ip", "-j", "route", "show"]).stdout or "[]"):
        dst = r.get("dst", "")
        if dst != "default" and not r.get("dev", "").startswith(ours):
            if ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False).overlaps(net):
                raise sh.LabError(f"a route to {dst} (dev {r.get('dev')}) overlaps the lab management subnet "
                                  f"{net}: pass another --mgmt-subnet")


def create_namespaces(topo: Topology) -> None:
    names = [topo.netns(n) for n in topo.nodes] + [topo.wire_ns]
    sh.ip_batch(None, [f"netns add {ns}" for ns in names])
    for ns in names:
        sh.ip_batch(ns, ["link set lo up"])
        netns.write_sysctls(ns, COMMON_SYSCTLS)
    for node in topo.switches:
        netns.write_sysctls(topo.netns(node.name), SWITCH_SYSCTLS)


def create_links(topo: Topology) -> None:
    spec = topo.spec
    wire, wire_tc = [], []
    per_node: dict[str, list[str]] = {n: [] for n in topo.nodes}
    per_node_tc: dict[str, list[str]] = {n: [] for n in topo.nodes}
    for link in topo.links:
        for w, port in ((link.wire_a, link.a), (link.wire_b, link.b)):
            wire.append(f"link add {w} mtu {WIRE_MTU} type veth peer name {port.name} netns {topo.netns(port.node)}")
            wire.append(f"link set {w} up")
            lines = per_node[port.node]
            lines.append(f"link set {port.name} mtu {spec.mtu} gso_max_segs 1")
            lines.append(f"link set {port.name} alias {link.other(port.node)}")  # port description
            lines.append(f"addr add {port.address} dev {port.name}")
            lines.append(f"link set {port.name} up")
            per_node_tc[port.node].append(tbf(port.name, spec.link_rate_bps, spec.mtu))
        for src, dst in ((link.wire_a, link.wire_b), (link.wire_b, link.wire_a)):
            wire_tc.append(f"qdisc add dev {src} handle ffff: ingress")
            wire_tc.append(f"filter add dev {src} parent ffff: protocol all u32 match u32 0 0 "
                           f"action mirred egress redirect dev {dst}")
    sh.ip_batch(topo.wire_ns, wire)
    sh.tc_batch(topo.wire_ns, wire_tc)
    for node, lines in per_node.items():
        sh.ip_batch(topo.netns(node), lines)
        sh.tc_batch(topo.netns(node), per_node_tc[node])


def create_mgmt(topo: Topology) -> None:
    br, prefixlen = topo.bridge, topo.mgmt_net.prefixlen
    root = [f"link add {br} type bridge", f"link set {br} addrgenmode none",
            f"addr add {topo.mgmt_gateway}/{prefixlen} dev {br}", f"link set {br} up"]
    for node in topo.nodes.values():
        veth = topo.mgmt_veth(node.name)
        root.append(f"link add {veth} mtu {MGMT_MTU} type veth peer name mgmt0 netns {topo.netns(node.name)}")
        root.append(f"link set {veth} addrgenmode none master {br} up")
    sh.ip_batch(None, root)
    for node in topo.nodes.values():
        sh.ip_batch(topo.netns(node.name), [f"addr add {node.mgmt_address}/{prefixlen} dev mgmt0",
                                            "link set mgmt0 up"])


def ifindexes(topo: Topology, node: str) -> dict[str, int]:
    out = sh.run(["ip", "-n", topo.netns(node), "-j", "link", "show"]).stdout
    return {i["ifname"]: i["ifindex"] for i in json.loads(out)}


def wait_links_up(topo: Topology, timeout: float = 5.0) -> None:
    """Carrier changes reach operstate through the kernel's linkwatch, up to ~1 s later."""
    deadline = time.monotonic() + timeout
    pending = set(topo.nodes)
    while pending:
        for node in sorted(pending):
            out = json.loads(sh.run(["ip", "-n", topo.netns(node), "-j", "link", "show"]).stdout)
            state = {i["ifname"]: i.get("operstate") for i in out}
            if all(state.get(p.name) == "UP" for p in topo.nodes[node].ports):
                pending.discard(node)
        if pending and time.monotonic() > deadline:
            raise sh.LabError(f"links of {sorted(pending)} did not come up within {timeout:.0f}s")
        if pending:
            time.sleep(0.1)


def build(topo: Topology) -> None:
    create_namespaces(topo)
    create_links(topo)
    create_mgmt(topo)
    routing.apply(topo, nodes=list(topo.nodes))
