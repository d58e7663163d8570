"""Each NCCL QP's fabric path (issue 25, item 2): the RoCE v2 source port by the kernel's formula, the
service handing each agent its joined QPs, the agent tracing a QP's own 5-tuple, and the correlator
naming the QPs (job, ranks, peer) whose traced path crosses a faulty link.

No RDMA NIC ran any of this: this machine has no RDMA device and no RDMA netlink. Sources:
- tests/fixtures/rdma/roce_sport.c: the kernel's arithmetic (include/rdma/ib_verbs.h, from the
  linux-rdma patches that added rdma_flow_label_to_udp_sport / rdma_calc_flow_label (Mark Zhang,
  2020) and rdma_get_udp_sport (Zhu Yanjun, 2022)) copied into C; its output is the vector file, and
  the test below recompiles it with `cc`, so no expected value comes from the Python under test.
- tests/fixtures/rdma/*.json: `rdma -j` outputs of the two hosts of a 2-rank job, written to the keys
  iproute2 prints (no public JSON capture of an mlx5 host's RC QPs was found; README there cites the
  real mlx5 text capture the kernel QP line follows).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from _fabric_synth import NS

from correlator.job_impact import join
from correlator.jobs_nccl import NcclJobs
from correlator.qp_join import join_qps
from hostprobe.qp_trace import QpTracer, parse_targets
from hostprobe.rdma_qps import QpReporter, parse_links, parse_qps, qp_records, roce_udp_sport
from hostprobe.trace import path_id
from nms.records import JobSlowdown
from nms.state import StateStore
from tests.helpers import wait_until
from tests.test_correlator_faults import Run, link_of

FIXTURES = Path(__file__).parent / "fixtures" / "rdma"
COMM = "00000000c0ffee02"
JOB = "job-qp-path"


def vectors() -> list[tuple[int, int, int, int]]:
    lines = (FIXTURES / "roce_sport_vectors.txt").read_text().splitlines()
    return [(int(fl), int(lq), int(rq), int(sp)) for fl, lq, rq, sp in (line.split() for line in lines)]


# --- the source port ---------------------------------------------------------------------------------

def test_the_source_port_is_the_kernels_for_every_vector():
    rows = vectors()
    assert len(rows) == 518
    wrong = [(fl, lq, rq, sp, got) for fl, lq, rq, sp in rows if (got := roce_udp_sport(fl, lq, rq)) != sp]
    assert wrong == []
    # the QP pairs of the fixtures (host1 0x11d2 <-> host3 0x2c8): one port, whichever end computes it
    by_pair = {(lq, rq): sp for fl, lq, rq, sp in rows if fl == 0}
    assert by_pair[(0x11d2, 0x2c8)] == roce_udp_sport(0, 0x2c8, 0x11d2)


def test_the_vectors_are_what_the_c_copy_of_the_kernel_prints(tmp_path):
    exe = tmp_path / "roce_sport"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(exe), str(FIXTURES / "roce_sport.c")], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert out == (FIXTURES / "roce_sport_vectors.txt").read_text()


# --- the join on the recorded lists, and what the service hands each agent ----------------------------

def records(host: str, pid: int, rank: int, addr: str, ts: int, paths=None):
    qps = parse_qps((FIXTURES / f"{host}_resource_show_qp.json").read_text())
    links = parse_links((FIXTURES / "link_show.json").read_text())
    return qp_records(qps, links, {pid: (JOB, {(COMM, rank)})}, host, {"eth0": addr}, ts, paths)


def test_the_service_hands_each_agent_its_joined_qps_with_their_destination(tmp_path):
    state = StateStore(tmp_path / "s.sqlite")
    jobs = NcclJobs(state, lambda _: None)
    now = time.time_ns()
    jobs.add(records("host1", 4100, 0, "192.0.2.11", now) + records("host3", 5200, 1, "192.0.2.13", now))
    sports = {(lq, rq): sp for fl, lq, rq, sp in vectors() if fl == 0}
    assert jobs.qp_targets("host1") == [
        {"device": "mlx5_0", "lqpn": 0x11d2, "sport": sports[(0x11d2, 0x2c8)], "src_addr": "192.0.2.11",
         "dst_addr": "192.0.2.13", "peer_host": "host3"},
        {"device": "mlx5_0", "lqpn": 0x11d3, "sport": sports[(0x11d3, 0x2c9)], "src_addr": "192.0.2.11",
         "dst_addr": "192.0.2.13", "peer_host": "host3"}]
    assert [t["dst_addr"] for t in jobs.qp_targets("host3")] == ["192.0.2.11", "192.0.2.11"]
    # the kernel's GSI QP and a host whose peer has not reported: nothing to trace
    alone = NcclJobs(StateStore(tmp_path / "t.sqlite"), lambda _: None)
    alone.add(records("host1", 4100, 0, "192.0.2.11", now))
    assert alone.qp_targets("host1") == []
    # QPs their agents stopped reporting (destroyed): no longer traced
    assert jobs.qp_targets("host1", now_ns=now + 121 * NS) == []
    state.close()


def test_targets_the_agent_cannot_use_are_named():
    good = {"device": "mlx5_0", "lqpn": 7, "sport": 0xC123, "src_addr": "10.0.0.1", "dst_addr": "10.0.0.2"}
    targets, bad = parse_targets([good, {**good, "sport": 4791}, {"device": "mlx5_0"}])
    assert [t.lqpn for t in targets] == [7]
    assert bad[0] == "qps[1]: sport 4791 is not a RoCE v2 source port (0xC000..0xFFFF)"
    assert bad[1].startswith("qps[2]: KeyError")


# --- the agent traces a QP's own 5-tuple ---------------------------------------------------------------

def _free_roce_port(addr: str) -> int:
    for lq in range(0x2000, 0x3000):
        sport = roce_udp_sport(0, lq, 0x2c8)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((addr, sport))
            except OSError:
                continue
            return lq
    raise AssertionError("no free RoCE source port on loopback")


def _seq():
    n = [100]

    def nxt():
        n[0] += 1
        return n[0]
    return nxt


def test_the_agent_traces_each_qp_from_its_own_source_port_and_reports_the_path(tmp_path):
    """Real sockets on loopback: the QP's 5-tuple (127.0.0.1:sport -> 127.0.0.2:4791) traced with the
    prober's tracer. Nothing listens on 4791 here, so the first TTL reaches the peer and its port
    unreachable ends the trace (no router between); on a fabric the routers answer each TTL (lab)."""
    lqpn = _free_roce_port("127.0.0.1")
    sport = roce_udp_sport(0, lqpn, 0x2c8)
    stats: dict = {}
    tracer = QpTracer(b"k" * 32, 7, 8, 200.0, _seq(), stats, every=300.0)
    tracer.set_targets([{"device": "mlx5_0", "lqpn": lqpn, "sport": sport, "src_addr": "127.0.0.1",
                         "dst_addr": "127.0.0.2", "peer_host": "host3"}])
    assert tracer.start(100.0) == 1 and tracer.start(100.0) == 0  # one round at a time
    wait_until(lambda: not tracer.busy, 10.0, 0.02, what="the QP trace round")
    assert tracer.path_fields("mlx5_0", lqpn, sport) == {
        "dst_addr": "127.0.0.2", "path_id": path_id("127.0.0.1", "127.0.0.2", [], []), "fwd_hops": "",
        "fwd_complete": True}
    assert stats["qp_traces"] == 1
    assert tracer.path_fields("mlx5_0", lqpn, sport + 1) == {}  # another port (a new QP pair): not this path
    assert tracer.due(399.0) == [] and [t.lqpn for t in tracer.due(400.0)] == [lqpn]  # traced again after `every`
    # the QP's port taken by another socket on this host: cannot be traced, counted, nothing invented
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", sport))
        busy = QpTracer(b"k" * 32, 7, 8, 200.0, _seq(), stats)
        busy.set_targets([{"device": "mlx5_0", "lqpn": lqpn, "sport": sport, "src_addr": "127.0.0.1",
                           "dst_addr": "127.0.0.2"}])
        assert busy.trace(busy.due(0.0)) == 0 and stats["qp_trace_port_busy"] == 1 and busy.paths == {}


def test_the_qp_reporter_carries_the_traced_path_on_the_qps_next_record(tmp_path):
    """A stand-in `rdma` replaying host1's recorded list; the service's targets pointing both QPs at
    loopback: the first read starts the round, the next read's records carry each QP's path."""
    (tmp_path / "rdma").write_text(f'#!/bin/sh\ncase "$2" in resource) cat {FIXTURES}/host1_resource_show_qp.json;; '
                                   f'link) cat {FIXTURES}/link_show.json;; esac\n')
    (tmp_path / "rdma").chmod(0o755)
    stats: dict = {}
    tracer = QpTracer(b"k" * 32, 7, 8, 200.0, _seq(), stats)
    reporter = QpReporter("host1", {"eth0": "127.0.0.1"}, 10.0, str(tmp_path / "rdma"), tracer)
    first = reporter.read({4100: (JOB, {(COMM, 0)})}, 0.0, 10**18)
    assert [r.path_id for r in first] == [None, None]
    tracer.set_targets([{"device": r.device, "lqpn": int(r.lqpn), "sport": r.sport, "src_addr": "127.0.0.1",
                         "dst_addr": "127.0.0.3"} for r in first])
    free = [r for r in first if _bindable(r.sport)]
    reporter.read({4100: (JOB, {(COMM, 0)})}, 10.0, 10**18 + 10 * NS)  # starts the round
    wait_until(lambda: not tracer.busy, 10.0, 0.02, what="the QP trace round")
    again = reporter.read({4100: (JOB, {(COMM, 0)})}, 20.0, 10**18 + 20 * NS)
    traced = {r.lqpn: (r.dst_addr, r.fwd_hops, r.fwd_complete) for r in again if r.path_id is not None}
    assert traced == {r.lqpn: ("127.0.0.3", "", True) for r in free} and free


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --- the correlator names the QPs that cross a faulty link -------------------------------------------

def test_a_lossy_link_names_the_qps_whose_traced_path_crosses_it_and_the_slowdown_they_explain():
    """Synthetic 2-spine fabric (tests/_fabric_synth.py); the job's two QPs host1 -> host3 hash onto
    different spines (their traces say so), host3's two back through spine2. 5 % loss on
    leaf1 -> spine1: the finding names host1's QP through spine1 (rank 0 -> 1), not the other QP, and
    the job; the slowdown it explains lists that QP with its ranks."""
    run = Run(switch_every=5)
    s = run.s
    via = {1: s._leg("host1", "host3", 1)[1], 2: s._leg("host1", "host3", 2)[1], "back": s._leg("host3", "host1", 2)[1]}
    ts = (run.t - 1) * NS

    def traced(recs, hops_by_qpn):
        return [r.model_copy(update={"fwd_hops": ",".join(hops_by_qpn[int(r.lqpn)]), "fwd_complete": True,
                                     "dst_addr": "192.0.2.13" if r.host == "host1" else "192.0.2.11",
                                     "path_id": path_id(r.src_addr, "x", hops_by_qpn[int(r.lqpn)], [])})
                for r in recs]
    qps = (traced(records("host1", 4100, 0, "192.0.2.11", ts), {0x11d2: via[1], 0x11d3: via[2]})
           + traced(records("host3", 5200, 1, "192.0.2.13", ts), {0x2c8: via["back"], 0x2c9: via["back"]}))
    run.c.add(qps)
    assert run.steps(1) == [[]]  # QPs alone are no finding
    directed = s.up_link(1, 1)
    s.loss[directed] = 0.05
    found = [f for step in run.steps(5) for f in step if f.element == link_of(directed)]
    assert found, "5 % loss must be localized within 5 s"
    f = found[-1]
    assert f.direction == directed
    named = [(q["job"], q["host"], q["qpn"], q["rank"], q["peer_host"], q["peer_rank"], q["comm"], q["sport"])
             for q in f.evidence["qps"]]
    assert named == [(JOB, "host1", 0x11d2, 0, "host3", 1, COMM, roce_udp_sport(0, 0x11d2, 0x2c8))]
    assert f.evidence["qps_crossing"] == 1 and JOB in f.jobs and f"1 QP(s) of job {JOB} cross it" in f.summary
    # the job's slowdown (its communicator's QPs, joined by the service) is explained by it, naming that QP
    routes = join_qps(qps)
    slow = JobSlowdown(job_id=JOB, comm_id=COMM, op="AllReduce", size_bucket="4MiB", since_ns=ts,
                       baseline_busbw_gbps=10.0, busbw_gbps=4.0, ratio=0.4, slow_collectives=[7, 8],
                       host_pairs=["host1>host3"], qps=routes)
    [out] = [x for x in join([f], [slow], ts + 10 * NS) if x.element == f.element]
    [ev] = out.evidence["job_slowdowns"]
    assert [(q["host"], q["qpn"], q["rank"], q["peer_rank"]) for q in ev["qps"]] == [("host1", 0x11d2, 0, 1)]
    assert ev["op"] == "AllReduce" and ev["slow_collectives"] == [7, 8]
    assert "over 1 QP(s) (ranks 0>1)" in out.summary


def test_the_agent_hands_the_services_qp_list_to_its_qp_tracer(tmp_path):
    """The real Agent (loopback NIC, not run): the peer list's `qps` reach its QP tracer through the
    inbox the control thread fills; `nccl.qp_trace_every: null` builds none."""
    from hostprobe.agent import Agent
    from hostprobe.config import AgentConfig

    made: list[Path] = []

    def agent(**nccl) -> Agent:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        sock_dir = Path(tempfile.mkdtemp(prefix="qp", dir="/tmp"))  # a Unix socket path must stay short
        made.append(sock_dir)
        return Agent(AgentConfig.model_validate({
            "host": "host1", "service": {"url": "http://127.0.0.1:9", "token": "t"},
            "nics": [{"name": "lo", "address": "127.0.0.1"}], "probe": {"key": "k" * 32, "port": port, "sports": 1},
            "report": {"buffer_dir": str(tmp_path / f"b{len(nccl)}")},
            "nccl": {"socket": str(sock_dir / "nccl.sock"), **nccl}}))

    a = agent()
    try:
        target = {"device": "mlx5_0", "lqpn": 0x11d2, "sport": roce_udp_sport(0, 0x11d2, 0x2c8),
                  "src_addr": "127.0.0.1", "dst_addr": "127.0.0.3", "peer_host": "host3"}
        a.control._peers({"peers": [], "qps": [target]})  # what a peer-list answer from the service does
        a._drain_inbox()
        tracer = a.nccl.qps.tracer
        assert [(t.lqpn, t.sport, t.dst_addr) for t in tracer.targets.values()] == [
            (0x11d2, target["sport"], "127.0.0.3")]
    finally:
        a.close()
    b = agent(qp_trace_every=None)
    try:
        assert b.nccl.qps.tracer is None
    finally:
        b.close()
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
