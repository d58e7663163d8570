"""The service side of the NCCL plugin: bus bandwidth math, the slowdown detector, jobs built from
plugin records (and merged with hand-registered ones), the correlator join, the /jobs API."""

from __future__ import annotations

import json
import threading

import pytest

from correlator.job_impact import NO_CAUSE_AFTER_NS as WAIT
from correlator.job_impact import SlowdownJoin, join
from correlator.jobs_nccl import NcclJobs, merge_jobs
from correlator.slowdown import DetectorConfig, SlowdownDetector, bandwidths, op_bytes, size_bucket
from nms.app.service import Service
from nms.records import (
    Finding,
    Incident,
    Job,
    JobSlowdown,
    NcclCollective,
    NcclCollectivePerf,
    NcclComm,
    NcclProxyOp,
    NcclProxyStep,
    NcclStepStats,
    RankPlacement,
)
from nms.state import StateStore
from tests.helpers import api_client, auth, make_config, wait_until

T0 = 1_700_000_000 * 10**9
COMM = "00000000000000aa"
MIB = 1 << 20


# --- bus bandwidth (nccl-tests doc/PERFORMANCE.md) --------------------------------------------

@pytest.mark.parametrize("op,n,factor", [("AllReduce", 8, 2 * 7 / 8), ("AllReduce", 2, 1.0), ("AllGather", 4, 3 / 4),
                                         ("ReduceScatter", 16, 15 / 16), ("Broadcast", 8, 1.0), ("Reduce", 8, 1.0),
                                         ("AllToAll", 4, 3 / 4), ("Send", 2, 1.0)])
def test_bus_factor_per_op(op, n, factor):
    algbw, busbw = bandwidths(op, 4 * MIB, n, 2 * 10**6)  # 4 MiB in 2 ms
    assert algbw == pytest.approx(4 * MIB / 2e6)  # bytes/ns = GB/s
    assert busbw == pytest.approx(algbw * factor)


def test_allgather_size_is_the_gathered_buffer():
    assert op_bytes("AllGather", MIB, 8) == 8 * MIB and op_bytes("ReduceScatter", MIB, 4) == 4 * MIB
    assert op_bytes("AllReduce", MIB, 8) == MIB


def test_size_buckets_and_bad_duration():
    assert [size_bucket(b) for b in (0, 1, 1023, 1024, 3 * MIB, 1 << 30, 5 << 30)] == \
        ["0B", "1B", "512B", "1KiB", "2MiB", "1GiB", "4GiB"]
    with pytest.raises(ValueError):
        bandwidths("AllReduce", MIB, 2, 0)


# --- the detector ---------------------------------------------------------------------------------

def perf(seq: int, busbw: float, bucket: str = "1MiB", op: str = "AllReduce", job: str = "j1") -> NcclCollectivePerf:
    return NcclCollectivePerf(job_id=job, comm_id=COMM, op=op, size_bucket=bucket, start_ns=T0 + seq * 10**6,
                              seq=seq, bytes=MIB, nranks=4, ranks_seen=4, duration_ns=10**6, algbw_gbps=busbw / 1.5,
                              busbw_gbps=busbw)


def run(detector, values, start=0, **kw):
    return [detector.observe(perf(start + i, v, **kw)) for i, v in enumerate(values)]


def test_no_verdict_before_the_baseline_has_min_samples():
    d = SlowdownDetector(DetectorConfig(min_samples=8, k=3))
    out = run(d, [10.0] * 7 + [1.0, 1.0, 1.0])  # 7 good then slow ones: the 8th sample completes the baseline
    assert [c.slow for c, _ in out[:8]] == [False] * 8
    assert out[7][0].baseline_busbw_gbps is None
    assert [c.slow for c, _ in out[8:]] == [True, True]
    assert d.active() == []  # only 2 slow verdicts so far: k=3 not reached


