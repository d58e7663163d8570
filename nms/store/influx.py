"""InfluxDB backend of the telemetry store, over the v1 HTTP API (/write, /query, /ping).

write() validates and type-checks points synchronously, then buffers their encoded lines. One
sender thread does all network writes, which keeps ordering simple:
- it sends batches (batch_size points, or whatever is buffered every flush_interval);
- when InfluxDB is down, slow or failing, a batch goes to the disk spool, and while the spool
  holds anything every later batch goes behind it (FIFO);
- when /ping answers again it replays the spool oldest first, deleting a segment only after a
  2xx. InfluxDB overwrites a point with the same series and timestamp, so a batch re-sent after
  a lost acknowledgement cannot duplicate data.
The bytes not yet in InfluxDB (spool + buffer + batch in flight) never exceed spool_max_bytes:
beyond that write() raises StoreUnavailable and keeps nothing of the batch.

A batch InfluxDB refuses for good (HTTP 400: a field type conflict, a point beyond retention)
never takes the rest down with it: the points the server names (or, failing that, the ones found
by re-sending halves, which is harmless since a re-sent point overwrites itself) go to the
quarantine with the server's reason, and the others are stored.

Declared unsigned fields (counters) are written as unsigned integers where the server has them
(found at start by a write it must refuse either way, so nothing is written), else as the signed
integer with the same 64 bits; reads turn them back into the exact counter through the declared
types (nms.store.base.declared_fields).

What InfluxDB acknowledged to this process is also kept on disk after every batch (LEDGER_FILE in
the spool directory: points written, the batch in flight, points spooled), so that what a process
killed with SIGKILL had stored can still be counted (`nms cluster status`, the cluster lab test).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from nms.store.base import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    FieldType,
    Point,
    Query,
    Series,
    StoreError,
    StoreUnavailable,
    TimeSeriesStore,
    WriteResult,
    declared_fields,
    field_type,
    type_conflict,
    validate_point,
)
from nms.store.influx_downsampling import reconcile as reconcile_downsampling
from nms.store.lineprotocol import encode_point, parse_line, split_batch, unsigned_from_signed
from nms.store.quarantine import Quarantine
from nms.store.spool import LEDGER_FILE, Spool

if TYPE_CHECKING:
    from nms.config.models import InfluxStoreConfig, NmsConfig

log = logging.getLogger(__name__)

_RETRY_MIN, _RETRY_MAX = 0.1, 2.0  # seconds between attempts while InfluxDB is unreachable
_MAX_BATCH_BYTES = 4 << 20  # well under influxd's default max-body-size (25 MB)
_RETRYABLE_4XX = {401, 403, 404, 429}  # auth fixed, database created, rate limit lifted: retry
_CONFLICT_RE = re.compile(r'input field "(.*)" on measurement "(.*)" is type (\w+), already exists as type (\w+)')
_ISOLATE_REQUESTS = 64  # re-sends allowed to find the refused points of one batch
# Parses on every server, but its timestamp is out of range everywhere: nothing is written. A
# server without unsigned integers stops at the value ("invalid number") before the time.
_UNSIGNED_PROBE = b"nms_capability_probe unsigned=1u 9223372036854775807\n"

# Outcomes of one POST /write.
_OK, _RETRY, _SETTLED = "ok", "retry", "settled"


def read_ledger(spool_dir: Path) -> dict[str, Any] | None:
    """A store's ledger (see the module's doc), or None where it wrote none."""
    try:
        ledger: dict[str, Any] = json.loads((Path(spool_dir) / LEDGER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return ledger


class _Retry(Exception):
    """InfluxDB became unavailable while a refused batch was being sorted out."""


def _ident(name: str) -> str:
    """An InfluxQL double-quoted identifier."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _literal(value: str) -> str:
    """An InfluxQL single-quoted string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _parse_int(text: str) -> int | float:
    # influxd writes the float -0.0 as "-0"; keep the sign (integer fields never produce "-0").
    return -0.0 if text == "-0" else int(text)


def _to_int(value: int | float) -> int:
    # An int past the 64-bit range can only be a float column (influxd writes whole floats below
    # 1e21 without an exponent).
    if value.__class__ is int and INT64_MIN <= value <= INT64_MAX:
        return value
    return min(max(int(round(value)), INT64_MIN), INT64_MAX)


def _to_unsigned(value: int | float) -> int:
    if value.__class__ is int and value < 0:
        return unsigned_from_signed(value)
    return min(int(round(value)), UINT64_MAX)  # a float column: 2^64-1 was rounded up to 2^64


def _redact(text: str) -> str:
    """Hide credentials embedded in a URL (http://user:password@host)."""
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def _error_text(r: httpx.Response) -> str:
    try:
        return str(r.json().get("error", ""))[:500] or r.reason_phrase
    except ValueError:
        return r.text[:500] or r.reason_phrase


class InfluxStore(TimeSeriesStore):
    name = "influxdb"

    def __init__(self, config: InfluxStoreConfig, data_dir: Path) -> None:
        self.cfg = config
        self._url = _redact(config.url)  # for messages and logs
        self._spool = Spool(config.spool_dir or Path(data_dir) / "spool", config.spool_max_bytes)
        self._quarantine = Quarantine(self._spool.directory, config.quarantine_max_bytes)
        self._capabilities_file = self._spool.directory / "capabilities.json"
        self._unsigned: bool | None = self._load_capabilities().get("unsigned")
        headers, auth = {}, None
        url = httpx.URL(config.url)
        if config.token is not None:
            headers["Authorization"] = f"Token {config.token.get_secret_value()}"
        elif config.username:
            password = config.password.get_secret_value() if config.password else ""
            auth = httpx.BasicAuth(config.username, password)
        elif url.userinfo:  # credentials in the URL: use them, but keep them out of logged URLs
            auth = httpx.BasicAuth(url.username, url.password)
        base_url = url.copy_with(userinfo=b"")

        def client() -> httpx.Client:
            return httpx.Client(base_url=base_url, auth=auth, headers=headers,
                                timeout=config.timeout, verify=config.verify_tls)

        self._send_http = client()  # the sender thread's own
        self._http = client()  # queries, type lookups, health
        self._write_params = {"db": config.database, "precision": "ns"}
        if config.retention_policy:
            self._write_params["rp"] = config.retention_policy

        # Buffer of encoded lines; guarded by _cond. Sequence numbers let flush() wait for
        # exactly what was accepted before it was called.
        self._cond = threading.Condition()
        self._buffer: deque[bytes] = deque()
        self._buffer_bytes = 0
        self._inflight_bytes = 0
        self._inflight_points = 0
        self._accepted_seq = 0
        self._done_seq = 0  # lines written, spooled or dropped
        self._flush_requested = False
        self._last_drain = time.monotonic()
        self._stopping = False
        self._closed = False

        # measurement -> field -> type, from SHOW FIELD KEYS and our own accepted writes.
        # _types_lock also serializes write() so that concurrent batches cannot disagree on types.
        self._types_lock = threading.Lock()
        self._types: dict[str, dict[str, str]] = {}
        self._types_loaded: set[str] = set()
        self._capabilities_due = 0.0  # checked once per start: the server may have been upgraded

        # Sender state (only the sender thread changes these).
        self._up = True
        self._db_ready = not config.create_database
        # Retention policies and continuous queries (nms.store.influx_downsampling), once per start.
        self._downsampling_due = config.downsampling.enabled
        self._downsampling: dict[str, Any] | None = None
        self._next_retry = 0.0
        self._backoff = _RETRY_MIN
        self._last_error: str | None = None

        self._counts: Counter[str] = Counter()
        self._dropped_by_reason: Counter[str] = Counter()
        self._ledger_file = self._spool.directory / LEDGER_FILE
        self._started_ns, self._ledger_failed = time.time_ns(), False
        self._note_ledger(0)
        self._thread = threading.Thread(target=self._run, name="influx-sender", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: NmsConfig) -> InfluxStore:
        return cls(cfg.store.influxdb, cfg.data_dir)

    # --- write path ---------------------------------------------------------------------------

    def write(self, points: list[Point]) -> WriteResult:
        if self._closed:
            raise StoreUnavailable("the InfluxDB store is closed")
        result = WriteResult()
        valid: list[tuple[int, Point]] = []
        for i, p in enumerate(points):
            reason = validate_point(p)
            if reason is not None:
                result.rejected.append((i, reason))
            else:
                valid.append((i, p))
        fields_seen: dict[str, set[str]] = {}
        for _, p in valid:
            fields_seen.setdefault(p.measurement, set()).update(p.fields)
        self._load_types(fields_seen)

        with self._types_lock:
            new: dict[tuple[str, str], str] = {}  # (measurement, field) -> the server type this batch gives it
            u_fields: dict[str, frozenset[str]] = {}
            lines: list[bytes] = []
            size = 0
            for i, p in valid:
                m = p.measurement
                known = self._types.get(m, {})
                declared = declared_fields(m)
                conflict = None
                for key, value in p.fields.items():
                    # A declared field's type never depends on what the server has: InfluxDB
                    # judges it, and what it refuses is quarantined (not a 422 to the sender).
                    have = new.get((m, key)) or known.get(key)
                    if key not in declared and have is not None and have != field_type(m, key, value):
                        conflict = type_conflict(m, key, field_type(m, key, value), have)
                        break
                if conflict is not None:
                    result.rejected.append((i, conflict))
                    continue
                if (u := u_fields.get(m)) is None:
                    u = u_fields[m] = self._unsigned_fields(m, known, declared)
                for key, value in p.fields.items():
                    typ = field_type(m, key, value)
                    new.setdefault((m, key), typ if typ != "unsigned" or key in u else "integer")
                line = encode_point(p, u).encode()
                lines.append(line)
                size += len(line) + 1
            with self._cond:
                if self._stopping:
                    raise StoreUnavailable("the InfluxDB store is closing")
                unsent = self._spool.bytes + self._buffer_bytes + self._inflight_bytes
                if lines and unsent + size > self.cfg.spool_max_bytes:
                    raise StoreUnavailable(
                        f"InfluxDB backlog full ({unsent} of {self.cfg.spool_max_bytes} bytes "
                        f"waiting to be written); retry later")
                self._buffer.extend(lines)
                self._buffer_bytes += size
                self._accepted_seq += len(lines)
                if len(self._buffer) >= self.cfg.batch_size:
                    self._cond.notify_all()
            for (measurement, key), ftype in new.items():
                self._types.setdefault(measurement, {}).setdefault(key, ftype)
            self._counts["points_rejected"] += len(result.rejected)  # under the lock: writers race

        result.accepted = len(lines)
        result.rejected.sort()
        return result

    def _unsigned_fields(self, measurement: str, known: dict[str, str], declared: Mapping[str, FieldType]
                         ) -> frozenset[str]:
        """Declared unsigned fields to write as `u`: where the server has them unsigned, or has
        not got them yet and takes unsigned integers. The others keep the signed encoding."""
        return frozenset(k for k, t in declared.items() if t == "unsigned"
                         and (known.get(k) == "unsigned" or (k not in known and self._unsigned)))

    def _load_capabilities(self) -> dict[str, Any]:
        try:
            capabilities: dict[str, Any] = json.loads(self._capabilities_file.read_text())
            return capabilities
        except (OSError, ValueError):
            return {}

    def _detect_unsigned(self) -> None:
        """Does the server take unsigned integers? Kept on disk, so that a restart while InfluxDB
        is down encodes counters as the last start found."""
        if not self._db_ready:
            self._ensure_database_once()
        try:
            r = self._http.post("/write", params=self._write_params, content=_UNSIGNED_PROBE)
        except httpx.HTTPError:
            return
        if r.status_code not in (200, 204, 400):
            return  # auth, missing database, server error: try again with the next write
        unsigned = not (r.status_code == 400 and "invalid number" in _error_text(r))
        if unsigned != self._unsigned:
            log.info("InfluxDB at %s %s unsigned integers: counters are written %s", self._url,
                     "takes" if unsigned else "has no", "as unsigned" if unsigned else "in the signed encoding")
        self._unsigned = unsigned
        try:
            self._capabilities_file.write_text(json.dumps({"unsigned": unsigned}))
        except OSError as e:
            log.warning("cannot keep %s: %s", self._capabilities_file, e)

    def _load_types(self, fields_by_measurement: dict[str, set[str]]) -> None:
        """Refresh the type cache for measurements never loaded or with fields we do not know."""
        if not self._up:  # do not make writers wait on an unreachable server
            return
        if time.monotonic() >= self._capabilities_due:
            self._detect_unsigned()
            self._capabilities_due = time.monotonic() + (60.0 if self._unsigned is None else float("inf"))
        for measurement, fields in fields_by_measurement.items():
            known = self._types.get(measurement, {})
            if measurement in self._types_loaded and all(k in known for k in fields):
                continue
            try:
                self._refresh_types(measurement)
            except StoreError as e:
                log.debug("field types of %r not loaded: %s", measurement, e)

    def _refresh_types(self, measurement: str) -> dict[str, str]:
        server: dict[str, str] = {}
        for s in self._run_query(f"SHOW FIELD KEYS FROM {self._source(measurement)}"):
            for key, ftype in s["values"]:
                server.setdefault(key, ftype)
        with self._types_lock:
            types = self._types.setdefault(measurement, {})
            types.update(server)
            self._types_loaded.add(measurement)
            return dict(types)

    def flush(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._accepted_seq
            self._flush_requested = True
            self._cond.notify_all()
            while self._done_seq < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining)
            return True

    def drain(self, timeout: float = 30.0) -> bool:
        """flush(), then wait until the spool is replayed too. True when everything is in InfluxDB."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        with self._cond:
            while len(self._spool) or self._done_seq < self._accepted_seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.1))
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        # The sender's last round sends or spools everything buffered.
        self._thread.join(timeout=4 * self.cfg.timeout + 10)
        if self._thread.is_alive() or self._buffer:
            log.error("InfluxDB store closed with %d points neither written nor spooled", len(self._buffer))
        self._send_http.close()
        self._http.close()
        self._spool.close()

    # --- sender thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not (self._stopping or self._flush_requested
                        or len(self._buffer) >= self.cfg.batch_size):
                    wait = self.cfg.flush_interval
                    if len(self._spool) or not self._db_ready:
                        wait = min(wait, max(0.0, self._next_retry - time.monotonic()))
                    self._cond.wait(wait)
                stopping = self._stopping
            try:
                self._round(final=stopping)
            except Exception:  # never let the sender die: it is the only way data leaves
                log.exception("InfluxDB sender round failed")
                time.sleep(min(self.cfg.flush_interval, 1.0))
            if stopping:
                return

    def _round(self, final: bool) -> None:
        due = time.monotonic() >= self._next_retry
        if not final and due and not self._db_ready:
            self._ensure_database()
        if not final and due and self._db_ready and self._downsampling_due:
            self._ensure_downsampling()
        if not final and due and len(self._spool):
            self._replay()
        self._drain_buffer(force=True, final=final)

    def _drain_buffer(self, force: bool, final: bool = False) -> None:
        """Send or spool buffered lines: everything when forced, else only full batches."""
        while True:
            with self._cond:
                if not self._buffer or (not force and len(self._buffer) < self.cfg.batch_size):
                    if not self._buffer:
                        self._flush_requested = False
                        self._last_drain = time.monotonic()
                    return
                lines: list[bytes] = []
                size = 0
                while (self._buffer and len(lines) < self.cfg.batch_size
                       and (not lines or size + len(self._buffer[0]) < _MAX_BATCH_BYTES)):
                    line = self._buffer.popleft()
                    lines.append(line)
                    size += len(line) + 1
                self._buffer_bytes -= size
                self._inflight_bytes, self._inflight_points = size, len(lines)
            delivered = self._deliver(b"\n".join(lines) + b"\n", len(lines), final)
            with self._cond:
                self._inflight_bytes = self._inflight_points = 0
                if delivered:
                    self._done_seq += len(lines)
                else:  # could not even spool (disk error): keep it, in order, and retry later
                    self._buffer.extendleft(reversed(lines))
                    self._buffer_bytes += size
                self._cond.notify_all()
            if not delivered:
                return

    def _deliver(self, body: bytes, points: int, final: bool) -> bool:
        """Send a batch, or spool it behind older data. False when it could not be kept at all."""
        can_send = not len(self._spool) and (self._up or (not final and time.monotonic() >= self._next_retry))
        if can_send and self._post(body, points) != _RETRY:
            return True
        try:
            self._spool.push(body, points)
            self._note_ledger(0)
            return True
        except (StoreUnavailable, OSError) as e:
            self._last_error = f"cannot spool: {e}"
            log.error("InfluxDB batch of %d points kept in memory: %s", points, e)
            self._next_retry = time.monotonic() + self._backoff
            return False

    def _replay(self) -> None:
        if not self._ping():
            self._mark_down("no answer to /ping")
            return
        # Small segments (one per flush while down) are sent together, up to one batch's size.
        while (group := self._spool.head(self.cfg.batch_size, _MAX_BATCH_BYTES)) and not self._stopping:
            parts: list[bytes] = []
            for seg in group:
                try:
                    parts.append(seg.read())
                except OSError as e:
                    if parts:  # send the readable ones first; this one comes up first next time
                        break
                    log.error("unreadable spool segment %s dropped: %s", seg.path.name, e)
                    self._count_dropped("unreadable spool segment", seg.points)
                    self._spool.pop(seg)
                    break
            if not parts:
                continue
            group, data = group[:len(parts)], b"".join(parts)
            if self._post(data, sum(seg.points for seg in group)) == _RETRY:
                return
            for seg in group:
                self._spool.pop(seg)
            with self._cond:
                self._cond.notify_all()
                due = (self._flush_requested
                       or time.monotonic() - self._last_drain >= self.cfg.flush_interval)
            # Keep new data moving (behind the spool) while a long backlog drains.
            self._drain_buffer(force=due)

    def _send(self, body: bytes) -> tuple[int | None, str]:
        """POST one /write body: (HTTP status or None when unreachable, server message). Marks
        the server down when the answer means "retry later"."""
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.cfg.gzip:
            body = gzip.compress(body, compresslevel=3)
            headers["Content-Encoding"] = "gzip"
        self._counts["write_requests"] += 1
        try:
            r = self._send_http.post("/write", params=self._write_params, content=body, headers=headers)
        except httpx.HTTPError as e:
            self._counts["write_errors"] += 1
            self._mark_down(_redact(f"write failed: {type(e).__name__}: {e}"))
            return None, str(e)
        if r.is_success:
            self._db_ready = True
            self._mark_up()
            return r.status_code, ""
        self._counts["write_errors"] += 1
        message = _error_text(r)
        if r.status_code >= 500 or r.status_code in _RETRYABLE_4XX:
            self._mark_down(f"write answered HTTP {r.status_code}: {message}")
        else:
            self._mark_up()
        return r.status_code, message

    @staticmethod
    def _must_retry(status: int | None) -> bool:
        return status is None or status >= 500 or status in _RETRYABLE_4XX

    def _post(self, body: bytes, points: int) -> str:
        self._note_ledger(points)
        try:
            return self._post_batch(body, points)
        finally:
            self._note_ledger(0)

    def _post_batch(self, body: bytes, points: int) -> str:
        status, message = self._send(body)
        if status is None or self._must_retry(status):  # None: no answer (_must_retry says retry too)
            return _RETRY
        if status < 300:
            self._counts["points_written"] += points
            return _OK
        # Refused for good (bad data). Sort out which points, keep them, store the others.
        lines = split_batch(body)
        try:
            quarantined = self._isolate(lines, message)
        except _Retry:
            return _RETRY
        self._counts["points_written"] += len(lines) - quarantined
        return _SETTLED

    def _note_ledger(self, in_flight: int) -> None:
        """The ledger on disk (the module's doc); replaced whole, so a kill leaves the last one."""
        data = {"pid": os.getpid(), "started_ns": self._started_ns, "points_written": self._counts["points_written"],
                "points_in_flight": in_flight, "spool_points": self._spool.points}
        tmp = self._ledger_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._ledger_file)
            self._ledger_failed = False
        except OSError as e:
            if not self._ledger_failed:
                log.warning("InfluxDB write ledger not kept in %s: %s", self._ledger_file, e)
            self._ledger_failed = True

    def _isolate(self, lines: list[bytes], message: str) -> int:
        """Quarantine the points of a refused batch that InfluxDB refuses and make sure the others
        are stored; returns how many were quarantined. Raises _Retry if the server goes away."""
        quarantined, budget = 0, _ISOLATE_REQUESTS
        work = [(lines, message)]
        while work:
            lines, message = work.pop()
            named, reason = self._named_by(lines, message)
            if named:
                quarantined += self._to_quarantine(named, reason)
                named_set = set(named)
                parts = [rest] if (rest := [line for line in lines if line not in named_set]) else []
            elif len(lines) == 1:
                quarantined += self._to_quarantine(lines, message)
                continue
            elif budget <= 0:
                quarantined += self._to_quarantine(
                    lines, f"{message} (not isolated: some of these {len(lines)} points may be stored)")
                continue
            else:
                parts = [lines[:len(lines) // 2], lines[len(lines) // 2:]]
            for part in parts:  # a re-sent point overwrites itself: re-sending stored ones is harmless
                budget -= 1
                status, answer = self._send(b"\n".join(part) + b"\n")
                if status is None or self._must_retry(status):
                    raise _Retry
                if status >= 300:
                    work.append((part, answer))
        return quarantined

    def _named_by(self, lines: list[bytes], message: str) -> tuple[list[bytes], str]:
        """The lines an InfluxDB error names: a field type conflict names a measurement, a field
        and its two types; a parse error quotes the line. ([], message) when it names none."""
        if m := _CONFLICT_RE.search(message):
            field, measurement, got, have = m.groups()
            with self._types_lock:  # what the server has decides later writes
                self._types.setdefault(measurement, {})[field] = have
            named = []
            for line in lines:
                _, line_measurement, types = parse_line(line.decode())
                if line_measurement == measurement and types.get(field) == got:
                    named.append(line)
            return named, type_conflict(measurement, field, got, have, "InfluxDB")
        if "unable to parse" in message:
            return [line for line in lines if f"unable to parse '{line.decode()}'" in message], message
        return [], message

    def _to_quarantine(self, lines: list[bytes], reason: str) -> int:
        try:
            self._quarantine.add(lines, reason)
        except OSError as e:
            self._count_dropped("quarantine not writable", len(lines))
            log.error("InfluxDB refused %d points (%s) and they could not be quarantined (%s): dropped",
                      len(lines), reason, e)
            return len(lines)
        log.warning("InfluxDB refused %d points: %s; kept in %s", len(lines), reason, self._quarantine.path)
        return len(lines)

    def keep_refused(self, refused: list[tuple[Point, str]]) -> int:
        by_reason: dict[str, list[bytes]] = {}
        for p, reason in refused:
            by_reason.setdefault(reason, []).append(encode_point(p).encode())
        kept = 0
        for reason, lines in by_reason.items():
            kept += self._to_quarantine(lines, reason)
        return kept

    def replay_quarantine(self) -> int:
        """Queue every quarantined point again (behind the spool); returns how many. Points the
        server still refuses come back to the quarantine with the new reason."""
        def into_spool(lines: list[bytes]) -> None:
            for i in range(0, len(lines), self.cfg.batch_size):
                chunk = lines[i:i + self.cfg.batch_size]
                self._spool.push(b"".join(line + b"\n" for line in chunk), len(chunk))
        n = self._quarantine.drain(into_spool)
        with self._cond:
            self._cond.notify_all()
        return n

    def quarantined(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._quarantine.entries(limit)

    def _count_dropped(self, reason: str, n: int) -> None:
        self._counts["points_dropped"] += n
        self._dropped_by_reason[reason] += n

    def _ping(self) -> bool:
        try:
            return self._send_http.get("/ping", timeout=min(self.cfg.timeout, 2.0)).status_code in (200, 204)
        except httpx.HTTPError:
            return False

    def _ensure_database(self) -> None:
        try:
            self._run_query(f"CREATE DATABASE {_ident(self.cfg.database)}", client=self._send_http)
            self._db_ready = True
        except StoreError as e:
            self._mark_down(f"cannot create database: {e}")

    def _ensure_downsampling(self) -> None:
        """Create/alter the configured retention policies and continuous queries. Unreachable: tried
        again next round; refused (no admin rights, a bad definition): reported in health, not retried."""
        try:
            outcome = reconcile_downsampling(lambda q: self._run_query(q, client=self._send_http), self.cfg)
        except StoreUnavailable as e:
            self._mark_down(f"cannot set up downsampling: {e}")
            return
        except StoreError as e:
            log.error("InfluxDB downsampling not set up (retention policies / continuous queries): %s", e)
            self._downsampling = {"error": str(e)}
        else:
            for change in outcome.created + outcome.altered + outcome.dropped:
                log.info("InfluxDB downsampling: %s", change)
            self._downsampling = outcome.as_dict()
        self._downsampling_due = False

    def _mark_down(self, reason: str) -> None:
        if self._up or reason != self._last_error:
            log.warning("InfluxDB at %s unavailable, spooling to disk: %s", self._url, reason)
        self._up = False
        self._last_error = reason
        self._next_retry = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, _RETRY_MAX)

    def _mark_up(self) -> None:
        if not self._up:
            log.info("InfluxDB at %s reachable again", self._url)
        self._up = True
        self._backoff = _RETRY_MIN

    # --- read path ----------------------------------------------------------------------------

    def _source(self, measurement: str) -> str:
        if self.cfg.retention_policy:
            return ".".join(_ident(x) for x in (self.cfg.database, self.cfg.retention_policy, measurement))
        return _ident(measurement)

    @staticmethod
    def _tag_conditions(tags: dict[str, list[str]] | None) -> list[str]:
        # ::tag so that a field of the same name is never compared instead.
        return ["(" + " OR ".join(f"{_ident(k)}::tag = {_literal(v)}" for v in values) + ")"
                for k, values in (tags or {}).items()]

    def query(self, q: Query) -> list[Series]:
        if q.agg is not None:
            select = ", ".join(f"{q.agg}({_ident(f)}) AS {_ident(f)}" for f in q.fields or [])
            group = f"GROUP BY time({q.window_ns}ns), * fill(none)"
        else:
            select = ", ".join(_ident(f) for f in q.fields) if q.fields else "*::field"
            group = "GROUP BY *"
        where = " AND ".join([f"time >= {q.start}", f"time < {q.end}", *self._tag_conditions(q.tags)])
        text = f"SELECT {select} FROM {self._source(q.measurement)} WHERE {where} {group} LIMIT {q.limit}"
        return self._select(text, q.measurement, q.agg)

    def latest(self, measurement: str, tags: dict[str, list[str]] | None = None,
               fields: list[str] | None = None) -> list[Series]:
        select = ", ".join(_ident(f) for f in fields) if fields else "*::field"
        conditions = self._tag_conditions(tags)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        text = f"SELECT {select} FROM {self._source(measurement)}{where} GROUP BY * ORDER BY time DESC LIMIT 1"
        # DESC also orders the series backwards; report them in tag order like query() does.
        return sorted(self._select(text, measurement, None), key=lambda s: sorted(s.tags.items()))

    def _select(self, text: str, measurement: str, agg: str | None) -> list[Series]:
        if not self._db_ready:
            self._ensure_database_once()
        raw = self._run_query(text)
        if not raw:
            return []
        types = self._types.get(measurement, {})
        columns = {c for s in raw for c in s["columns"][1:]}
        if not columns <= types.keys():
            types = self._refresh_types(measurement)
        declared = declared_fields(measurement)
        result = []
        for s in raw:
            casts = [int] + [self._caster(declared.get(c) or types.get(c), agg) for c in s["columns"][1:]]
            values = [[None if v is None else cast(v) for cast, v in zip(casts, row)] for row in s["values"]]
            # GROUP BY * reports every tag key of the measurement; absent tags come as "".
            tags = {k: v for k, v in (s.get("tags") or {}).items() if v != ""}
            result.append(Series(measurement=s["name"], tags=tags, columns=s["columns"], values=values))
        return result

    @staticmethod
    def _caster(ftype: str | None, agg: str | None) -> Callable[[Any], Any]:
        """Turn a JSON value back into its field's type: the declared one where there is one, so a
        counter comes back exact whether the server holds it unsigned or signed-encoded (or as the
        float an earlier version wrote after a value past 2^63)."""
        if agg == "mean":
            return float
        if agg == "count":
            return int
        if ftype == "unsigned":
            # A sum of signed-encoded counters is a plain sum: only single values are turned back.
            return int if agg == "sum" else _to_unsigned
        by_type: dict[str, Callable[[Any], Any]] = {"float": float, "integer": _to_int}
        return by_type.get(ftype or "", lambda v: v)

    def _ensure_database_once(self) -> None:
        try:
            self._run_query(f"CREATE DATABASE {_ident(self.cfg.database)}")
        except StoreError:
            pass  # the query below reports the real problem

    def _run_query(self, text: str, client: httpx.Client | None = None) -> list[dict[str, Any]]:
        """Run one InfluxQL statement; return its series (merged across chunks)."""
        client = client or self._http
        params = {"db": self.cfg.database, "epoch": "ns", "chunked": "true", "chunk_size": "10000"}
        try:
            r = client.post("/query", params=params, data={"q": text})
        except httpx.HTTPError as e:
            raise StoreUnavailable(_redact(f"InfluxDB at {self._url} unreachable: {type(e).__name__}: {e}")) from None
        if r.status_code >= 500:
            raise StoreUnavailable(f"InfluxDB error (HTTP {r.status_code}): {_error_text(r)}")
        if not r.is_success:
            raise StoreError(f"InfluxDB refused the query (HTTP {r.status_code}): {_error_text(r)}")
        merged: dict[tuple[object, ...], dict[str, Any]] = {}
        for chunk in r.text.split("\n"):  # not splitlines(): U+0085 stands unescaped inside JSON strings
            if not chunk.strip():
                continue
            doc = json.loads(chunk, parse_int=_parse_int)
            if "error" in doc:
                raise StoreError(f"InfluxDB query error: {doc['error']}")
            for res in doc.get("results", []):
                if "error" in res:
                    if res["error"].startswith("database not found") and self.cfg.create_database:
                        return []  # not created yet: nothing written either
                    raise StoreError(f"InfluxDB query error: {res['error']}")
                for s in res.get("series", []):
                    key = (s.get("name"), tuple(sorted((s.get("tags") or {}).items())))
                    if key in merged:
                        merged[key]["values"].extend(s.get("values", []))
                    else:
                        merged[key] = {**s, "values": list(s.get("values", []))}
        return list(merged.values())

    # --- status -------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        with self._cond:
            buffered = len(self._buffer) + self._inflight_points
        return {
            "points_written": self._counts["points_written"],
            "points_rejected": self._counts["points_rejected"],
            "points_dropped": self._counts["points_dropped"],
            "spool_bytes": self._spool.bytes,
            "spool_segments": len(self._spool),
            "spool_points": self._spool.points,
            "buffered_points": buffered,
            "write_errors": self._counts["write_errors"],
            "write_requests": self._counts["write_requests"],
            "points_quarantined": self._quarantine.added,
            "quarantine_points": self._quarantine.points,
            "quarantine_bytes": self._quarantine.bytes,
        }

    def health(self) -> dict[str, object]:
        try:
            ok = self._http.get("/ping", timeout=min(self.cfg.timeout, 2.0)).status_code in (200, 204)
        except httpx.HTTPError:
            ok = False
        return {
            "backend": self.name,
            "ok": ok,
            "spool_bytes": self._spool.bytes,
            "spool_segments": len(self._spool),
            "last_error": self._last_error,
            "dropped_by_reason": dict(self._dropped_by_reason),
            "unsigned_integers": self._unsigned,
            "quarantine": {"points": self._quarantine.points, "bytes": self._quarantine.bytes,
                           "dropped": self._quarantine.dropped, "last_reason": self._quarantine.last_reason,
                           "path": str(self._quarantine.path)},
            **({"downsampling": self._downsampling} if self.cfg.downsampling.enabled else {}),
        }
