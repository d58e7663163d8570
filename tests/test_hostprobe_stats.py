"""Window statistics, coded-pair purity, path ids, the lab clock (hostprobe/stats.py, trace.py, clock.py)."""

from __future__ import annotations

import json
import math
import os

import pytest

from hostprobe.config import LabClock
from hostprobe.host_clock import Clock
from hostprobe.stats import Exchange, judge_pair, percentile, summary, window_stats
from hostprobe.trace import int_to_ip, ip_to_int, path_id
from lab.faults import clock_error_ns
from nms.records import ProbeWindow

T0 = 1_800_000_000_000_000_000


def ex(t1, t2, t3, t4, second=False):
    e = Exchange(1, None, 0, 0.0, second)
    e.t1, e.t2, e.t3, e.t4 = t1, t2, t3, t4
    return e


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([7], 99) == 7
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99) == 10  # p99 of 10 samples is the largest
    assert percentile([1, 2, 3, 4], 50) == 2
    with pytest.raises(ValueError):
        percentile([], 50)
    assert summary([]) == (None, None, None)
    assert summary([5, 1, 3]) == (1, 3, 5)


def test_one_way_delays_and_rtt_with_a_clock_offset():
    offset = 10_000_000  # the responder's clock is 10 ms ahead
    a = ex(T0, T0 + 5_000 + offset, T0 + 9_000 + offset, T0 + 16_000)
    assert a.owd_fwd() == 5_000 + offset and a.owd_rev() == 7_000 - offset
    assert a.rtt() == 12_000  # offset-free: (t4 - t1) - (t3 - t2)
    lost = ex(T0, 0, 0, 0)
    assert lost.owd_fwd() is None and lost.owd_rev() is None and lost.rtt() is None and not lost.replied
    no_followup = ex(T0, T0 + 4_000, 0, T0 + 9_000)
    assert no_followup.owd_fwd() == 4_000 and no_followup.owd_rev() is None and no_followup.rtt() is None


def test_window_stats_counts_loss_and_summarises_each_direction():
    exchanges = [ex(T0 + i, T0 + i + 1000 * (i + 1), T0 + i + 1000 * (i + 1) + 100, T0 + i + 1000 * (i + 1) + 600)
                 for i in range(8)]
    exchanges += [ex(T0 + 50, 0, 0, 0), ex(T0 + 60, 0, 0, 0)]  # two lost
    stats = window_stats(exchanges)
    assert (stats["sent"], stats["received"]) == (10, 8)
    assert (stats["owd_fwd_min_ns"], stats["owd_fwd_p50_ns"], stats["owd_fwd_p99_ns"]) == (1000, 4000, 8000)
    assert (stats["owd_rev_min_ns"], stats["owd_rev_p50_ns"], stats["owd_rev_p99_ns"]) == (500, 500, 500)
    assert stats["rtt_min_ns"] == 1500 and stats["rtt_p99_ns"] == 8500
    w = ProbeWindow(src_host="a", src_nic="eth0", dst_host="b", dst_nic="eth0", path_id="p", window_start=T0,
                    **stats)
    assert math.isclose(w.loss, 0.2)
    empty = window_stats([])
    assert empty["sent"] == 0 and empty["owd_fwd_p50_ns"] is None


def test_pair_purity_compares_send_and_receive_spacing():
    guard = 5_000
    first = ex(T0, T0 + 10_000, T0 + 20_000, T0 + 31_000)
    same = ex(T0 + 8_000, T0 + 18_000, T0 + 28_000, T0 + 39_000, second=True)  # spacing kept both ways
    judge_pair(first, same, guard)
    assert (first.pure_fwd, first.pure_rev, same.pure_fwd, same.pure_rev) == (True, True, True, True)
    queued = ex(T0 + 8_000, T0 + 40_000, T0 + 50_000, T0 + 61_000, second=True)  # forward queueing +22 us
    judge_pair(first, queued, guard)
    assert (queued.pure_fwd, queued.pure_rev) == (False, True)
    late_reply = ex(T0 + 8_000, T0 + 18_000, T0 + 28_000, T0 + 60_000, second=True)
    judge_pair(first, late_reply, guard)
    assert (late_reply.pure_fwd, late_reply.pure_rev) == (True, False)  # t4 spacing 29 us vs t3 spacing 8 us
    half = ex(T0 + 8_000, T0 + 18_000, 0, T0 + 39_000, second=True)  # follow-up lost: reverse unknown
    judge_pair(first, half, guard)
    assert (half.pure_fwd, half.pure_rev) == (True, None)
    assert window_stats([first, half])["pure_pairs"] == 0 and window_stats([first, same])["pairs"] == 1
    judge_pair(first, same, guard)
    assert window_stats([first, same])["pure_pairs"] == 1


def test_path_id_is_stable_and_depends_on_every_hop():
    fwd, rev = ["198.19.1.0", "198.19.1.128", "198.19.2.129"], ["198.19.2.0", "198.19.2.128", "198.19.1.129"]
    pid = path_id("198.19.1.1", "198.19.2.1", fwd, rev)
    assert pid == path_id("198.19.1.1", "198.19.2.1", list(fwd), list(rev)) and len(pid) == 16
    assert pid != path_id("198.19.1.1", "198.19.2.1", fwd[:2] + ["198.19.2.131"], rev)
    assert pid != path_id("198.19.1.1", "198.19.2.1", fwd, rev[:2] + [None])
    assert pid != path_id("198.19.2.1", "198.19.1.1", fwd, rev)
    assert int_to_ip(ip_to_int("198.19.2.129")) == "198.19.2.129"


def test_lab_clock_matches_the_labs_ground_truth(tmp_path):
    clock = Clock(LabClock(offset_ns=2_500_000, drift_ppm=-30.0, ref_ns=T0))
    state = {"clocks": {"host1": {"offset_ns": 2_500_000, "drift_ppm": -30.0, "ref_ns": T0}}}
    for dt in (0, 10**9, 3600 * 10**9):
        assert clock.host(T0 + dt) - (T0 + dt) == clock_error_ns(state, "host1", T0 + dt)
    assert Clock(None).host(T0) == T0 and not Clock(None).emulated


def test_lab_clock_follows_the_state_file(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"clocks": {}}))
    clock = Clock(LabClock(state_file=path, host="host3"))
    assert clock.host(T0) == T0
    path.write_text(json.dumps({"clocks": {"host3": {"offset_ns": -7000, "drift_ppm": 12.5, "ref_ns": T0}}}))
    os.utime(path, ns=(T0, T0 + 1))  # a new mtime even within the file system's timestamp granularity
    assert clock.refresh() is True
    state = json.loads(path.read_text())
    assert clock.host(T0 + 10**9) - (T0 + 10**9) == clock_error_ns(state, "host3", T0 + 10**9)
    assert abs(clock.error_ns(T0 + 10**9) - 5_500) <= 1
    assert clock.refresh() is False  # unchanged file: nothing re-read
