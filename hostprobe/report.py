"""Reports to the service: batched, gzip-compressed, kept on disk while the service is away.

Records queue in memory per kind; every `interval` (at once for path events) each kind's queue
becomes one gzip JSON batch for `POST /ingest/<kind>`. A batch that cannot be delivered (no
connection, 5xx, 401/403) goes to a bounded on-disk spool (nms.store.spool: fsynced segments,
replayed oldest first, deleted only after a 2xx), and while the spool holds anything new batches
queue behind it, so nothing is reordered or lost across service restarts. When the spool is full
the oldest batches are dropped and counted. Batches the service refuses as invalid (400/413/422)
are dropped and counted: retrying them would never succeed.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

from nms.store.spool import Spool, SpoolFull

log = logging.getLogger(__name__)

MAX_BATCH = 5000
URGENT = {"path_events"}


class Reporter(threading.Thread):
    def __init__(self, client, buffer_dir: Path, max_bytes: int, interval: float, stats: dict):
        super().__init__(name="reporter", daemon=True)
        self.client, self.interval, self.stats = client, interval, stats
        self.spool = Spool(Path(buffer_dir) / "spool", max_bytes)
        self._queues: dict[str, list[dict]] = defaultdict(list)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._last_error = 0.0
        self._healthy = True  # the last delivery attempt worked
        self.delivered = 0

    def put(self, kind: str, record) -> None:
        item = record.model_dump(mode="json", exclude_none=True) if hasattr(record, "model_dump") else record
        with self._lock:
            self._queues[kind].append(item)
        if kind in URGENT:
            self._wake.set()

    def wake(self) -> None:
        """Flush now (the prober closed windows: the correlator is waiting for them)."""
        self._wake.set()

    def run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # never let the reporter die: the agent would silently stop reporting
                log.exception("reporter failed; retrying")

    def flush(self, deliver: bool = True) -> None:
        with self._lock:
            queues, self._queues = self._queues, defaultdict(list)
        batches = [(kind, items[i:i + MAX_BATCH]) for kind, items in queues.items()
                   for i in range(0, len(items), MAX_BATCH)]
        # urgent kinds first; within a kind the original order
        batches.sort(key=lambda b: b[0] not in URGENT)
        for kind, items in batches:
            body = gzip.compress(json.dumps({"items": items}, separators=(",", ":")).encode(), compresslevel=5)
            if deliver and len(self.spool) == 0 and self._deliver(kind, body, len(items)):
                continue
            self._push(kind, body, len(items))
        if deliver:
            self._replay()

    def _push(self, kind: str, body: bytes, count: int) -> None:
        data = kind.encode() + b"\n" + body
        while True:
            try:
                self.spool.push(data, count)
                self.stats["batches_buffered"] += 1
                return
            except SpoolFull:
                oldest = self.spool.peek()
                if oldest is None:  # a single batch larger than the whole buffer
                    self.stats["records_dropped"] += count
                    return
                self.spool.pop(oldest)
                self.stats["records_dropped"] += oldest.points
                log.warning("report buffer full: dropped %d buffered records", oldest.points)

    def _replay(self) -> None:
        while (seg := self.spool.peek()) is not None:
            kind, _, body = seg.read().partition(b"\n")
            if not self._deliver(kind.decode(), body, seg.points):
                return
            self.spool.pop(seg)
            self.stats["batches_replayed"] += 1

    def _deliver(self, kind: str, body: bytes, count: int) -> bool:
        """True when the service took the batch (or refused it for good)."""
        try:
            response = self.client.post_batch(kind, body)
        except httpx.HTTPError as e:
            self._healthy = False
            self._complain(f"service unreachable ({type(e).__name__}); buffering reports")
            return False
        status = response.status_code
        self._healthy = status < 500
        if status in (200, 202):  # 202: a cluster's API has it on the bus (docs/cluster.md)
            rejected = len(response.json().get("rejected", []))
            self.stats["records_rejected"] += rejected
            self.delivered += count - rejected
            self.stats["records_delivered"] += count - rejected
            return True
        if status in (400, 413, 422):
            self.stats["records_rejected"] += count
            log.error("service refused a %s batch of %d records (%d): %s", kind, count, status, response.text[:300])
            return True
        self._complain(f"service answered {status} for {kind}; buffering reports"
                       + (" (check the agent token)" if status in (401, 403) else ""))
        return False

    def _complain(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_error > 30:
            log.warning(message)
            self._last_error = now

    @property
    def buffered_bytes(self) -> int:
        return self.spool.bytes

    def stop(self, timeout: float = 5.0) -> None:
        """Last flush: what cannot be delivered within the timeout stays in the spool on disk."""
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join(timeout)
        try:
            self.flush(deliver=self._healthy)  # a service that is away would only delay the exit
        finally:
            self.spool.close()
