"""Which spine a flow takes, asked of the kernel itself (`ip route get ... sport S dport D`),
and one-way UDP probes that check it (sockets opened in the namespaces via setns).

The leaf's multipath hash covers src/dst address, protocol and ports (builder.SWITCH_SYSCTLS),
so `ip route get` with `iif` and the ports predicts the nexthop real packets use.
"""

from __future__ import annotations

import json
import os
import socket
import time

from lab import netns, sh
from lab.topology import Topology

IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # linux/in.h: set DF, never fragment locally


def predict(topo: Topology, src: str, dst: str, proto: str = "udp", sport: int = 0, dport: int = 0) -> dict:
    """{'hops': [host, leaf, spine, leaf, host], 'spine': name or None, 'uplink': 'leafN:swpM'}."""
    s_link, d_link = topo.link_of_port(src, "eth0"), topo.link_of_port(dst, "eth0")
    leaf, dst_leaf = s_link.a.node, d_link.a.node
    if leaf == dst_leaf:
        return {"hops": [src, leaf, dst], "spine": None, "uplink": None}
    args = ["ip", "-n", topo.netns(leaf), "-j", "route", "get", d_link.b.ip, "from", s_link.b.ip,
            "iif", s_link.a.name, "ipproto", proto]
    if sport:
        args += ["sport", str(sport)]
    if dport:
        args += ["dport", str(dport)]
    route = json.loads(sh.run(args).stdout)[0]
    uplink = topo.link_of_port(leaf, route["dev"])
    spine = uplink.other(leaf).node
    return {"hops": [src, leaf, spine, dst_leaf, dst], "spine": spine, "uplink": str(uplink.end(leaf))}


def sport_via(topo: Topology, src: str, dst: str, spine: str, proto: str, dport: int,
              start: int, avoid: set[int] = frozenset(), tries: int = 512) -> int:
    """The first source port >= start (not in avoid) whose flow hashes onto `spine`."""
    for sport in range(start, min(start + tries, 65536)):
        if sport not in avoid and predict(topo, src, dst, proto, sport, dport)["spine"] == spine:
            return sport
    raise sh.LabError(f"no source port in {start}..{start + tries} takes {src}->{dst} via {spine}")


def udp_probe(topo: Topology, src: str, dst: str, sports: list[int], dport: int = 33434,
              count: int = 100, size: int = 64, interval: float = 0.0005, wait: float = 0.2) -> dict[int, int]:
    """Send `count` datagrams of `size` payload bytes from each source port; return how many arrived
    per source port. DF is set, so a datagram too large for a link is dropped, not fragmented.

    Payloads carry a random token: datagrams of an earlier probe that a router held while resolving
    a neighbour (it queues them during an outage and sends them after) are not counted."""
    s_addr, d_addr = topo.link_of_port(src, "eth0").b.ip, topo.link_of_port(dst, "eth0").b.ip
    with netns.entered(topo.netns(dst)):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    senders = []
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.bind((d_addr, dport))
        rx.setblocking(False)
        with netns.entered(topo.netns(src)):
            for sport in sports:
                tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                senders.append(tx)
                tx.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
                tx.bind((s_addr, sport))
        got = {sport: 0 for sport in sports}
        token = os.urandom(8)
        payload = token + b"\0" * max(0, size - len(token))
        for _ in range(count):
            for tx in senders:
                try:
                    tx.sendto(payload, (d_addr, dport))
                except OSError:
                    pass  # e.g. no route / NIC down: counts as lost
            _drain(rx, got, token)
            if interval:
                time.sleep(interval)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _drain(rx, got, token)
            time.sleep(0.01)
        return got
    finally:
        rx.close()
        for tx in senders:
            tx.close()


def _drain(rx: socket.socket, got: dict[int, int], token: bytes) -> None:
    while True:
        try:
            data, (_, port) = rx.recvfrom(65535)
        except BlockingIOError:
            return
        if port in got and data.startswith(token):
            got[port] += 1
