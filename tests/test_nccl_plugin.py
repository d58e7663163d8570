"""The NCCL profiler plugin as NCCL uses it, through the C driver (tests/nccl/driver.c): every ABI
version, many threads, every record once with its fields, drops counted and never blocking, init
failures. No GPU or NCCL here: the driver calls the ABI the way NCCL's src/plugin/profiler.cc does."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter, defaultdict

import pytest

from nccl_plugin import library_path
from nccl_plugin.decode import to_records
from tests.nccl.harness import Sink, build_driver, run_driver, short_dir

THREADS, ITERS = 4, 150  # 2 communicators of 2 ranks, each rank on its own thread
MAX_CALL_NS = 50_000_000  # a call that takes this long has waited (2 shared cores preempt for ms)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("driver"))


@pytest.fixture
def sock_dir():
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sink():
    s = Sink(short_dir() / "agent.sock")
    yield s
    s.close()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_every_record_arrives_once_with_its_fields(driver, sink, version):
    out = run_driver(driver, version, "run", THREADS, ITERS, NMS_NCCL_SOCKET=str(sink.path), SLURM_JOB_ID="777")
    expected = int(out["expected"])
    assert int(out["recorded"]) == int(out["sent"]) == expected
    assert out["dropped_ring"] == out["dropped_slots"] == out["dropped_send"] == "0"
    batches = sink.batches()
    assert sum(len(b.events) for b in batches) == expected and not any(b.errors for b in batches)
    assert {b.job_id for b in batches} == {"777"} and {b.abi_version for b in batches} == {version}
    records = [r for b in batches for r in to_records(b, "h1")[0]]
    assert len(records) == expected  # every event validates as a record
    ids = [(r.pid, r.event_id) for _, r in records]
    assert len(set(ids)) == len(ids)  # each once

    by_kind: dict[str, list] = defaultdict(list)
    for kind, r in records:
        by_kind[getattr(r, "kind", kind)].append(r)
        assert r.host == "h1" and r.job_id == "777" and r.rank in ("0", "1")
        assert r.comm_id in ("000000c0ffee0000", "000000c0ffee0001") and r.start_ns <= r.stop_ns
    n_tasks = THREADS * ITERS
    assert Counter({k: len(v) for k, v in by_kind.items()}) == Counter(
        {"coll": n_tasks, "p2p": n_tasks, "nccl_proxy_ops": 2 * n_tasks, "nccl_proxy_steps": 4 * n_tasks,
         **({"nccl_comms": THREADS} if version >= 4 else {})})

    colls = by_kind["coll"]
    assert {(c.op, c.datatype, c.algo, c.proto, c.channels, c.warps) for c in colls} == {
        ("AllReduce", "ncclFloat32", "RING", "SIMPLE", 2, 8)}
    per_rank = defaultdict(set)
    for c in colls:
        assert c.bytes == 4 * c.count
        per_rank[(c.comm_id, c.rank)].add((c.seq, c.count))
    assert all(v == {(i, 1024 + i) for i in range(ITERS)} for v in per_rank.values()) and len(per_rank) == THREADS
    for p in by_kind["p2p"]:
        assert (p.op, p.datatype, p.bytes, p.peer) == ("Send", "ncclInt8", p.count, 1 - int(p.rank))

    tasks = {(t.pid, t.event_id): t for t in colls + by_kind["p2p"]}
    ops = {(o.pid, o.event_id): o for o in by_kind["nccl_proxy_ops"]}
    for o in ops.values():  # each op under its task, although the task stopped before the op started
        task = tasks[(o.pid, o.parent_id)]
        assert (task.comm_id, task.rank) == (o.comm_id, o.rank) and task.stop_ns <= o.start_ns
        assert (o.peer, o.is_send, o.n_steps, o.chunk_size, o.steps) == (1 - int(o.rank), True, 2, 4096, 2)
        assert o.trans_bytes == (8192 if version >= 4 else 0)  # v1-v3 step states carry no transfer size
    assert Counter(o.parent_id for o in ops.values()).most_common(1)[0][1] == 1  # one op per task
    for s in by_kind["nccl_proxy_steps"]:
        op = ops[(s.pid, s.parent_id)]
        assert (s.peer, s.channel, s.is_send) == (op.peer, op.channel, True) and s.step in (0, 1)
        assert op.start_ns <= s.start_ns <= s.stop_ns <= op.stop_ns
        assert 0 < s.send_gpu_wait_ns <= s.send_wait_ns <= s.stop_ns - s.start_ns
        assert (s.send_peer_wait_ns is not None) == (version >= 4)
        assert s.trans_size == (4096 if version >= 4 else 0)
        is_coll = tasks[(op.pid, op.parent_id)].kind == "coll"
        if version >= 3:  # the network plugin's event names the step's QP (collectives) or socket (p2p)
            thread = 2 * (int(s.comm_id, 16) - 0xC0FFEE0000) + int(s.rank)  # the driver's numbering
            want = ("ib", 1000 + thread, 1) if is_coll else ("socket", 50 + thread, None)
            assert (s.net, s.connection, s.net_device, s.net_events, s.net_bytes) == (*want, 1, 4096)
        else:
            assert s.net is None and s.connection is None and s.net_events == 0
    for c in by_kind.get("nccl_comms", []):
        assert (c.nranks, c.nnodes, c.comm_name, c.abi_version) == (2, 1, "driver-comm", version)


def test_job_id_from_the_variable_named_by_nms_job_id_var(driver, sink):
    run_driver(driver, 6, "run", 1, 5, NMS_NCCL_SOCKET=str(sink.path), NMS_JOB_ID_VAR="MY_JOB", MY_JOB="train-42",
               SLURM_JOB_ID="777")
    assert {b.job_id for b in sink.batches()} == {"train-42"}


def test_no_launcher_variable_no_job_id(driver, sink):
    run_driver(driver, 6, "run", 1, 5, NMS_NCCL_SOCKET=str(sink.path))
    batches = sink.batches()
    assert batches and {b.job_id for b in batches} == {None}
    assert all(r.job_id is None for b in batches for _, r in to_records(b, "h1")[0])


def test_no_agent_socket_counts_drops_and_never_blocks(driver, sock_dir):
    path = sock_dir / "absent.sock"
    out = run_driver(driver, 6, "run", THREADS, 2000, NMS_NCCL_SOCKET=str(path), NMS_NCCL_RING_SIZE="256")
    expected, recorded = int(out["expected"]), int(out["recorded"])
    assert int(out["dropped_ring"]) > 0 and recorded + int(out["dropped_ring"]) == expected
    assert int(out["dropped_send"]) == recorded and out["sent"] == "0" and out["dropped_slots"] == "0"
    assert int(out["max_call_ns"]) < MAX_CALL_NS


def test_a_stalled_agent_costs_drops_not_waits(driver):
    stalled = Sink(short_dir() / "stalled.sock", reading=False, rcvbuf=1024)
    try:
        out = run_driver(driver, 6, "run", THREADS, 2000, NMS_NCCL_SOCKET=str(stalled.path),
                         NMS_NCCL_RING_SIZE="256", NMS_NCCL_SEND_WAIT_MS="20")
        expected, recorded, sent = int(out["expected"]), int(out["recorded"]), int(out["sent"])
        assert recorded + int(out["dropped_ring"]) == expected and sent + int(out["dropped_send"]) == recorded
        assert int(out["dropped_ring"]) + int(out["dropped_send"]) > 0 and int(out["max_call_ns"]) < MAX_CALL_NS
        assert int(out["wall_ns"]) < 30e9
        got = stalled.batches()  # what the socket did take is whole
        assert sum(len(b.events) for b in got) == sent and not any(b.errors for b in got)
    finally:
        stalled.close()


def test_an_agent_that_comes_late_gets_the_records_after(driver, sock_dir):
    """The plugin starts before the agent: records wait in the ring, then flow once the socket exists."""
    path = sock_dir / "late.sock"
    proc = subprocess.Popen([str(driver), str(library_path()), "6", "run", "1", "3000"],
                            env={"NMS_NCCL_SOCKET": str(path), "NMS_NCCL_RING_SIZE": "65536",
                                 "DRIVER_HOLD_MS": "1500"},
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.05)
    late = Sink(path)
    try:
        out = dict(line.split("=", 1) for line in proc.communicate(timeout=60)[0].splitlines())
        assert int(out["sent"]) == int(out["recorded"]) == int(out["expected"])  # all waited in the ring
        assert sum(len(b.events) for b in late.batches()) == int(out["expected"])
    finally:
        late.close()


def test_every_version_symbol_is_exported_with_its_layout(driver):
    out = run_driver(driver, "-", "layout")
    for version in range(1, 7):
        assert out[f"ncclProfiler_v{version}"] == "name:nms functions_in_plugin:1 init:0 mask:158 handle:1"


@pytest.mark.parametrize("env, code", [
    ({"NMS_NCCL_RING_SIZE": "1000"}, 4),  # not a power of two
    ({"NMS_NCCL_SLOTS": "8"}, 4),
    ({"NMS_NCCL_EVENT_MASK": "all"}, 4),
    ({"NMS_NCCL_FLUSH_MS": "0"}, 4),
    ({"NMS_NCCL_SOCKET": "/tmp/" + "x" * 120}, 4),  # longer than a Unix socket path
])
@pytest.mark.parametrize("version", [1, 4, 6])
def test_init_fails_cleanly_on_bad_settings(driver, env, code, version):
    out = run_driver(driver, version, "init", **env)
    assert out == {"init": str(code), "context_null": "1"}


def test_init_activates_collectives_p2p_proxy_ops_steps_and_network_events(driver):
    default = 0b10011110  # Coll | P2p | ProxyOp | ProxyStep | NetPlugin
    assert run_driver(driver, 6, "init") == {"init": "0", "context_null": "0", "mask": str(default)}
    assert run_driver(driver, 6, "init", NMS_NCCL_EVENT_MASK="0x6")["mask"] == "6"


def test_slot_table_exhaustion_is_counted_and_the_rest_recorded(driver, sink):
    """Groups of 12 collectives + 12 p2ps in flight on 4 threads against 16 event slots: events that
    find none are counted, never waited for."""
    out = run_driver(driver, 5, "run", 4, 240, NMS_NCCL_SOCKET=str(sink.path), NMS_NCCL_SLOTS="16",
                     NMS_NCCL_RING_SIZE="65536", DRIVER_GROUP="12")
    expected, recorded, no_slot = int(out["expected"]), int(out["recorded"]), int(out["dropped_slots"])
    assert no_slot > 0 and recorded + no_slot == expected and out["dropped_ring"] == "0"
    assert int(out["max_call_ns"]) < MAX_CALL_NS
    batches = sink.batches()
    records = [r for b in batches for r in to_records(b, "h1")[0]]
    assert len(records) == recorded == int(out["sent"])
    ids = [(r.pid, r.event_id) for _, r in records]
    assert len(set(ids)) == len(ids)
    # a parent handle whose slot was reused by then is recognised as stale, never linked wrongly
    tasks = {(r.pid, r.event_id): r for kind, r in records if kind == "nccl_collectives"}
    for kind, r in records:
        if kind == "nccl_proxy_ops" and r.parent_id is not None:
            assert (r.pid, r.parent_id) in tasks and tasks[(r.pid, r.parent_id)].rank == r.rank
