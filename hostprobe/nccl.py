"""The NCCL plugin's listener in the host agent: a Unix datagram socket the plugins of this host's
jobs send their batches to (nccl_plugin/src/shipper.c), decoded (nccl_plugin.decode) into records
handed to the reporter, which ships them like every other record of the agent (hostprobe/report.py,
the agent's host-bound token).

The socket is the agent's own file (a stale one left by a crashed agent is replaced; a live one of
another agent is not); its mode lets the jobs' users write to it. A batch that is not readable is
counted and dropped, a bad record in a good batch is counted and the rest is kept. The plugins'
own drop counters (ring full, no slot, agent absent or slow) arrive in every batch header and are
summed over the processes seen into `nccl_plugin_dropped`.

Proxy steps are not handed on one by one: they are folded into one record per second per
connection (hostprobe/nccl_steps.py, `tick`); `raw_steps_per_s` > 0 lets that many a second through
as they came too (debugging).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from hostprobe.nccl_steps import RawStepLimit, StepFolder
from hostprobe.rdma_qps import QpReporter, RdmaOutputError
from nccl_plugin.decode import WireError, decode_batch, to_records

log = logging.getLogger(__name__)

MAX_DATAGRAM = 1 << 17  # the plugin sends at most 128 records (16.5 KiB); room for a newer, larger format
MAX_PROCESSES = 4096  # plugin processes whose drop counters are remembered


class NcclIntake:
    """Datagrams -> records handed to `put(ingest kind, record)`, with the counters in `stats`."""

    def __init__(self, host: str, put: Callable[[str, object], None], stats: dict, raw_steps_per_s: int = 0,
                 step_grace_s: float = 1.0):
        self.host, self.put, self.stats = host, put, stats
        for key in ("nccl_batches", "nccl_bad_batches", "nccl_records", "nccl_bad_records", "nccl_plugin_dropped",
                    "nccl_steps", "nccl_step_stats", "nccl_steps_late", "nccl_raw_steps", "nccl_raw_steps_refused"):
            stats.setdefault(key, 0)
        self._drops: OrderedDict[int, int] = OrderedDict()  # pid -> its plugin's cumulative drops
        self.steps = StepFolder(host, step_grace_s)
        self.raw = RawStepLimit(raw_steps_per_s)
        # pid -> (job id, {(comm_id, rank)}): whose QPs the host's RDMA netlink is asked for
        self.processes: OrderedDict[int, tuple[str | None, set[tuple[str, int]]]] = OrderedDict()

    def handle(self, data: bytes, now_ns: int | None = None) -> int:
        """Decodes one datagram, hands its records on (its proxy steps to the folder); returns how many
        records it handed on now."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        self.stats["nccl_batches"] += 1
        try:
            batch = decode_batch(data)
        except WireError as e:
            self.stats["nccl_bad_batches"] += 1
            log.warning("NCCL plugin batch dropped: %s", e)
            return 0
        _, ranks = self.processes.setdefault(batch.pid, (batch.job_id, set()))
        if len(ranks) < 256:
            ranks.update((e["comm_id"], e["rank"]) for e in batch.events if e["comm_id"] != "0" * 16)
        self.processes.move_to_end(batch.pid)
        while len(self.processes) > MAX_PROCESSES:
            self.processes.popitem(last=False)
        steps = [e for e in batch.events if e["kind"] == "proxy_step"]
        if steps:
            for event in steps:
                self.steps.add(batch.pid, batch.job_id, event)
            self.stats["nccl_steps"] += len(steps)
            self.stats["nccl_steps_late"] = self.steps.late
            raw = self.raw.take(len(steps), now_ns)
            self.stats["nccl_raw_steps"] += raw
            self.stats["nccl_raw_steps_refused"] = self.raw.refused
            keep = {id(e) for e in steps[:raw]}
            batch.events = [e for e in batch.events if e["kind"] != "proxy_step" or id(e) in keep]
        records, errors = to_records(batch, self.host)
        self._hand_on(records, errors, f"pid {batch.pid}")
        self._drops[batch.pid] = batch.dropped
        self._drops.move_to_end(batch.pid)
        while len(self._drops) > MAX_PROCESSES:
            self._drops.popitem(last=False)
        self.stats["nccl_plugin_dropped"] = sum(self._drops.values())
        return len(records)

    def tick(self, now_ns: int | None = None, final: bool = False) -> int:
        """Hands on the step records of the seconds that closed (all of them when final); how many."""
        stats, errors = self.steps.drain() if final else self.steps.due(time.time_ns() if now_ns is None else now_ns)
        self._hand_on([("nccl_step_stats", r) for r in stats], errors, "step folding")
        self.stats["nccl_step_stats"] += len(stats)
        return len(stats)

    def report_qps(self, qps: QpReporter, now: float) -> int:
        """The NCCL processes' RDMA QPs (hostprobe/rdma_qps.py) handed on as nccl_rdma_qps records."""
        try:
            records = qps.read(dict(self.processes), now, time.time_ns())
        except RdmaOutputError as e:
            self.stats["nccl_bad_records"] += 1
            log.warning("RDMA QP list not read: %s", e)
            return 0
        if qps.unavailable and not self.stats.get("rdma_unavailable"):
            self.stats["rdma_unavailable"] = 1
            log.info("no RDMA QPs read on this host: %s", qps.unavailable)
        self._hand_on([("nccl_rdma_qps", r) for r in records], [], "rdma")
        return len(records)

    def _hand_on(self, records: list, errors: list[str], source: str) -> None:
        for kind, record in records:
            self.put(kind, record)
        self.stats["nccl_records"] += len(records)
        if errors:
            self.stats["nccl_bad_records"] += len(errors)
            log.warning("NCCL plugin (%s): %d bad record(s), first: %s", source, len(errors), errors[0])


class NcclListener(threading.Thread):
    """The socket and the thread reading it into an NcclIntake."""

    def __init__(self, path: Path, mode: int, host: str, put: Callable[[str, object], None], stats: dict,
                 raw_steps_per_s: int = 0, qps: QpReporter | None = None):
        super().__init__(name="nccl-listener", daemon=True)
        self.path = Path(path)
        self.intake = NcclIntake(host, put, stats, raw_steps_per_s)
        self.qps = qps
        self._halt = threading.Event()
        self.sock = self._bind(mode)

    def _bind(self, mode: int) -> socket.socket:
        if len(os.fsencode(self.path)) >= 108:
            raise OSError(f"NCCL socket path {self.path} is too long for a Unix socket (107 bytes at most)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise OSError(f"{self.path} exists and is not a socket: not replacing it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                probe.connect(str(self.path))
                raise OSError(f"{self.path} is in use by another process (another agent?)")
            except ConnectionRefusedError:
                self.path.unlink()  # left behind by an agent that is gone
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, mode)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.settimeout(0.2)
        except OSError:
            sock.close()
            raise
        return sock

    def run(self) -> None:
        last_tick = time.monotonic()
        while not self._halt.is_set():
            if time.monotonic() - last_tick >= 0.2:
                last_tick = time.monotonic()
                self._guarded(self.intake.tick)
                if self.qps is not None and self.qps.due(last_tick):
                    self._guarded(self.intake.report_qps, self.qps, last_tick)
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                if self._halt.is_set():
                    return
                raise
            self._guarded(self.intake.handle, data)

    def _guarded(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:  # a bug here must not silence the listener for good
            log.exception("NCCL batch handling failed")

    def stop(self, timeout: float = 2.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        self.sock.close()
        if not self.is_alive():  # the seconds still open go out with the agent's last flush
            self._guarded(self.intake.tick, None, True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
