"""QPs from the host (hostprobe/rdma_qps.py), their RoCE v2 source ports, the join of both ends
(correlator/qp_join.py), and the job / slowdown / finding that name them.

No RDMA NIC ran any of this: this machine has no RDMA device and its kernel no RDMA netlink
(`rdma -j resource show qp` exits 1, "Failed to open NETLINK_RDMA socket"). The parser is tested on
outputs published by others and on shapes written to iproute2's own printing code:

- HNS_RC_CAPTURE: `rdma res show qp link hns_0 lqpn 41 -jp -dd` on a HiSilicon hns RoCE host, from the
  linux-rdma patch "RDMA/hns: Support QP's restrack ops for hns driver" (Wenpeng Liang
  <liangwenpeng@huawei.com>, 2022), without its `-dd` driver fields (the agent does not ask for them).
- HNS_GSI_CAPTURE and HNS_DD_BROKEN: `rdma res show qp -jp -dd` before and after the iproute2 fix
  "rdma: Fix core dump when pretty is used" (Chengchang Tang / Junxian Huang, netdev, 2023-12-29);
  the "after" text is still not JSON (a bare object inside the QP's object): refused with a clear error.
- MLX5_HOST_A / MLX5_HOST_B: no public capture of an mlx5 host's QP list in JSON was found. These are
  written to the keys iproute2 prints (rdma/res-qp.c `res_qp_line`, rdma/res.c `print_link`,
  `res_print_u32`, `print_comm`; iproute2 commit ee2a4a86) with mlx5 device names, as two hosts of a
  2-rank NCCL job would show them: two RC QPs per connection (NCCL_IB_QPS_PER_CONNECTION=2) plus
  the kernel's GSI/SMI QPs. `rdma -j link show` keys from rdma/link.c `link_one_show`.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from correlator.job_impact import join
from correlator.jobs_nccl import NcclJobs
from correlator.qp_join import agrees_with_net_events, join_qps
from correlator.slowdown import DetectorConfig
from hostprobe.rdma_qps import (
    QpReporter,
    RdmaOutputError,
    calc_flow_label,
    flow_label_to_udp_sport,
    parse_links,
    parse_qps,
    qp_records,
    roce_udp_sport,
    run_rdma,
)
from nms.records import Finding, NcclStepStats
from nms.state import StateStore
from tests.test_nccl_jobs import ring_records

HNS_RC_CAPTURE = """[ {
        "ifindex": 4,
        "ifname": "hns_0",
        "port": 1,
        "lqpn": 41,
        "rqpn": 40,
        "type": "RC",
        "state": "RTR",
        "rq-psn": 12474738,
        "sq-psn": 0,
        "path-mig-state": "ARMED",
        "pdn": 9,
        "pid": 1523,
        "comm": "ib_send_bw"
    } ]"""

HNS_GSI_CAPTURE = """[ {
        "ifindex": 2,
        "ifname": "hns_2",
        "port": 1,
        "lqpn": 1,
        "type": "GSI",
        "state": "RTS",
        "sq-psn": 0,
        "comm": "ib_core"
    } ]"""

HNS_DD_BROKEN = """[ {
        "ifindex": 2,
        "ifname": "hns_2",
        "port": 1,
        "lqpn": 1,
        "type": "GSI",
        "state": "RTS",
        "sq-psn": 0,
        "comm": "ib_core",{
            "drv_sq_wqe_cnt": 128
        }
    } ]"""


def _qp(dev, lqpn, rqpn, pid, state="RTS"):
    return {"ifindex": 0, "ifname": dev, "port": 1, "lqpn": lqpn, "rqpn": rqpn, "type": "RC", "state": state,
            "rq-psn": 7411, "sq-psn": 9120, "path-mig-state": "MIGRATED", "pdn": 3, "pid": pid, "comm": "python"}


KERNEL_QPS = [{"ifindex": 0, "ifname": "mlx5_0", "port": 1, "lqpn": 0, "type": "SMI", "state": "RTS", "sq-psn": 0,
               "comm": "ib_core"},
              {"ifindex": 0, "ifname": "mlx5_0", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS", "sq-psn": 0,
               "comm": "ib_core"}]
# rank 0 (pid 4100 on gpu-a) <-> rank 1 (pid 5200 on gpu-b), two QPs per connection
MLX5_HOST_A = json.dumps(KERNEL_QPS + [_qp("mlx5_0", 0x1A4, 0x2B7, 4100), _qp("mlx5_0", 0x1A5, 0x2B8, 4100),
                                       _qp("mlx5_0", 0x1A9, None, 4100, state="INIT")])
MLX5_HOST_B = json.dumps(KERNEL_QPS + [_qp("mlx5_0", 0x2B7, 0x1A4, 5200), _qp("mlx5_0", 0x2B8, 0x1A5, 5200),
                                       _qp("mlx5_0", 0x2C0, 0x99, 6000)])  # another process's QP
LINKS = json.dumps([{"ifindex": 0, "ifname": "mlx5_0", "port": 1, "state": "ACTIVE", "physical_state": "LINK_UP",
                     "netdev": "ens1f0np0", "netdev_index": 4}])
COMM = "00000000c0ffee01"


# --- the RoCE v2 source port ------------------------------------------------------------------------

def kernel_sport(fl: int, lqpn: int, rqpn: int) -> int:
    """include/rdma/ib_verbs.h (read in the kernel tree NVIDIA/NV-Kernels at 2a8826fc: torvalds/linux's
    8.6 GB snapshot could not be fetched here), written out with explicit unsigned arithmetic,
    independently of hostprobe/rdma_qps.py:

        rdma_calc_flow_label(lqpn, rqpn): u64 v = (u64)lqpn * rqpn; v ^= v >> 20; v ^= v >> 40;
                                          return (u32)(v & IB_GRH_FLOWLABEL_MASK)        [0x000FFFFF]
        rdma_flow_label_to_udp_sport(fl): u32 fl_low = fl & 0x03fff, fl_high = fl & 0xFC000;
                                          fl_low ^= fl_high >> 14;
                                          return (u16)(fl_low | IB_ROCE_UDP_ENCAP_VALID_PORT_MIN) [0xC000]
        rdma_get_udp_sport(fl, lqpn, rqpn): if (!fl) fl = rdma_calc_flow_label(lqpn, rqpn); ...
    """
    if fl == 0:
        v = int.from_bytes((lqpn * rqpn).to_bytes(16, "little")[:8], "little")  # (u64) product
        v = v ^ (v // (1 << 20))
        v = v ^ (v // (1 << 40))
        fl = v % (1 << 20)
    low = fl % (1 << 14)
    high6 = (fl // (1 << 14)) % (1 << 6)
    return ((low ^ high6) | 0xC000) % (1 << 16)


def test_sport_by_hand_for_known_qpn_pairs():
    # 0x100 * 0x200 = 0x20000: no fold (both shifts 0); low 14 bits 0, bits 14-19 = 8 -> 0xC008
    assert calc_flow_label(0x100, 0x200) == 0x20000 and roce_udp_sport(0, 0x100, 0x200) == 0xC008 == 49160
    # 41 * 40 = 1640 (the hns capture's QP pair): below 2^14, so the port is 0xC000 | 1640
    assert roce_udp_sport(0, 41, 40) == 0xC000 + 1640 == 50792
    # a flow label set by the application wins over the QP numbers
    assert roce_udp_sport(0xABCDE, 41, 40) == flow_label_to_udp_sport(0xABCDE) == 0xC000 | (0x3CDE ^ (0xABCDE >> 14))


def test_sport_matches_the_kernels_arithmetic_and_is_symmetric():
    rng = random.Random(25)
    pairs = [(rng.randrange(1 << 24), rng.randrange(1 << 24)) for _ in range(2000)]
    pairs += [(0xFFFFFF, 0xFFFFFF), (1, 1), (0, 0x123), (0x1A4, 0x2B7)]
    for lqpn, rqpn in pairs:
        assert roce_udp_sport(0, lqpn, rqpn) == kernel_sport(0, lqpn, rqpn), (lqpn, rqpn)
        assert roce_udp_sport(0, lqpn, rqpn) == roce_udp_sport(0, rqpn, lqpn)  # both ends, one port
        assert 0xC000 <= roce_udp_sport(0, lqpn, rqpn) <= 0xFFFF
    for fl in (1, 0x3FFF, 0x4000, 0xFFFFF, 0x12345):
        assert roce_udp_sport(fl, 5, 6) == kernel_sport(fl, 5, 6)


# --- the parser --------------------------------------------------------------------------------------

def test_parse_the_hns_captures():
    [rc] = parse_qps(HNS_RC_CAPTURE)
    assert (rc.device, rc.port, rc.lqpn, rc.rqpn, rc.type, rc.state, rc.pid, rc.comm) == (
        "hns_0", 1, 41, 40, "RC", "RTR", 1523, "ib_send_bw")
    assert rc.sport == 50792
    [gsi] = parse_qps(HNS_GSI_CAPTURE)
    assert (gsi.type, gsi.rqpn, gsi.pid, gsi.comm, gsi.sport) == ("GSI", None, None, "ib_core", None)


def test_bad_output_is_refused_naming_the_entry_and_field():
    with pytest.raises(RdmaOutputError, match="not JSON"):
        parse_qps(HNS_DD_BROKEN)
    with pytest.raises(RdmaOutputError, match="qp entry 1: field 'lqpn' is missing"):
        parse_qps(json.dumps([_qp("mlx5_0", 1, 2, 3), {"ifname": "mlx5_0", "type": "RC", "state": "RTS"}]))
    with pytest.raises(RdmaOutputError, match="field 'pid' is '7', not int"):
        parse_qps(json.dumps([{**_qp("mlx5_0", 1, 2, 3), "pid": "7"}]))
    with pytest.raises(RdmaOutputError, match="expected a JSON list"):
        parse_qps('{"ifname": "mlx5_0"}')
    assert parse_links(LINKS) == {("mlx5_0", 1): "ens1f0np0"}


def test_no_rdma_netlink_here_is_reported_not_raised():
    from hostprobe.rdma_qps import RdmaUnavailable

    with pytest.raises(RdmaUnavailable, match="exit|No such file"):
        run_rdma(["resource", "show", "qp"], rdma="/usr/bin/rdma")  # this kernel has no RDMA netlink
    reporter = QpReporter("h1", {}, interval=1.0, rdma="/usr/bin/rdma")
    assert reporter.read({123: ("job", {(COMM, 0)})}, 0.0, 1) == [] and reporter.unavailable
    assert not reporter.due(100.0)  # not asked again


# --- the join ------------------------------------------------------------------------------------------

def host_records(host: str, text: str, pid: int, rank: int, addr: str, job: str = "job-qp", ts: int = 10**18):
    return qp_records(parse_qps(text), parse_links(LINKS), {pid: (job, {(COMM, rank)})}, host, {"ens1f0np0": addr}, ts)


def test_only_the_nccl_processes_qps_become_records():
    recs = host_records("gpu-b", MLX5_HOST_B, 5200, 1, "10.0.0.2")
    assert [(r.lqpn, r.rqpn, r.netdev, r.src_addr, r.ranks, r.pid) for r in recs] == [
        ("695", 0x1A4, "ens1f0np0", "10.0.0.2", f"{COMM}:1", 5200), ("696", 0x1A5, "ens1f0np0", "10.0.0.2",
                                                                      f"{COMM}:1", 5200)]
    assert recs[0].sport == roce_udp_sport(0, 0x2B7, 0x1A4)


def test_both_ends_joined_into_ranks_and_peers():
    recs = host_records("gpu-a", MLX5_HOST_A, 4100, 0, "10.0.0.1") + host_records("gpu-b", MLX5_HOST_B, 5200, 1,
                                                                                  "10.0.0.2")
    routes = join_qps(recs)
    assert [(r.host, r.lqpn, r.peer_host, r.rqpn, r.comm_id, r.rank, r.peer_rank) for r in routes] == [
        ("gpu-a", 0x1A4, "gpu-b", 0x2B7, COMM, 0, 1), ("gpu-a", 0x1A5, "gpu-b", 0x2B8, COMM, 0, 1),
        ("gpu-b", 0x2B7, "gpu-a", 0x1A4, COMM, 1, 0), ("gpu-b", 0x2B8, "gpu-a", 0x1A5, COMM, 1, 0)]
    assert routes[0].sport == routes[2].sport  # one 5-tuple hash input for both directions
    # one end missing (its agent has not reported): nothing is guessed
    assert join_qps(host_records("gpu-a", MLX5_HOST_A, 4100, 0, "10.0.0.1")) == []


def test_the_join_agrees_with_an_nccl_that_reports_its_qps():
    """An NCCL built with net profiling names each step's QP itself (tests/test_nccl_plugin.py: the IB
    net plugin event's qpNum): the steps' QPs are the joined QPs of the same rank, towards the same peer."""
    recs = host_records("gpu-a", MLX5_HOST_A, 4100, 0, "10.0.0.1") + host_records("gpu-b", MLX5_HOST_B, 5200, 1,
                                                                                  "10.0.0.2")
    routes = join_qps(recs)

    def stats(host, rank, peer, qp):
        return NcclStepStats(host=host, job_id="job-qp", comm_id=COMM, rank=str(rank), peer=str(peer), channel="0",
                             direction="send", connection=str(qp), start_ns=10**18, stop_ns=10**18 + 10**9, pid=1,
                             net="ib", net_device=0, steps=4, bytes=1, net_bytes=1, net_events=4, step_p50_ns=1,
                             step_p99_ns=1, step_max_ns=1)

    good = [stats("gpu-a", 0, 1, 0x1A4), stats("gpu-a", 0, 1, 0x1A5), stats("gpu-b", 1, 0, 0x2B8)]
    assert agrees_with_net_events(routes, good) == []
    bad = [stats("gpu-a", 0, 1, 0x1A9), stats("gpu-b", 1, 3, 0x2B7)]
    assert agrees_with_net_events(routes, bad) == [
        "gpu-a rank 0: QP 425 is not among the host's joined QPs",
        "gpu-b rank 1: QP 695 goes to rank 0, the step says 3"]


def test_the_job_lists_the_hosts_qps_and_a_finding_names_those_crossing_it(tmp_path):
    """No net profiling (stock NCCL): the ranks' QPs come from the hosts; a fabric finding whose path
    is a QP's traced path names the QP and its ranks in the slowdown it explains."""
    state = StateStore(tmp_path / "s.sqlite")
    jobs = NcclJobs(state, lambda _: None, DetectorConfig(min_samples=5, k=3), settle_s=0.0)
    t0 = time.time_ns() - 60 * 10**9
    # a 2-rank job (ranks on gpu-a and gpu-b), its proxy steps without a connection, as stock NCCL gives them
    for seq in range(12):
        recs = [r for r in ring_records(seq, (2 if seq < 8 else 8) * 10**6, job="job-qp", t=t0 + seq * 10**8,
                                        with_comm=seq == 0)
                if r.host in ("h1", "h2") and type(r).__name__ != "NcclProxyStep"]
        recs = [r.model_copy(update={"host": {"h1": "gpu-a", "h2": "gpu-b"}[r.host], "comm_id": COMM}) for r in recs]
        jobs.add(recs)
    a = host_records("gpu-a", MLX5_HOST_A, 4100, 0, "10.0.0.1")
    a[0] = a[0].model_copy(update={"path_id": "p-qp-1a4", "dst_addr": "10.0.0.2", "fwd_hops": "10.1.0.1,10.2.0.1"})
    jobs.add(a + host_records("gpu-b", MLX5_HOST_B, 5200, 1, "10.0.0.2"))
    jobs.flush(force=True)
    ranks = {r.rank: r for r in state.get_job("job-qp").ranks if r.comm_id == COMM}
    assert ranks[0].qps == [0x1A4, 0x1A5] and ranks[1].qps == [0x2B7, 0x2B8]
    [slow] = jobs.slowdowns("job-qp")[0]
    assert {(q.host, q.lqpn, q.path_id) for q in slow.qps} >= {("gpu-a", 0x1A4, "p-qp-1a4")}
    assert "gpu-a>gpu-b" in slow.host_pairs
    finding = Finding(kind="congestion", element="spine1:eth3--leaf2:eth1", element_kind="link", ts=t0,
                      severity="warning", confidence=0.9, summary="congestion on spine1:eth3--leaf2:eth1",
                      evidence={}, paths=["gpu-a:ens1f0np0>gpu-b:ens1f0np0/p-qp-1a4"], jobs=["job-qp"])
    [out] = join([finding], [slow], t0 + 10**10)
    [ev] = out.evidence["job_slowdowns"]
    assert [(q["host"], q["qpn"], q["rank"], q["peer_rank"]) for q in ev["qps"]] == [("gpu-a", 0x1A4, 0, 1)]
    assert "over 1 QP(s) (ranks 0>1)" in out.summary and "job-qp" in out.summary
    state.close()


