"""The agent's folding of proxy steps (hostprobe/nccl_steps.py, through hostprobe/nccl.py's intake)
on datagrams built from the documented wire format: one record per second per connection, the
quantiles of the wait states, late steps, and raw steps only within their rate limit."""

from __future__ import annotations

import struct

import pytest

from hostprobe.nccl import NcclIntake
from hostprobe.nccl_steps import RawStepLimit, StepFolder, dwell_times, percentile
from nccl_plugin.decode import COMMON
from tests.test_nccl_decode import header

S = 10**9
T = 1_800_000_000 * S  # a second boundary


def step(event_id: int, stop: int, duration: int = 10_000, peer: int = 1, channel: int = 0, qp: int = 0x1234,
         send: bool = True, states: tuple[int, ...] = (1000, 0, 4000, 0, 0, 0), size: int = 65536,
         rank: int = 0) -> bytes:
    """A proxy step record (kind 4, parent known) as wire.h lays it out; states: ns after start."""
    common = COMMON.pack(4, 1, 0, rank, 0xC0FFEE, event_id, 7, stop - duration, stop)
    body = struct.pack("<iiBBBBIQiiQ6I", 0, peer, channel, int(send), 1 if qp else 0, 0, 1, size, qp, 2, size,
                       *states)
    return common + body + bytes(80 - len(body))


def batch(*records: bytes) -> bytes:
    return header(len(records)) + b"".join(records)


def collect(**kw):
    got: list = []
    stats: dict = {}
    return NcclIntake("h1", lambda kind, record: got.append((kind, record)), stats, **kw), got, stats


def test_dwell_time_runs_to_the_next_state_entered_or_the_stop():
    event = {"start_ns": 100, "stop_ns": 1100, "send_gpu_wait_ns": 10, "send_wait_ns": 400}
    assert dwell_times(event) == {"send_gpu_wait": 390, "send_wait": 600}
    assert dwell_times({"start_ns": 0, "stop_ns": 50}) == {}


def test_nearest_rank_percentiles():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([7], 50) == percentile([7], 99) == 7
    assert percentile([1, 2, 3], 50) == 2 and percentile([1, 2, 3, 4], 50) == 2


def test_steps_fold_into_one_record_per_second_per_connection():
    intake, got, stats = collect()
    # second T: 100 steps on channel 0 / QP 0x1234, send_wait lasting 1..100 us; 1 on channel 1; second T+1: 2
    records = [step(i, T + 1000 * i, duration=5000 + 1000 * i, states=(1000, 0, 5000, 0, 0, 0)) for i in range(1, 101)]
    records.append(step(500, T + 5 * 10**8, channel=1, qp=0x1235, send=False, states=(0, 0, 0, 2000, 6000, 0)))
    records += [step(600 + i, T + S + 10 + i) for i in range(2)]
    assert intake.handle(batch(*records[:60]), now_ns=T + S // 2) == 0  # no step is handed on by itself
    intake.handle(batch(*records[60:]), now_ns=T + S // 2)
    assert intake.tick(T + S + S // 2) == 0 and got == []  # second T is within its grace
    assert intake.tick(T + 2 * S) == 2
    by_channel = {r.channel: r for _, r in got}
    assert {k for k, _ in got} == {"nccl_step_stats"}
    a, b = by_channel["0"], by_channel["1"]
    assert (a.start_ns, a.stop_ns, a.rank, a.peer, a.direction, a.connection, a.net, a.net_device) == (
        T, T + S, "0", "1", "send", str(0x1234), "ib", 2)
    assert (a.steps, a.bytes, a.net_bytes, a.net_events, a.pid, a.job_id) == (100, 100 * 65536, 100 * 65536, 100,
                                                                                4242, "job-1")
    # send_gpu_wait from 1 us to 5 us after start: 4 us each; send_wait from 5 us to the stop: i us
    assert (a.send_gpu_wait_p50_ns, a.send_gpu_wait_max_ns) == (4000, 4000)
    assert (a.send_wait_p50_ns, a.send_wait_p99_ns, a.send_wait_max_ns) == (50_000, 99_000, 100_000)
    assert (a.step_p50_ns, a.step_max_ns) == (55_000, 105_000) and a.recv_wait_p50_ns is None
    assert (b.direction, b.steps, b.recv_wait_p50_ns, b.recv_flush_wait_p50_ns, b.send_wait_p50_ns) == (
        "recv", 1, 4000, 4000, None)
    intake.tick(final=True)
    assert [(r.start_ns, r.steps) for _, r in got[2:]] == [(T + S, 2)]
    assert stats["nccl_steps"] == 103 and stats["nccl_step_stats"] == 3 and stats["nccl_records"] == 3


def test_a_step_after_its_second_was_sent_counts_in_the_next_open_one():
    intake, got, stats = collect()
    intake.handle(batch(step(1, T + 10)), now_ns=T + 10)
    intake.tick(T + 2 * S + 1)  # second T sent
    intake.handle(batch(step(2, T + 20)), now_ns=T + 2 * S + 2)  # a straggler of second T
    intake.tick(final=True)
    assert [(r.start_ns, r.steps) for _, r in got] == [(T, 1), (T + S, 1)]  # never a second point at T
    assert stats["nccl_steps_late"] == 1


def test_raw_steps_only_when_asked_and_within_their_rate():
    intake, got, stats = collect(raw_steps_per_s=3)
    assert intake.handle(batch(*[step(i, T + i) for i in range(5)]), now_ns=T + 100) == 3
    assert intake.handle(batch(*[step(10 + i, T + i) for i in range(5)]), now_ns=T + 200) == 0  # this second's 3 used
    assert intake.handle(batch(step(20, T + S)), now_ns=T + S + 1) == 1  # a new second
    intake.tick(final=True)
    raw = [r for kind, r in got if kind == "nccl_proxy_steps"]
    assert [r.event_id for r in raw] == [0, 1, 2, 20]
    assert sum(r.steps for kind, r in got if kind == "nccl_step_stats") == 11  # every step is still counted
    assert (stats["nccl_raw_steps"], stats["nccl_raw_steps_refused"]) == (4, 7)
    assert RawStepLimit(0).take(5, T) == 0


def test_a_step_without_a_known_op_has_no_peer_and_still_counts():
    folder = StepFolder("h1")
    folder.add(9, None, {"comm_id": "00000000000000aa", "rank": 3, "start_ns": T, "stop_ns": T + 5, "trans_size": 8,
                         "net_bytes": 0, "net_events": 0, "net": None})
    [r], errors = folder.drain()
    assert errors == [] and (r.peer, r.channel, r.direction, r.connection, r.job_id, r.steps) == (
        None, None, None, None, None, 1)


def test_the_stats_record_refuses_an_empty_window():
    from nms.records import NcclStepStats

    with pytest.raises(ValueError, match="stop_ns"):
        NcclStepStats(host="h", comm_id="a", rank="0", start_ns=T, stop_ns=T, pid=1, steps=1, bytes=0, net_bytes=0,
                      net_events=0, step_p50_ns=0, step_p99_ns=0, step_max_ns=0)
