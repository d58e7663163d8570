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
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from nms.store.base import (
    Point,
    Query,
    Series,
    StoreError,
    StoreUnavailable,
    TimeSeriesStore,
    WriteResult,
    field_type,
    validate_point,
)
from nms.store.lineprotocol import encode_point
from nms.store.spool import Spool

if TYPE_CHECKING:
    from nms.config.models import InfluxStoreConfig, NmsConfig

log = logging.getLogger(__name__)

_RETRY_MIN, _RETRY_MAX = 0.1, 2.0  # seconds between attempts while InfluxDB is unreachable
_MAX_BATCH_BYTES = 4 << 20  # well under influxd's default max-body-size (25 MB)
_RETRYABLE_4XX = {401, 403, 404, 429}  # auth fixed, database created, rate limit lifted: retry
_DROPPED_RE = re.compile(r"dropped=(\d+)")

# Outcomes of one POST /write.
_OK, _RETRY, _DROPPED = "ok", "retry", "dropped"


def _ident(name: str) -> str:
    """An InfluxQL double-quoted identifier."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _literal(value: str) -> str:
    """An InfluxQL single-quoted string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _parse_int(text: str) -> int | float:
    # influxd writes the float -0.0 as "-0"; keep the sign (integer fields never produce "-0").
    return -0.0 if text == "-0" else int(text)


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

        # Sender state (only the sender thread changes these).
        self._up = True
        self._db_ready = not config.create_database
        self._next_retry = 0.0
        self._backoff = _RETRY_MIN
        self._last_error: str | None = None

        self._counts: Counter[str] = Counter()
        self._dropped_by_reason: Counter[str] = Counter()
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
        valid: list[tuple[int, Point, bytes]] = []
        for i, p in enumerate(points):
            reason = validate_point(p)
            if reason is not None:
                result.rejected.append((i, reason))
            else:
                valid.append((i, p, encode_point(p).encode()))
        fields_seen: dict[str, set[str]] = {}
        for _, p, _ in valid:
            fields_seen.setdefault(p.measurement, set()).update(p.fields)
        self._load_types(fields_seen)

        with self._types_lock:
            new: dict[tuple[str, str], str] = {}
            lines: list[bytes] = []
            size = 0
            for i, p, line in valid:
                known = self._types.get(p.measurement, {})
                conflict = None
                for key, value in p.fields.items():
                    have = new.get((p.measurement, key)) or known.get(key)
                    if have is not None and have != field_type(value):
                        conflict = (f"field {key!r} of measurement {p.measurement!r} has type {have}, "
                                    f"got type {field_type(value)}")
                        break
                if conflict is not None:
                    result.rejected.append((i, conflict))
                    continue
                for key, value in p.fields.items():
                    new.setdefault((p.measurement, key), field_type(value))
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

    def _load_types(self, fields_by_measurement: dict[str, set[str]]) -> None:
        """Refresh the type cache for measurements never loaded or with fields we do not know."""
        if not self._up:  # do not make writers wait on an unreachable server
            return
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

    def _post(self, body: bytes, points: int) -> str:
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
            return _RETRY
        if r.is_success:
            self._counts["points_written"] += points
            self._db_ready = True
            self._mark_up()
            return _OK
        self._counts["write_errors"] += 1
        message = _error_text(r)
        if r.status_code >= 500 or r.status_code in _RETRYABLE_4XX:
            self._mark_down(f"write answered HTTP {r.status_code}: {message}")
            return _RETRY
        # Not retryable (bad data). On a partial write influxd stored the other points.
        self._mark_up()
        if "partial write" in message:
            m = _DROPPED_RE.search(message)
            # Lines that failed to parse are not included in dropped=N.
            dropped = min(points, (int(m.group(1)) if m else 0) + message.count("unable to parse"))
        else:
            dropped = points
        self._counts["points_written"] += points - dropped
        self._count_dropped(self._drop_reason(r.status_code, message), dropped)
        log.warning("InfluxDB refused %d of %d points (HTTP %d): %s", dropped, points, r.status_code, message)
        return _DROPPED

    @staticmethod
    def _drop_reason(status: int, message: str) -> str:
        for reason in ("field type conflict", "unable to parse", "beyond retention policy", "max-values-per-tag"):
            if reason in message:
                return reason
        return f"HTTP {status}"

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
        result = []
        for s in raw:
            casts = [int] + [self._caster(types.get(c), agg) for c in s["columns"][1:]]
            values = [[None if v is None else cast(v) for cast, v in zip(casts, row)] for row in s["values"]]
            # GROUP BY * reports every tag key of the measurement; absent tags come as "".
            tags = {k: v for k, v in (s.get("tags") or {}).items() if v != ""}
            result.append(Series(measurement=s["name"], tags=tags, columns=s["columns"], values=values))
        return result

    @staticmethod
    def _caster(ftype: str | None, agg: str | None):
        if agg == "mean":
            return float
        if agg == "count":
            return int
        return {"float": float, "integer": int}.get(ftype or "", lambda v: v)

    def _ensure_database_once(self) -> None:
        try:
            self._run_query(f"CREATE DATABASE {_ident(self.cfg.database)}")
        except StoreError:
            pass  # the query below reports the real problem

    def _run_query(self, text: str, client: httpx.Client | None = None) -> list[dict]:
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
        merged: dict[tuple, dict] = {}
        for chunk in r.text.splitlines():
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
        }
