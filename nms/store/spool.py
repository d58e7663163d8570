"""A bounded, ordered on-disk spool of encoded write batches.

Each batch is one segment file `<seq>-<points>.lp` in the spool directory, written to a
temporary name, fsynced and renamed, so a crash leaves either the whole segment or none.
Segments are read back oldest first (FIFO) and deleted only when the caller says the batch
was delivered. Existing segments are picked up again after a restart. A lock file keeps two
processes (or two stores) from replaying the same spool.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from nms.store.base import StoreError, StoreUnavailable

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^(\d{20})-(\d+)\.lp$")
# Files the InfluxDB backend keeps beside the segments (besides quarantine.*: nms/store/quarantine.py).
LEDGER_FILE = "write_ledger.json"  # the InfluxDB store's (nms/store/influx.py)
_NEIGHBOURS = {".lock", "capabilities.json", LEDGER_FILE}


class SpoolFull(StoreUnavailable):
    """The batch does not fit in the spool's byte budget; nothing of it was stored."""


@dataclass(frozen=True, slots=True)
class Segment:
    seq: int
    points: int
    size: int
    path: Path

    def read(self) -> bytes:
        return self.path.read_bytes()


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.directory / ".lock", "a+b")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise StoreError(f"spool directory {self.directory} is in use by another store") from None
        self._segments: deque[Segment] = deque()
        self._bytes = 0
        self._points = 0
        self._next_seq = 1
        self._load()

    def _load(self) -> None:
        found = []
        for path in self.directory.iterdir():
            if path.name.endswith(".tmp"):  # an interrupted push: never acknowledged to anyone
                path.unlink(missing_ok=True)
            elif m := _SEGMENT.match(path.name):
                found.append(Segment(int(m.group(1)), int(m.group(2)), path.stat().st_size, path))
            elif path.name not in _NEIGHBOURS and not path.name.startswith("quarantine."):
                log.warning("spool %s: ignoring unexpected file %s", self.directory, path.name)
        for seg in sorted(found, key=lambda s: s.seq):
            self._append(seg)
        if found:
            self._next_seq = self._segments[-1].seq + 1
            log.info("spool %s: %d segments (%d bytes) left from a previous run",
                     self.directory, len(found), self._bytes)

    def _append(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._bytes += seg.size
        self._points += seg.points

    def push(self, data: bytes, points: int) -> None:
        """Append a batch at the tail; raises SpoolFull when it does not fit."""
        with self._lock:
            if self._bytes + len(data) > self.max_bytes:
                raise SpoolFull(f"spool full: {self._bytes} of {self.max_bytes} bytes used, "
                                f"a batch of {len(data)} bytes does not fit")
            seq = self._next_seq
            final = self.directory / f"{seq:020d}-{points}.lp"
            tmp = self.directory / f"{seq:020d}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
            self._fsync_dir()
            self._next_seq += 1
            self._append(Segment(seq, points, len(data), final))

    def peek(self) -> Segment | None:
        """The oldest segment, or None when the spool is empty."""
        with self._lock:
            return self._segments[0] if self._segments else None

    def head(self, max_points: int, max_bytes: int) -> list[Segment]:
        """The oldest segments that together stay within both limits (at least one if any)."""
        out: list[Segment] = []
        points = size = 0
        with self._lock:
            for seg in self._segments:
                if out and (points + seg.points > max_points or size + seg.size > max_bytes):
                    break
                out.append(seg)
                points += seg.points
                size += seg.size
        return out

    def pop(self, seg: Segment) -> None:
        """Delete a delivered segment (must be the oldest)."""
        with self._lock:
            if not self._segments or self._segments[0].seq != seg.seq:
                raise ValueError(f"segment {seg.seq} is not the oldest one")
            self._segments.popleft()
            self._bytes -= seg.size
            self._points -= seg.points
            seg.path.unlink(missing_ok=True)

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def points(self) -> int:
        return self._points

    def __len__(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        """Release the directory lock; segments stay on disk."""
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