def test_k_consecutive_slow_start_and_k_good_clear():
    d = SlowdownDetector(DetectorConfig(min_samples=5, k=3))
    run(d, [10.0, 11.0, 9.0, 10.0, 10.5])
    changes = [ch for _, ch in run(d, [5.0, 5.0, 10.0, 5.0, 5.0, 5.0], start=5)]
    assert changes == [None, None, None, None, None, "started"]  # a good one broke the first run of two
    [s] = d.active("j1")
    assert s.slow_collectives == [8, 9, 10] and s.baseline_busbw_gbps == 10.0 and s.ratio == pytest.approx(0.5)
    assert s.since_ns == T0 + 8 * 10**6
    changes = [ch for _, ch in run(d, [10.0, 10.0, 4.0, 10.0, 10.0, 10.0], start=11)]
    assert changes == [None, None, None, None, None, "cleared"]
    assert d.active() == [] and d.history[-1].cleared_ns == T0 + 16 * 10**6
    assert d.history[-1].slow_collectives == [8, 9, 10, 13]


def test_slow_collectives_stay_out_of_the_baseline():
    d = SlowdownDetector(DetectorConfig(window=8, min_samples=4, k=2))
    run(d, [10.0] * 8)
    out = run(d, [3.0] * 50, start=8)  # a long slowdown does not become the new normal
    assert all(c.slow and c.baseline_busbw_gbps == 10.0 for c, _ in out)


def test_size_buckets_and_ops_have_their_own_baselines():
    d = SlowdownDetector(DetectorConfig(min_samples=4, k=2))
    run(d, [10.0] * 6, bucket="1MiB")
    run(d, [1.0] * 6, bucket="4KiB")  # small messages: low busbw is their normal
    out = run(d, [1.0] * 3, start=6, bucket="4KiB")
    assert not any(c.slow for c, _ in out)
    out = run(d, [1.0] * 3, start=9, bucket="1MiB")
    assert all(c.slow for c, _ in out) and [s.size_bucket for s in d.active()] == ["1MiB"]
    assert not any(c.slow for c, _ in run(d, [1.0] * 8, start=20, op="AllGather"))  # no baseline: no verdict


def test_detector_config_is_checked():
    with pytest.raises(ValueError):
        DetectorConfig(ratio=1.5)
    with pytest.raises(ValueError):
        DetectorConfig(window=4, min_samples=8)


# --- jobs and collectives from plugin records -----------------------------------------------------

HOSTS = ["h1", "h2", "h3", "h4"]


