"""Points a server refused for good (a field type conflict, a point beyond retention, a line it
cannot parse), kept on disk with the reason instead of being dropped.

One JSON object per line in `quarantine.jsonl`: when it was quarantined, the server's reason and
the point's line protocol. The file is bounded: past max_bytes the oldest entries are dropped,
and that is logged and counted (never silent). `drain()` hands the points back for a replay (after the
operator fixed the cause, e.g. dropped a shard holding the wrong type) and removes them.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Quarantine:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.path = Path(directory) / "quarantine.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.added = 0  # points quarantined by this process
        self.dropped = 0  # quarantined points dropped to stay within max_bytes
        self.points = 0
        self.last_reason: str | None = None
        for entry in self._read():
            self.points += 1
            self.last_reason = entry["reason"]

    @property
    def bytes(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    # builtins.bytes: in the class body `bytes` is the property above
    def add(self, lines: list[builtins.bytes], reason: str) -> None:
        now = time.time_ns()
        data = "".join(json.dumps({"ts": now, "reason": reason, "line": line.decode()}, ensure_ascii=False) + "\n"
                       for line in lines).encode()
        with self._lock:
            with open(self.path, "ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self.added += len(lines)
            self.points += len(lines)
            self.last_reason = reason
            if self.bytes > self.max_bytes:
                self._trim()

    def _trim(self) -> None:
        entries = self._read()
        size, keep = 0, len(entries)
        while keep > 0:
            size += len(json.dumps(entries[keep - 1], ensure_ascii=False).encode()) + 1
            if size > self.max_bytes // 2:  # trim to half so that trimming is rare
                break
            keep -= 1
        dropped = len(entries) - keep
        self._rewrite(entries[dropped:])
        self.dropped += dropped
        log.error("quarantine over %d bytes: its %d oldest points were deleted", self.max_bytes, dropped)

    def _read(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        entries: list[dict[str, Any]] = []
        for line in text.split("\n"):  # not splitlines(): U+2028 and U+0085 stand unescaped in entries
            if not line:
                continue
            try:
                entries.append(json.loads(line))
            except ValueError:  # a torn last line after a crash
                log.warning("unreadable quarantine entry skipped: %.80r", line)
        return entries

    def _rewrite(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.path.with_name(self.path.name + ".new")
        tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries), encoding="utf-8")
        os.replace(tmp, self.path)
        self.points = len(entries)

    def entries(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest entries, newest first."""
        with self._lock:
            return self._read()[::-1][:limit]

    def drain(self, into: Callable[[list[builtins.bytes]], object]) -> int:
        """Hand every entry's line, oldest first, to `into(lines)`; remove them once it returned
        (an exception keeps them all). Returns the number of points handed over."""
        with self._lock:
            lines = [e["line"].encode() for e in self._read()]
            if lines:
                into(lines)
            self._rewrite([])
            self.last_reason = None
            return len(lines)
