"""Exchanges (4 timestamps each), coded-pair purity, and per-window statistics.

An exchange: the prober sends at t1 (its kernel TX stamp), the responder receives at t2 and
replies at t3 (its kernel stamps, its clock), the prober receives the reply at t4. In local clocks:
forward one-way delay t2 - t1, reverse t4 - t3 (both include the clock offset between the hosts),
RTT (t4 - t1) - (t3 - t2) (offset-free). A coded pair is two exchanges sent back to back: if
queueing touched neither, the responder sees them as far apart as they were sent (forward) and
the prober sees the replies as far apart as they were sent (reverse). A pair is pure when both
spacings match within the guard; only pure pairs feed clock estimation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class Exchange:
    __slots__ = ("seq", "path", "window", "sent_mono", "t1", "t2", "t3", "t4", "mate", "second",
                 "pure_fwd", "pure_rev", "epoch", "peer_epoch")

    def __init__(self, seq: int, path, window: int, sent_mono: float, second: bool, epoch: int = 0):
        self.seq, self.path, self.window, self.sent_mono, self.second = seq, path, window, sent_mono, second
        self.epoch = epoch  # our clock's epoch when sent (a step since then: not usable for clock sync)
        self.peer_epoch = 0  # the responder's, from its reply; -1 when its follow-up carried another
        self.t1 = self.t2 = self.t3 = self.t4 = 0  # 0 = not (yet) known
        self.mate: Exchange | None = None  # the other exchange of the coded pair
        self.pure_fwd: bool | None = None
        self.pure_rev: bool | None = None

    @property
    def replied(self) -> bool:
        return self.t4 != 0

    def owd_fwd(self) -> int | None:
        return self.t2 - self.t1 if self.t1 and self.t2 and self.t4 else None

    def owd_rev(self) -> int | None:
        return self.t4 - self.t3 if self.t3 and self.t4 else None

    def rtt(self) -> int | None:
        if self.t1 and self.t2 and self.t3 and self.t4:
            return (self.t4 - self.t1) - (self.t3 - self.t2)
        return None


def judge_pair(first: Exchange, second: Exchange, guard_ns: int) -> None:
    """Set both exchanges' purity flags (None where a stamp is missing)."""
    fwd = rev = None
    if first.t1 and second.t1 and first.t2 and second.t2 and first.t4 and second.t4:
        fwd = abs((second.t2 - first.t2) - (second.t1 - first.t1)) <= guard_ns
    if first.t3 and second.t3 and first.t4 and second.t4:
        rev = abs((second.t4 - first.t4) - (second.t3 - first.t3)) <= guard_ns
    first.pure_fwd = second.pure_fwd = fwd
    first.pure_rev = second.pure_rev = rev


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty sequence (p in 0..100)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summary(values: list[int]) -> tuple[int, int, int] | tuple[None, None, None]:
    """(min, p50, p99) or Nones."""
    if not values:
        return None, None, None
    values.sort()
    return values[0], percentile(values, 50), percentile(values, 99)


def window_stats(exchanges: list[Exchange]) -> dict:
    """The numbers of one (peer, path) window, as ProbeWindow fields."""
    fwd, rev, rtt = [], [], []
    received = pairs = pure = 0
    for ex in exchanges:
        if ex.t4:
            received += 1
        if (v := ex.owd_fwd()) is not None:
            fwd.append(v)
        if (v := ex.owd_rev()) is not None:
            rev.append(v)
        if (v := ex.rtt()) is not None and v >= 0:
            rtt.append(v)
        if ex.second:
            pairs += 1
            if ex.pure_fwd and ex.pure_rev:
                pure += 1
    out = {"sent": len(exchanges), "received": received, "pairs": pairs, "pure_pairs": pure}
    for name, values in (("owd_fwd", fwd), ("owd_rev", rev), ("rtt", rtt)):
        lo, mid, hi = summary(values)
        out[f"{name}_min_ns"], out[f"{name}_p50_ns"], out[f"{name}_p99_ns"] = lo, mid, hi
    return out
