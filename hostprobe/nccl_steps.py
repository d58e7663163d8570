"""Proxy steps folded at the host: NCCL's most frequent event (tens of thousands per second per rank
on a training job) becomes one NcclStepStats record per second per (job, comm, rank, peer, channel,
direction, connection): the number of steps, their bytes, the step duration's and each wait state's
p50 / p99 / max.

A step belongs to the second its stop falls in (the plugin ships it at stop). A second is sent once
the agent's clock (the same CLOCK_REALTIME the plugin stamps with) is `grace_s` past its end; a step
that comes later than that is counted in the oldest second still open (`late`), never sent twice.
Raw steps are for debugging only: `raw_per_s` of them a second are handed on as they came.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from nms.records import NcclStepStats

SECOND = 1_000_000_000
# the decoder's names of the states (ns after the step's start when it entered each; absent: not seen)
STATES = ("send_gpu_wait", "send_peer_wait", "send_wait", "recv_wait", "recv_flush_wait", "recv_gpu_wait")
MAX_OPEN = 200_000  # (key, second) cells held; beyond, the oldest seconds are sent early


def dwell_times(event: dict[str, Any]) -> dict[str, int]:
    """How long the step stayed in each state it entered: until the next state it entered, the last
    one until its stop."""
    entered = sorted((event[f"{s}_ns"], s) for s in STATES if event.get(f"{s}_ns") is not None)
    duration = event["stop_ns"] - event["start_ns"]
    out = {}
    for i, (at, state) in enumerate(entered):
        until = entered[i + 1][0] if i + 1 < len(entered) else duration
        out[state] = max(until - at, 0)
    return out


def percentile(sorted_values: list[int], pct: int) -> int:
    """Nearest-rank percentile of a sorted, non-empty list: the smallest value with at least pct % of
    the values at or below it."""
    return sorted_values[max(0, (pct * len(sorted_values) + 99) // 100 - 1)]


@dataclass
class _Cell:
    pid: int
    net: str | None = None
    net_device: int | None = None
    steps: int = 0
    bytes: int = 0
    net_bytes: int = 0
    net_events: int = 0
    durations: list[int] = field(default_factory=list)
    states: dict[str, list[int]] = field(default_factory=dict)


class StepFolder:
    """`add(pid, job_id, host, event)` for each decoded proxy step; `due(now_ns)` returns the records
    of the seconds that closed (and the errors of any that failed validation); `drain()` all of them."""

    def __init__(self, host: str, grace_s: float = 1.0):
        self.host, self.grace_ns = host, int(grace_s * SECOND)
        self.cells: dict[tuple, _Cell] = {}
        self.watermark = 0  # seconds before this were sent
        self.late = 0

    def add(self, pid: int, job_id: str | None, event: dict[str, Any]) -> None:
        second = event["stop_ns"] // SECOND * SECOND
        if second < self.watermark:
            second, self.late = self.watermark, self.late + 1
        direction = None if event.get("is_send") is None else ("send" if event["is_send"] else "recv")
        key = (second, job_id, event["comm_id"], event["rank"], event.get("peer"), event.get("channel"), direction,
               event.get("connection"), pid)
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = _Cell(pid)
        cell.steps += 1
        cell.bytes += event["trans_size"]
        cell.net_bytes += event["net_bytes"]
        cell.net_events += event["net_events"]
        if event.get("net") is not None:
            cell.net, cell.net_device = event["net"], event.get("net_device")
        cell.durations.append(event["stop_ns"] - event["start_ns"])
        for state, ns in dwell_times(event).items():
            cell.states.setdefault(state, []).append(ns)

    def due(self, now_ns: int) -> tuple[list[NcclStepStats], list[str]]:
        """The seconds that ended more than grace_s before now_ns (the oldest beyond MAX_OPEN too)."""
        closed_before = (now_ns - self.grace_ns) // SECOND * SECOND
        if len(self.cells) > MAX_OPEN:
            closed_before = max(closed_before, sorted(k[0] for k in self.cells)[len(self.cells) - MAX_OPEN] + SECOND)
        self.watermark = max(self.watermark, closed_before)
        return self._emit([k for k in self.cells if k[0] < self.watermark])

    def drain(self) -> tuple[list[NcclStepStats], list[str]]:
        return self._emit(list(self.cells))

    def _emit(self, keys: list[tuple]) -> tuple[list[NcclStepStats], list[str]]:
        records, errors = [], []
        for key in sorted(keys, key=lambda k: k[0]):
            cell = self.cells.pop(key)
            second, job_id, comm_id, rank, peer, channel, direction, connection, _ = key
            durations = sorted(cell.durations)
            data: dict[str, Any] = {
                "host": self.host, "job_id": job_id, "comm_id": comm_id, "rank": str(rank),
                "peer": None if peer is None else str(peer), "channel": None if channel is None else str(channel),
                "direction": direction, "connection": None if connection is None else str(connection),
                "start_ns": second, "stop_ns": second + SECOND, "pid": cell.pid, "net": cell.net,
                "net_device": cell.net_device, "steps": cell.steps, "bytes": cell.bytes,
                "net_bytes": cell.net_bytes, "net_events": cell.net_events,
                "step_p50_ns": percentile(durations, 50), "step_p99_ns": percentile(durations, 99),
                "step_max_ns": durations[-1]}
            for state, values in cell.states.items():
                values.sort()
                data.update({f"{state}_p50_ns": percentile(values, 50), f"{state}_p99_ns": percentile(values, 99),
                             f"{state}_max_ns": values[-1]})
            try:
                records.append(NcclStepStats.model_validate({k: v for k, v in data.items() if v is not None}))
            except ValidationError as e:
                problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
                errors.append(f"step stats of rank {rank} (pid {cell.pid}, {cell.steps} steps): {problems}")
        return records, errors


class RawStepLimit:
    """At most `per_s` raw steps a second (by the agent's clock) are let through; 0: none."""

    def __init__(self, per_s: int):
        self.per_s, self.second, self.used, self.refused = per_s, -1, 0, 0

    def take(self, n: int, now_ns: int) -> int:
        """How many of n steps may go raw now (with raw steps off, none, and none counted as refused)."""
        if self.per_s == 0:
            return 0
        second = now_ns // SECOND
        if second != self.second:
            self.second, self.used = second, 0
        allowed = max(0, min(n, self.per_s - self.used))
        self.used += allowed
        self.refused += n - allowed
        return allowed