def test_the_join_agrees_with_the_plugins_recorded_net_events(tmp_path):
    """The real plugin, driven by the C driver as NCCL with net profiling drives it (an IB net event
    per collective step naming QP 1000 + rank), its datagrams folded by the agent's intake; the hosts'
    QP lists for those QPs (rank r's QP 1000 + r connected to its peer's): the steps name exactly the
    joined QPs of their rank, towards their peer."""
    from hostprobe.nccl import NcclIntake
    from tests.nccl.harness import Sink, build_driver, run_driver, short_dir

    sink = Sink(short_dir() / "qp.sock")
    try:
        run_driver(build_driver(tmp_path), 6, "run", 2, 20, NMS_NCCL_SOCKET=str(sink.path), SLURM_JOB_ID="job-qp")
        sink.drain()
    finally:
        sink.close()
    got: list = []
    intake = NcclIntake("h1", lambda kind, record: got.append(record), {})
    for data in sink.datagrams:
        intake.handle(data)
    intake.tick(final=True)
    host_of = {"0": "gpu-a", "1": "gpu-b"}
    steps = [r.model_copy(update={"host": host_of[r.rank]}) for r in got if isinstance(r, NcclStepStats)]
    assert {(s.rank, s.connection, s.net) for s in steps if s.net == "ib"} == {("0", "1000", "ib"), ("1", "1001", "ib")}
    comm = steps[0].comm_id
    lists = {rank: json.dumps([_qp("mlx5_0", 1000 + rank, 1001 - rank, 7000 + rank)]) for rank in (0, 1)}
    recs = []
    for rank, host in ((0, "gpu-a"), (1, "gpu-b")):
        recs += qp_records(parse_qps(lists[rank]), parse_links(LINKS), {7000 + rank: ("job-qp", {(comm, rank)})},
                           host, {}, 10**18)
    routes = join_qps(recs)
    assert [(r.host, r.lqpn, r.rank, r.peer_rank) for r in routes] == [("gpu-a", 1000, 0, 1), ("gpu-b", 1001, 1, 0)]
    assert agrees_with_net_events(routes, steps) == []
    wrong = [s.model_copy(update={"connection": "1002"}) for s in steps if s.net == "ib" and s.rank == "0"][:1]
    assert agrees_with_net_events(routes, wrong) == ["gpu-a rank 0: QP 1002 is not among the host's joined QPs"]


