"""Collective bandwidth and the slowdown detector: a collective's bus bandwidth against its own baseline.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = S / t (S the op's buffer size in
bytes as nccl-tests counts it, t the time), and busbw = algbw x a factor that makes the number
comparable with the hardware's link speed whatever the rank count n:
  AllReduce 2(n-1)/n; ReduceScatter and AllGather (n-1)/n; Broadcast, Reduce, Send/Recv 1;
  AllToAll (n-1)/n (nccl-tests' alltoall.cu).
For AllGather and ReduceScatter S is the total (gathered) size: NCCL's count is per rank, so the
record's bytes are multiplied by n here (nccl-tests reports its size column the same way).

The detector keeps, per (job, communicator, op, message-size bucket), a trailing window of the
bus bandwidths of good collectives. A collective is slow when its busbw is below `ratio` x the
window's median, once the window holds `min_samples`; a slowdown starts after `k` slow ones in a
row and clears after `k` good ones in a row. Slow collectives never enter the baseline, so a
lasting slowdown does not become the new normal.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from nms.records import JobSlowdown, NcclCollectivePerf

BUS_FACTOR = {  # op -> (n -> factor)
    "AllReduce": lambda n: 2 * (n - 1) / n,
    "ReduceScatter": lambda n: (n - 1) / n,
    "AllGather": lambda n: (n - 1) / n,
    "AllToAll": lambda n: (n - 1) / n,
    "Broadcast": lambda n: 1.0,
    "Reduce": lambda n: 1.0,
    "Send": lambda n: 1.0,
    "Recv": lambda n: 1.0,
}
PER_RANK_COUNT = {"AllGather", "ReduceScatter"}  # NCCL's count is the per-rank share


def op_bytes(op: str, bytes_per_rank: int, nranks: int) -> int:
    """The size S nccl-tests divides by the time."""
    return bytes_per_rank * nranks if op in PER_RANK_COUNT else bytes_per_rank


def bandwidths(op: str, size_bytes: int, nranks: int, duration_ns: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes/s, as nccl-tests prints them); size_bytes is S (op_bytes)."""
    if duration_ns <= 0:
        raise ValueError("duration must be positive")
    algbw = size_bytes / duration_ns  # bytes per ns = GB/s
    factor = BUS_FACTOR.get(op, lambda n: 1.0)(nranks)
    return algbw, algbw * factor


def size_bucket(size_bytes: int) -> str:
    """The power of two at or below the size, as text: 0B, 1B, ..., 512B, 1KiB, ..., 1GiB, ..."""
    if size_bytes <= 0:
        return "0B"
    exp = size_bytes.bit_length() - 1
    unit, shift = next((u, s) for u, s in (("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0)) if exp >= s)
    return f"{1 << (exp - shift)}{unit}"


@dataclass(frozen=True)
class DetectorConfig:
    window: int = 64  # good collectives in the baseline
    min_samples: int = 8  # no verdict before this many
    ratio: float = 0.7  # slow: busbw < ratio x baseline
    k: int = 3  # consecutive slow collectives to start a slowdown, good ones to clear it

    def __post_init__(self):
        if not (0 < self.ratio < 1 and self.k >= 1 and 1 <= self.min_samples <= self.window):
            raise ValueError("detector needs 0 < ratio < 1, k >= 1, 1 <= min_samples <= window")


@dataclass
class _Series:
    good: deque = field(default_factory=deque)
    slow_run: list = field(default_factory=list)  # (seq, busbw, start_ns) of consecutive slow ones
    good_run: int = 0
    active: JobSlowdown | None = None


Key = tuple[str, str, str, str]  # job, comm, op, size bucket


class SlowdownDetector:
    """Feed collectives in time order per key (`observe`); `active()` are the current slowdowns,
    `history` the cleared ones (newest last, bounded)."""

    def __init__(self, config: DetectorConfig = DetectorConfig(), history: int = 256):
        self.config = config
        self._series: dict[Key, _Series] = {}
        self.history: deque[JobSlowdown] = deque(maxlen=history)

    def observe(self, c: NcclCollectivePerf) -> tuple[NcclCollectivePerf, str | None]:
        """The collective with baseline and `slow` filled in, and 'started' / 'cleared' / None."""
        cfg = self.config
        s = self._series.setdefault((c.job_id, c.comm_id, c.op, c.size_bucket), _Series(good=deque(maxlen=cfg.window)))
        baseline = statistics.median(s.good) if len(s.good) >= cfg.min_samples else None
        slow = baseline is not None and c.busbw_gbps < cfg.ratio * baseline
        change = None
        if slow:
            s.good_run = 0
            s.slow_run = (s.slow_run + [(c.seq, c.busbw_gbps, c.start_ns)])[-32:]
            if s.active is None and len(s.slow_run) >= cfg.k:
                s.active, change = self._slowdown(c, s, baseline), "started"
            elif s.active is not None:
                s.active = self._slowdown(c, s, s.active.baseline_busbw_gbps, since=s.active.since_ns)
        else:
            s.good.append(c.busbw_gbps)
            s.good_run += 1
            if s.active is not None and s.good_run >= cfg.k:
                self.history.append(s.active.model_copy(update={"cleared_ns": c.start_ns}))
                s.active, change = None, "cleared"
            if s.active is None:
                s.slow_run = []
        return c.model_copy(update={"baseline_busbw_gbps": baseline, "slow": slow}), change

    @staticmethod
    def _slowdown(c: NcclCollectivePerf, s: _Series, baseline: float, since: int | None = None) -> JobSlowdown:
        bws = [bw for _, bw, _ in s.slow_run]
        median = statistics.median(bws)
        return JobSlowdown(job_id=c.job_id, comm_id=c.comm_id, op=c.op, size_bucket=c.size_bucket,
                           since_ns=since if since is not None else s.slow_run[0][2],
                           baseline_busbw_gbps=baseline, busbw_gbps=median,
                           ratio=median / baseline if baseline else 0.0,
                           slow_collectives=[seq for seq, _, _ in s.slow_run])

    def active(self, job_id: str | None = None) -> list[JobSlowdown]:
        return [s.active for s in self._series.values()
                if s.active is not None and (job_id is None or s.active.job_id == job_id)]

    def forget_job(self, job_id: str) -> None:
        for key in [k for k in self._series if k[0] == job_id]:
            del self._series[key]
