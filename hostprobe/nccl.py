"""The NCCL plugin's listener in the host agent: a Unix datagram socket the plugins of this host's
jobs send their batches to (nccl_plugin/src/shipper.c), decoded (nccl_plugin.decode) into records
handed to the reporter, which ships them like every other record of the agent (hostprobe/report.py,
the agent's host-bound token).

The socket is the agent's own file (a stale one left by a crashed agent is replaced; a live one of
another agent is not); its mode lets the jobs' users write to it. A batch that is not readable is
counted and dropped, a bad record in a good batch is counted and the rest is kept. The plugins'
own drop counters (ring full, no slot, agent absent or slow) arrive in every batch header and are
summed over the processes seen into `nccl_plugin_dropped`.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from nccl_plugin.decode import WireError, decode_batch, to_records

log = logging.getLogger(__name__)

MAX_DATAGRAM = 1 << 17  # the plugin sends at most 128 records (16.5 KiB); room for a newer, larger format
MAX_PROCESSES = 4096  # plugin processes whose drop counters are remembered


class NcclIntake:
    """Datagrams -> records handed to `put(ingest kind, record)`, with the counters in `stats`."""

    def __init__(self, host: str, put: Callable[[str, object], None], stats: dict):
        self.host, self.put, self.stats = host, put, stats
        for key in ("nccl_batches", "nccl_bad_batches", "nccl_records", "nccl_bad_records", "nccl_plugin_dropped"):
            stats.setdefault(key, 0)
        self._drops: OrderedDict[int, int] = OrderedDict()  # pid -> its plugin's cumulative drops

    def handle(self, data: bytes) -> int:
        """Decodes one datagram and hands its records on; returns how many."""
        self.stats["nccl_batches"] += 1
        try:
            batch = decode_batch(data)
        except WireError as e:
            self.stats["nccl_bad_batches"] += 1
            log.warning("NCCL plugin batch dropped: %s", e)
            return 0
        records, errors = to_records(batch, self.host)
        for kind, record in records:
            self.put(kind, record)
        self.stats["nccl_records"] += len(records)
        if errors:
            self.stats["nccl_bad_records"] += len(errors)
            log.warning("NCCL plugin (pid %d): %d bad record(s), first: %s", batch.pid, len(errors), errors[0])
        self._drops[batch.pid] = batch.dropped
        self._drops.move_to_end(batch.pid)
        while len(self._drops) > MAX_PROCESSES:
            self._drops.popitem(last=False)
        self.stats["nccl_plugin_dropped"] = sum(self._drops.values())
        return len(records)


class NcclListener(threading.Thread):
    """The socket and the thread reading it into an NcclIntake."""

    def __init__(self, path: Path, mode: int, host: str, put: Callable[[str, object], None], stats: dict):
        super().__init__(name="nccl-listener", daemon=True)
        self.path = Path(path)
        self.intake = NcclIntake(host, put, stats)
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
        while not self._halt.is_set():
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                if self._halt.is_set():
                    return
                raise
            try:
                self.intake.handle(data)
            except Exception:  # a bug here must not silence the listener for good
                log.exception("NCCL batch handling failed")

    def stop(self, timeout: float = 2.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        self.sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
