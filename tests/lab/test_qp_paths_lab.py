"""Each QP's own path on the real 2x2x2 lab (root): the agent's QP tracer, run in host1's namespace,
traces the 5-tuple of the recorded QPs (tests/fixtures/rdma: host1 <-> host3, source ports by the
kernel's formula, dport 4791) through the lab's routers; the spine it finds is the one the leaf's
ECMP hash picks for that 5-tuple (`ip route get ... sport S dport 4791`, lab.paths.predict, never the
tracer's own answer), and the correlator maps the traced QP onto that uplink and no other.

No RDMA NIC: host3 has none, so nothing consumes port 4791 there and its port unreachable ends each
trace (a RoCE NIC would swallow the probes silently: the trace then ends at the prober's router count).
Own prefix and management subnet, so it runs beside other labs.
"""

from __future__ import annotations

import time

import pytest
from lab_helpers import build_lab, new_lab_dir, skip_reason

from correlator.fabric import FabricIndex
from correlator.qp_paths import QpPaths
from hostprobe.qp_trace import QpTracer
from lab import lab as lab_mod
from lab import netns, paths
from nms.config import load_config
from tests.test_qp_paths import COMM, JOB, records

pytestmark = pytest.mark.root
PREFIX, MGMT = "nmsqp-", "198.18.236.0/24"


@pytest.fixture(scope="module")
def qplab():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    handle = build_lab(new_lab_dir(), prefix=PREFIX, mgmt=MGMT)
    yield handle
    lab_mod.down(handle.dir, PREFIX)


def test_a_qps_traced_path_is_the_spine_its_5_tuple_hashes_onto(qplab):
    topo = qplab.topo
    addr = {h: topo.link_of_port(h, "eth0").b.ip for h in ("host1", "host3")}
    owner = {p.ip: p for link in topo.links for p in (link.a, link.b)}
    ts = time.time_ns()
    qps = records("host1", 4100, 0, addr["host1"], ts) + records("host3", 5200, 1, addr["host3"], ts)
    mine = [r for r in qps if r.host == "host1"]
    stats: dict = {}
    tracer = QpTracer(b"k" * 32, 1, 8, 100.0, iter(range(1, 10**6)).__next__, stats)
    tracer.set_targets([{"device": r.device, "lqpn": int(r.lqpn), "sport": r.sport, "src_addr": addr["host1"],
                         "dst_addr": addr["host3"]} for r in mine])
    with netns.entered(topo.netns("host1")):
        assert tracer.trace(tracer.due(0.0), 0.0) == 2, stats
    spine_of = {}
    for r in mine:
        f = tracer.path_fields(r.device, int(r.lqpn), r.sport)
        hops = f["fwd_hops"].split(",")
        assert f["fwd_complete"] and len(hops) == 3, f  # leaf1, a spine, leaf2 (then host3's port unreachable)
        nodes = [owner[h].node for h in hops]
        want = paths.predict(topo, "host1", "host3", "udp", r.sport, 4791)
        assert nodes == ["leaf1", want["spine"], "leaf2"], (r.lqpn, r.sport, nodes, want)
        spine_of[int(r.lqpn)] = want["spine"]
    # the correlator places the QPs on the uplinks their traces crossed (the lab's own addresses,
    # as its collectors report them)
    cfg = load_config(qplab.state()["lab"]["config"])
    index = FabricIndex(cfg.fabric)
    addresses = {p.ip: (p.node, p.name) for link in topo.links for p in (link.a, link.b)
                 if topo.nodes[p.node].role != "host"}
    traced = [r.model_copy(update=tracer.path_fields(r.device, int(r.lqpn), r.sport)) for r in mine]
    store = QpPaths()
    for r in traced + [r for r in qps if r.host == "host3"]:
        store.add(r)
    placed = store.placed(index, addresses, 1, ts)
    for spine in ("spine1", "spine2"):
        [uplink] = [ln for ln in topo.links if ln.kind == "fabric" and {ln.a.node, ln.b.node} == {"leaf1", spine}]
        lid = index.by_end[("leaf1", uplink.a.name)]
        direction = index.dname(index.into(lid, (spine, uplink.b.name)))
        named = QpPaths.crossing(placed, index, "link", index.name(lid), lid, direction)
        assert sorted(q.route.lqpn for q in named) == sorted(q for q, s in spine_of.items() if s == spine)
        assert all((q.job_id, q.route.comm_id, q.route.rank, q.route.peer_rank) == (JOB, COMM, 0, 1) for q in named)