def ring_records(seq: int, duration_ns: int, job: str = "job-7", nbytes: int = MIB, t: int | None = None,
                 with_comm: bool = False) -> list:
    """What the plugin ships for one ring AllReduce of 4 ranks (one per host): per rank the
    collective (stop = enqueued, 10 us), a send and a recv proxy op (the network's end) and a step
    each with its QP."""
    t = T0 + seq * 10**8 if t is None else t
    out = []
    for rank, host in enumerate(HOSTS):
        base = dict(host=host, job_id=job, comm_id=COMM, rank=str(rank), pid=100 + rank)
        if with_comm:
            out.append(NcclComm(**base, start_ns=T0 - 10**9, stop_ns=T0 - 10**9, event_id=1, nranks=4, nnodes=4,
                                abi_version=6))
        cid = 1000 + seq
        out.append(NcclCollective(**base, start_ns=t, stop_ns=t + 10_000, event_id=cid, kind="coll", op="AllReduce",
                                  count=nbytes // 4, datatype="ncclFloat32", bytes=nbytes, seq=seq))
        for i, (peer, send) in enumerate((((rank + 1) % 4, True), ((rank - 1) % 4, False))):
            stop = t + duration_ns - (0 if rank == 2 else 1000)  # rank 2 finishes last
            out.append(NcclProxyOp(**base, start_ns=t + 20_000, stop_ns=stop, event_id=10 * cid + i, parent_id=cid,
                                   channel=0, peer=peer, is_send=send, n_steps=1, chunk_size=nbytes, steps=1,
                                   trans_bytes=nbytes))
            out.append(NcclProxyStep(**base, start_ns=t + 20_000, stop_ns=stop, event_id=100 * cid + i,
                                     parent_id=10 * cid + i, step=0, peer=peer, channel=0, is_send=send,
                                     trans_size=nbytes, net="ib", connection=0x100 + 10 * rank + i, net_device=0,
                                     net_events=1, net_bytes=nbytes))
    return out


def folded(records: list) -> list:
    """The records as the agents send them: each host's proxy steps folded into per-second stats
    (hostprobe/nccl_steps.py), no raw step."""
    from hostprobe.nccl_steps import StepFolder

    folders: dict[str, StepFolder] = {}
    out = [r for r in records if not isinstance(r, NcclProxyStep)]
    for r in records:
        if isinstance(r, NcclProxyStep):
            event = {**r.model_dump(), "rank": int(r.rank)}
            folders.setdefault(r.host, StepFolder(r.host)).add(r.pid, r.job_id, event)
    for folder in folders.values():
        stats, errors = folder.drain()
        assert errors == []
        out += stats
    return out


@pytest.fixture
def tracked(tmp_path):
    state = StateStore(tmp_path / "state.sqlite")
    written: list = []
    jobs = NcclJobs(state, written.extend, DetectorConfig(min_samples=5, k=3), settle_s=0.0)
    yield jobs, state, written
    state.close()


def test_a_job_appears_with_ranks_hosts_peers_and_qps(tracked):
    jobs, state, written = tracked
    jobs.add(ring_records(0, 2 * 10**6, with_comm=True))
    [perf0] = jobs.flush()
    job = state.get_job("job-7")
    assert job.hosts == HOSTS and job.labels == {"source": "nccl"} and job.start == T0 - 10**9
    assert [(r.rank, r.host, r.comm_id) for r in job.ranks] == [(i, h, COMM) for i, h in enumerate(HOSTS)]
    assert job.ranks[1].peers == [0, 2] and job.ranks[1].qps == [0x10a, 0x10b] and job.ranks[1].net_devices == [0]
    # the slowest rank decides: start -> its last proxy op's stop, not the 10 us enqueue
    assert perf0.duration_ns == 2 * 10**6 and perf0.ranks_seen == 4 and perf0.nranks == 4
    assert perf0.busbw_gbps == pytest.approx(MIB / 2e6 * 1.5) and perf0.size_bucket == "1MiB"
    assert written == [perf0]


def test_the_agents_step_stats_stand_for_the_steps(tracked):
    """Without raw steps (the agent's default) the job gets the same ranks, peers, QPs and devices,
    and the collectives the same durations and slowdown."""
    jobs, state, written = tracked
    for seq in range(12):
        jobs.add(folded(ring_records(seq, (2 if seq < 8 else 8) * 10**6, with_comm=seq == 0)))
    jobs.flush(force=True)
    job = state.get_job("job-7")
    assert [(r.rank, r.host, r.peers, r.qps, r.net_devices) for r in job.ranks] == [
        (i, h, sorted({(i + 1) % 4, (i - 1) % 4}), [0x100 + 10 * i, 0x101 + 10 * i], [0]) for i, h in enumerate(HOSTS)]
    assert [c.duration_ns for c in written] == [2 * 10**6] * 8 + [8 * 10**6] * 4
    [slow] = jobs.slowdowns("job-7")[0]
    assert slow.slow_collectives == [8, 9, 10, 11] and slow.host_pairs


class _SlowFirstRead(StateStore):
    """A state store whose first read of a job (alone or in an update) waits up to `hold_s` for `go`:
    the interleaving of two flushes that the lab's ingest threads and correlation step produce under load."""

    def __init__(self, path, hold_s: float):
        super().__init__(path)
        self.go, self.hold_s, self.reads = threading.Event(), hold_s, 0

    def _read(self):
        self.reads += 1
        if self.reads == 1:
            self.go.wait(self.hold_s)

    def get_job(self, job_id):
        current = super().get_job(job_id)
        self._read()
        return current

    def update_job(self, job_id, change):
        return super().update_job(job_id, lambda current: (self._read(), change(current))[1])


def test_two_flushes_at_once_lose_no_rank_qps(tmp_path):
    """A flush that read the job before another wrote it must not write its stale merge over it: the
    ranks' QPs are learned once, and a lost write left a rank without QPs for good (issue 27, the
    jobs lab in full runs)."""
    state = _SlowFirstRead(tmp_path / "s.sqlite", hold_s=1.0)
    jobs = NcclJobs(state, lambda _: None, settle_s=0.0)
    records = folded(ring_records(0, 10**6, with_comm=True))
    jobs.add([r for r in records if not isinstance(r, NcclStepStats)])  # placed, no QP yet
    first = threading.Thread(target=jobs.flush)
    first.start()  # its read of the (absent) job waits
    wait_until(lambda: state.reads == 1, 5, 0.01, what="the first flush's read")
    jobs.add([r for r in records if isinstance(r, NcclStepStats)])  # the QPs
    second = threading.Thread(target=jobs.flush)
    second.start()
    second.join(0.3)
    state.go.set()
    first.join(5)
    second.join(5)
    assert [r.qps for r in state.get_job("job-7").ranks] == [[0x100 + 10 * i, 0x101 + 10 * i] for i in range(4)]
    state.close()


def test_records_without_a_job_id_build_nothing(tracked):
    jobs, state, written = tracked
    jobs.add([r.model_copy(update={"job_id": None}) for r in ring_records(0, 10**6)])
    assert jobs.flush() == [] and state.list_jobs() == []


def test_a_collective_waits_for_its_proxy_ops(tmp_path):
    state = StateStore(tmp_path / "s.sqlite")
    jobs = NcclJobs(state, lambda _: None, settle_s=30.0)
    recs = ring_records(0, 5 * 10**6)
    jobs.add([r for r in recs if isinstance(r, NcclCollective)])
    assert jobs.flush() == []  # not settled: the proxy ops are still to come
    jobs.add([r for r in recs if not isinstance(r, NcclCollective)])
    [c] = jobs.flush(force=True)
    assert c.duration_ns == 5 * 10**6
    state.close()


def test_a_slowdown_from_plugin_records(tracked):
    jobs, _, written = tracked
    for seq in range(8):
        jobs.add(ring_records(seq, 2 * 10**6))
    for seq in range(8, 12):
        jobs.add(ring_records(seq, 6 * 10**6))  # a third of the bandwidth
    jobs.flush()
    active, cleared = jobs.slowdowns("job-7")
    [s] = active
    assert s.slow_collectives == [8, 9, 10, 11] and s.ratio == pytest.approx(1 / 3)
    assert s.host_pairs == ["h1>h2", "h1>h4", "h2>h1", "h2>h3", "h3>h2", "h3>h4", "h4>h1", "h4>h3"]
    assert [c.slow for c in written] == [False] * 8 + [True] * 4 and cleared == []


def test_hand_registered_job_wins_and_keeps_plugin_ranks(tracked):
    jobs, state, _ = tracked
    jobs.add(ring_records(0, 10**6, with_comm=True))
    jobs.flush()
    hand = Job(id="job-7", name="llama-70b", hosts=["h1", "h9"], ranks=[RankPlacement(rank=0, host="h1", nic="eth1")],
               start=T0 + 5, labels={"team": "x"})
    assert jobs.register(hand) is False  # it existed: merged, not duplicated
    [job] = state.list_jobs()
    assert job.name == "llama-70b" and job.start == T0 + 5 and job.labels == {"team": "x", "source": "api+nccl"}
    assert job.hosts == ["h1", "h9", "h2", "h3", "h4"]
    r0 = job.ranks[0]
    assert (r0.rank, r0.host, r0.nic, r0.comm_id, r0.qps) == (0, "h1", "eth1", COMM, [0x100, 0x101])
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]
    # later plugin data still merges into the hand-registered job, which keeps winning
    jobs.add(ring_records(1, 10**6))
    jobs._dirty_jobs.add("job-7")
    jobs.flush()
    job = state.get_job("job-7")
    assert job.name == "llama-70b" and job.start == T0 + 5 and len(job.ranks) == 4


def test_merge_a_rank_placed_elsewhere_by_hand_wins():
    found = Job(id="j", hosts=["a", "b"], ranks=[RankPlacement(rank=0, host="a", comm_id=COMM, qps=[1]),
                                                  RankPlacement(rank=1, host="b", comm_id=COMM)], start=T0)
    hand = Job(id="j", hosts=["b"], ranks=[RankPlacement(rank=0, host="b", comm_id=COMM)], start=T0 + 1)
    merged = merge_jobs(hand, found)
    assert [(r.rank, r.host, r.qps) for r in merged.ranks] == [(0, "b", []), (1, "b", [])]
    assert Job.model_validate(merged.model_dump())  # still a valid job


# --- the join --------------------------------------------------------------------------------------

def slowdown(pairs=("h1>h2", "h2>h1")) -> JobSlowdown:
    return JobSlowdown(job_id="job-7", comm_id=COMM, op="AllReduce", size_bucket="1MiB", since_ns=T0,
                       baseline_busbw_gbps=10.0, busbw_gbps=4.0, ratio=0.4, slow_collectives=[8, 9, 10],
                       host_pairs=list(pairs))


def link_finding(paths, jobs=("job-7",), element="leaf1:swp1--spine1:swp1") -> Finding:
    return Finding(kind="congestion", element=element, element_kind="link", ts=T0, confidence=0.9,
                   severity="major", summary="congested", paths=list(paths), jobs=list(jobs))


def test_a_fabric_finding_on_the_jobs_paths_names_the_slowed_collectives():
    f = link_finding(["h1:eth1>h2:eth1/3", "h5:eth1>h6:eth1/1"])
    [out] = join([f], [slowdown()], T0)
    assert out.kind == "congestion" and "slows job job-7: AllReduce 1MiB at 40%" in out.summary
    [ev] = out.evidence["job_slowdowns"]
    assert ev["slow_collectives"] == [8, 9, 10] and ev["op"] == "AllReduce" and ev["ratio"] == 0.4


def test_no_fabric_cause_is_its_own_finding():
    off_path = link_finding(["h5:eth1>h6:eth1/1"])  # the job is attached, but not on its ranks' pairs
    other_job = link_finding(["h1:eth1>h2:eth1/3"], jobs=["job-8"])
    assert join([off_path, other_job], [slowdown()], T0 + WAIT - 1) == [off_path, other_job]  # too young
    out = join([off_path, other_job], [slowdown()], T0 + WAIT)
    assert out[:2] == [off_path, other_job]  # untouched
    [j] = out[2:]
    assert (j.kind, j.element, j.element_kind, j.jobs, j.dedup_key) == ("job_slowdown", "job-7", "job", ["job-7"],
                                                                        "job:job-7")
    assert "no fabric element" in j.summary and j.evidence["fabric_cause"] is None
    assert j.evidence["job_slowdowns"][0]["slow_collectives"] == [8, 9, 10]


def test_a_finding_at_a_jobs_host_explains_it():
    nic = Finding(kind="nic_down", element="h2:eth1", element_kind="nic", ts=T0, confidence=1, severity="critical",
                  summary="down", jobs=["job-7"])
    [out] = join([nic], [slowdown()], T0)
    assert out.evidence["job_slowdowns"][0]["job"] == "job-7"


def test_an_open_fabric_incident_explains_a_slowdown_in_a_window_without_its_finding():
    f = link_finding(["h1:eth1>h2:eth1/3"])
    inc = Incident(id=1, dedup_key=f"link:{f.element}", kind=f.kind, element=f.element, element_kind="link",
                   severity="major", summary=f.summary, confidence=0.9, paths=f.paths, jobs=f.jobs,
                   opened_ns=T0, updated_ns=T0, last_seen_ns=T0, clean_windows=1)
    later = T0 + WAIT + 10**9
    assert join([], [slowdown()], later, open_incidents=[inc]) == []
    assert join([], [slowdown()], later, open_incidents=[inc.model_copy(update={"jobs": ["job-8"]})])[0].kind == \
        "job_slowdown"  # an incident of another job explains nothing


def test_a_slowdown_the_fabric_explained_stays_explained_until_it_clears():
    joined = SlowdownJoin()
    f = link_finding(["h1:eth1>h2:eth1/3"])
    assert joined([f], [slowdown()], T0)[0].evidence["job_slowdowns"]
    # the fault healed and its incident resolved; the collectives are still recovering
    assert joined([], [slowdown()], T0 + 2 * WAIT) == []
    # the slowdown cleared; a new one (a new start) with no fabric cause is the host's
    assert joined([], [], T0 + 2 * WAIT + 10**9) == []
    again = slowdown().model_copy(update={"since_ns": T0 + 2 * WAIT + 2 * 10**9})
    assert [x.kind for x in joined([], [again], again.since_ns + WAIT)] == ["job_slowdown"]


# --- service and API ----------------------------------------------------------------------------------

@pytest.fixture
def client(tmp_path):
    service = Service(make_config(tmp_path))
    service.nccl_jobs.settle_s = 0.0
    service.nccl_jobs.detector.config = DetectorConfig(min_samples=5, k=3)
    with api_client(service) as c:
        yield c


def _ingest(client, records):
    # the proxy ops before their collectives (the agent posts each kind on its own; any order)
    by_kind = {NcclComm: "nccl_comms", NcclProxyOp: "nccl_proxy_ops", NcclProxyStep: "nccl_proxy_steps",
               NcclCollective: "nccl_collectives"}
    for cls, kind in by_kind.items():
        items = [r.model_dump(mode="json") for r in records if type(r) is cls]
        if items:
            r = client.post(f"/ingest/{kind}", json={"items": items}, headers=auth("ingest"))
            assert r.status_code == 200, r.text


def test_api_collectives_slowdowns_and_merge(client, tmp_path):
    _ingest(client, ring_records(0, 2 * 10**6, with_comm=True))
    for seq in range(1, 8):
        _ingest(client, ring_records(seq, 2 * 10**6))
    for seq in range(8, 11):
        _ingest(client, ring_records(seq, 8 * 10**6))
    job = client.get("/jobs/job-7", headers=auth("read")).json()
    assert job["hosts"] == HOSTS and job["labels"]["source"] == "nccl"
    colls = client.get("/jobs/job-7/collectives", headers=auth("read")).json()
    assert [c["seq"] for c in colls] == list(range(11))
    assert [c["slow"] for c in colls] == [False] * 8 + [True] * 3
    assert colls[-1]["busbw_gbps"] == pytest.approx(MIB / 8e6 * 1.5) and colls[-1]["baseline_busbw_gbps"] > 0
    assert len(client.get("/jobs/job-7/collectives?limit=2", headers=auth("read")).json()) == 2
    slow = client.get("/jobs/job-7/slowdowns", headers=auth("read")).json()
    assert [s["slow_collectives"] for s in slow["active"]] == [[8, 9, 10]] and slow["cleared"] == []
    assert client.get("/jobs/nope/slowdowns", headers=auth("read")).status_code == 404
    assert client.get("/jobs/job-7/collectives", headers=auth("ingest")).status_code == 403
    r = client.post("/jobs", json={"id": "job-7", "name": "hand", "hosts": ["h1"], "start": T0},
                    headers=auth("ingest"))
    assert r.status_code == 200 and r.json()["name"] == "hand" and len(r.json()["ranks"]) == 4
    # the correlator's step: no fabric finding, so the slowdown is its own incident (the service's
    # own correlator loop, stepping on its clock meanwhile, may have opened it first: one incident)
    client.service.correlation.step(T0 + WAIT + 10**9)
    inc = client.get("/incidents?job=job-7", headers=auth("read")).json()
    assert [(i["kind"], i["element"]) for i in inc] == [("job_slowdown", "job-7")], inc
    assert "no fabric element" in inc[0]["summary"]
    # an API worker of a cluster (no `correlate`, the same state): the slowdowns the step shared
    worker = Service(make_config(tmp_path), store=client.service.store, roles=frozenset({"api"}))
    with api_client(worker) as w:
        shared = w.get("/jobs/job-7/slowdowns", headers=auth("read")).json()
        assert shared == client.get("/jobs/job-7/slowdowns", headers=auth("read")).json()
        assert [s["slow_collectives"] for s in shared["active"]] == [[8, 9, 10]]


def test_nms_jobs_show_against_a_running_service(tmp_path):
    """`nms jobs show` on a real `nms serve` fed plugin records through /ingest (default detector:
    8 samples of baseline, 3 slow in a row; settle 1 s)."""
    import time

    import httpx

    from tests.test_cli_service import TOKEN, nms, start_server
    srv = start_server(tmp_path)
    try:
        url, t = srv["url"], time.time_ns() - 60 * 10**9
        kinds = {NcclComm: "nccl_comms", NcclProxyOp: "nccl_proxy_ops", NcclStepStats: "nccl_step_stats",
                 NcclCollective: "nccl_collectives"}
        records = []
        for seq in range(12):
            records += ring_records(seq, (2 if seq < 9 else 8) * 10**6, job="job-9", t=t + seq * 10**8,
                                    with_comm=seq == 0)
        records = folded(records)  # the agents' way: steps as per-second stats, no raw step
        for cls, kind in kinds.items():
            r = httpx.post(f"{url}/ingest/{kind}", headers={"Authorization": f"Bearer {TOKEN}"},
                           json={"items": [x.model_dump(mode="json") for x in records if type(x) is cls]})
            assert r.json()["rejected"] == []
        time.sleep(1.2)  # the collectives settle
        out = nms("jobs", "show", "job-9", "--json", url=url)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert [c["seq"] for c in data["collectives"]] == list(range(12))
        assert [s["slow_collectives"] for s in data["slowdowns"]["active"]] == [[9, 10, 11]]
        out = nms("jobs", "show", "job-9", "--last", "5", url=url)
        assert out.returncode == 0, out.stderr
        for text in ("job job-9", "h1, h2, h3, h4", "AllReduce", "SLOW", "active", "9,10,11", "0x100"):
            assert text in out.stdout, out.stdout
        assert nms("jobs", "show", "nope", url=url).returncode != 0
    finally:
        srv["proc"].kill()
        srv["proc"].wait()


def test_ranks_arriving_apart_make_one_collective_and_proxy_ops_late_are_waited_for(tmp_path):
    """Agents post at their own pace: a collective's ranks come in separate batches, and a rank's
    proxy ops may come seconds after its collective record (a slow collective)."""
    state = StateStore(tmp_path / "s.sqlite")
    jobs = NcclJobs(state, lambda _: None, settle_s=0.0, max_wait_s=30.0)
    recs = ring_records(0, 3 * 10**6, with_comm=True)
    colls = [r for r in recs if isinstance(r, NcclCollective)]
    ops = [r for r in recs if isinstance(r, (NcclProxyOp, NcclProxyStep))]
    jobs.add([r for r in recs if isinstance(r, NcclComm)] + colls)
    assert jobs.flush() == []  # no proxy op yet: not done, however long ago its record came (below max_wait)
    jobs.add([r for r in ops if r.host in ("h1", "h2")])
    assert jobs.flush() == []  # two ranks done, two to come
    jobs.add([r for r in ops if r.host in ("h3", "h4")])
    [c] = jobs.flush()
    assert (c.ranks_seen, c.duration_ns, c.seq) == (4, 3 * 10**6, 0)
    # a later collective's proxy ops finish the earlier one of the same process without waiting
    jobs.settle_s = 3600.0
    first, second = ring_records(1, 10**6), ring_records(2, 10**6)
    jobs.add(first)
    assert jobs.flush() == []
    jobs.add([r for r in second if not isinstance(r, NcclCollective)]
             + [r for r in second if isinstance(r, NcclCollective)])
    assert [c.seq for c in jobs.flush()] == [1]
    state.close()


def test_what_the_plugin_learns_about_a_rank_accumulates(tracked):
    """Proxy records of one rank come over many batches: its peers and QPs only grow."""
    jobs, state, _ = tracked
    recs = ring_records(0, 10**6, with_comm=True)
    jobs.add([r for r in recs if not isinstance(r, (NcclProxyOp, NcclProxyStep)) or r.is_send])
    jobs.flush()
    assert state.get_job("job-7").ranks[1].qps == [0x10a] and state.get_job("job-7").ranks[1].peers == [2]
    jobs.add([r for r in recs if isinstance(r, (NcclProxyOp, NcclProxyStep)) and not r.is_send])
    jobs.flush()
    r1 = state.get_job("job-7").ranks[1]
    assert r1.qps == [0x10a, 0x10b] and r1.peers == [0, 2]