def test_the_agents_intake_reports_the_qps_of_the_processes_it_heard_from(tmp_path):
    """NcclIntake + QpReporter with a stand-in `rdma` that prints the recorded mlx5 list (no RDMA
    netlink here): only the QPs of the plugin's process (pid 4100; not the kernel's), with its job
    and ranks."""
    from hostprobe.nccl import NcclIntake
    from tests.test_nccl_decode import coll, header

    (tmp_path / "qp.json").write_text(MLX5_HOST_A)
    (tmp_path / "link.json").write_text(LINKS)
    tool = tmp_path / "rdma"
    tool.write_text(f'#!/bin/sh\ncase "$2" in resource) cat {tmp_path}/qp.json;; link) cat {tmp_path}/link.json;; '
                    'esac\n')
    tool.chmod(0o755)
    got, stats = [], {}
    intake = NcclIntake("gpu-a", lambda kind, record: got.append((kind, record)), stats)
    intake.handle(header(1, pid=4100, job=b"job-qp") + coll(1))
    reporter = QpReporter("gpu-a", {"ens1f0np0": "10.0.0.1"}, interval=10.0, rdma=str(tool))
    assert reporter.due(100.0) and intake.report_qps(reporter, 100.0) == 3
    assert not reporter.due(105.0) and reporter.due(110.0)
    qps = [r for kind, r in got if kind == "nccl_rdma_qps"]
    assert [(r.lqpn, r.rqpn, r.job_id, r.ranks, r.src_addr, r.state) for r in qps] == [
        ("420", 0x2B7, "job-qp", "0000000000abcdef:3", "10.0.0.1", "RTS"),
        ("421", 0x2B8, "job-qp", "0000000000abcdef:3", "10.0.0.1", "RTS"),
        ("425", None, "job-qp", "0000000000abcdef:3", "10.0.0.1", "INIT")]  # not connected yet: no peer, no port
    assert qps[2].sport is None and qps[0].sport == roce_udp_sport(0, 0x1A4, 0x2B7)
    (tmp_path / "qp.json").write_text(HNS_DD_BROKEN)  # an unreadable list: said, counted, nothing sent
    assert intake.report_qps(reporter, 120.0) == 0 and stats["nccl_bad_records"] == 1
