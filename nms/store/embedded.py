"""Embedded telemetry store: one DuckDB file, no server.

Each measurement is a table with a `time` column, a series key `sk` (hash of the tag set), one
column per tag key and one typed column per field key; (sk, time) is the primary key so a point
written twice merges instead of duplicating (InfluxDB semantics). Names are mapped to generated
table/column names through two catalog tables, because DuckDB identifiers are case-insensitive
while measurement, tag and field names are not.

Writes are group-committed: a DuckDB statement costs ~7 ms whatever its size, and agents post
their reports in bursts (every agent's windows close at the same moments), so the batches that
wait while one write runs are written together by the next writer, each caller still getting its
own result (or the error). Merging keeps the sequential outcome: later points win, the first
type seen of a field wins.

Declared fields (nms.store.base.declare_fields) get their declared column type: counters are
UBIGINT, exact up to 2^64-1. A column an earlier version created with another type (a counter as
BIGINT, or as DOUBLE after a value past 2^63) is converted to the declared type the first time its
measurement is used.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from nms.store.base import (
    FieldType,
    FieldValue,
    Point,
    Query,
    Series,
    StoreError,
    TimeSeriesStore,
    WriteResult,
    declared_fields,
    field_type,
    type_conflict,
    validate_point,
)

if TYPE_CHECKING:
    from nms.config import NmsConfig

log = logging.getLogger(__name__)

_SQL_TYPES = {"float": "DOUBLE", "integer": "BIGINT", "unsigned": "UBIGINT", "boolean": "BOOLEAN",
              "string": "VARCHAR"}
_ARROW_TYPES = {"float": pa.float64(), "integer": pa.int64(), "unsigned": pa.uint64(), "boolean": pa.bool_(),
                "string": pa.string()}
# Column conversions to a declared type: (stored, declared) -> SQL expression of the old column {c}.
# A DOUBLE that held a counter past 2^63 may have rounded up to 2^64: that is 2^64-1.
_CONVERSIONS = {
    ("integer", "unsigned"): "TRY_CAST({c} AS UBIGINT)",
    ("float", "unsigned"): ("CASE WHEN {c} >= 18446744073709551615.0 THEN 18446744073709551615::UBIGINT "
                            "ELSE TRY_CAST(round({c}) AS UBIGINT) END"),
    ("integer", "float"): "CAST({c} AS DOUBLE)",
    ("float", "integer"): "TRY_CAST(round({c}) AS BIGINT)",
}
_AGG_SQL = {"mean": "avg", "min": "min", "max": "max", "sum": "sum", "count": "count",
            "first": "arg_min({c}, time)", "last": "arg_max({c}, time)"}


def series_key(tags: dict[str, str]) -> int:
    canonical = "\x00".join(f"{k}\x01{v}" for k, v in sorted(tags.items()))
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "little")


class _Table:
    """Catalog entry of one measurement: its table and the columns of its tags and fields."""

    def __init__(self, table: str):
        self.table = table
        self.tag_cols: dict[str, str] = {}  # tag key -> column
        self.field_cols: dict[str, str] = {}  # field key -> column
        self.field_types: dict[str, FieldType] = {}  # field key -> float/integer/unsigned/boolean/string
        self.reconciled = False  # columns checked against the declared types


class _Pending:
    """One caller's validated batch, waiting for a group write."""

    __slots__ = ("by_measurement", "result", "done", "error")

    def __init__(self, by_measurement: dict[str, list[tuple[int, Point]]], result: WriteResult):
        self.by_measurement, self.result = by_measurement, result
        self.done = False
        self.error: Exception | None = None


class EmbeddedStore(TimeSeriesStore):
    name = "embedded"

    def __init__(self, path: Path, retention_s: float | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention_s = retention_s
        self._lock = threading.Lock()  # the connection: one statement at a time
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # batches waiting for the next group write
        self._con = duckdb.connect(str(path))
        self._closed = False  # close() ran
        self._con.execute("CREATE TABLE IF NOT EXISTS _measurements (name VARCHAR PRIMARY KEY, tbl VARCHAR)")
        self._con.execute(
            "CREATE TABLE IF NOT EXISTS _columns (tbl VARCHAR, kind VARCHAR, key VARCHAR, col VARCHAR, type VARCHAR)")
        self._tables: dict[str, _Table] = {}
        for name, tbl in self._con.execute("SELECT name, tbl FROM _measurements").fetchall():
            self._tables[name] = _Table(tbl)
        for tbl, kind, key, col, typ in self._con.execute("SELECT tbl, kind, key, col, type FROM _columns").fetchall():
            entry = next(t for t in self._tables.values() if t.table == tbl)
            if kind == "t":
                entry.tag_cols[key] = col
            else:
                entry.field_cols[key] = col
                entry.field_types[key] = typ
        self._stats = {"points_written": 0.0, "points_rejected": 0.0, "write_calls": 0.0, "group_writes": 0.0}

    @classmethod
    def from_config(cls, cfg: NmsConfig) -> EmbeddedStore:
        conf = cfg.store.embedded
        return cls(conf.path or cfg.data_dir / "telemetry.duckdb", retention_s=conf.retention)

    # --- catalog -------------------------------------------------------------------------------

    def _table_for(self, measurement: str) -> _Table:
        entry = self._tables.get(measurement)
        if entry is None:
            entry = _Table(f"m{len(self._tables)}")
            self._con.execute(
                f'CREATE TABLE {entry.table} (time BIGINT NOT NULL, sk UBIGINT NOT NULL, PRIMARY KEY (sk, time))')
            self._con.execute("INSERT INTO _measurements VALUES (?, ?)", [measurement, entry.table])
            self._tables[measurement] = entry
        self._reconcile(measurement, entry)
        return entry

    def _known(self, measurement: str) -> _Table | None:
        """The catalog entry of an existing measurement, its columns of the declared types."""
        entry = self._tables.get(measurement)
        if entry is not None:
            self._reconcile(measurement, entry)
        return entry

    def _reconcile(self, measurement: str, entry: _Table) -> None:
        """Convert columns stored with another type than the one now declared (once per open)."""
        if entry.reconciled:
            return
        entry.reconciled = True
        for key, declared in declared_fields(measurement).items():
            stored = entry.field_types.get(key)
            if stored is None or stored == declared:
                continue
            conversion = _CONVERSIONS.get((stored, declared))
            if conversion is None:
                log.error("field %r of %r is stored as %s but declared %s: its writes are refused until the "
                          "column is dropped", key, measurement, stored, declared)
                continue
            col = entry.field_cols[key]
            counted = self._con.execute(
                f"SELECT count(*) FROM {entry.table} WHERE {col} IS NOT NULL AND ({conversion.format(c=col)}) IS NULL"
            ).fetchone()
            lost = counted[0] if counted is not None else 0  # count(*) gives one row
            self._con.execute(f"ALTER TABLE {entry.table} ALTER {col} TYPE {_SQL_TYPES[declared]} "
                              f"USING ({conversion.format(c=col)})")
            self._con.execute("UPDATE _columns SET type = ? WHERE tbl = ? AND kind = 'f' AND key = ?",
                              [declared, entry.table, key])
            entry.field_types[key] = declared
            log.warning("field %r of %r converted from %s to its declared type %s%s", key, measurement, stored,
                        declared, f" ({lost} values out of range became null)" if lost else "")

    def _add_columns(self, entry: _Table, new: list[tuple[str, str, FieldType]]) -> None:
        """Add (kind, key, type) columns in one transaction: a commit per column made the first
        writes of a fresh store slow (2.4 ms a column)."""
        if not new:
            return
        first = len(entry.tag_cols) + len(entry.field_cols)
        cols = [f"c{first + n}" for n in range(len(new))]
        self._con.execute("BEGIN TRANSACTION")
        try:
            for col, (_kind, _key, typ) in zip(cols, new):
                self._con.execute(f"ALTER TABLE {entry.table} ADD COLUMN {col} {_SQL_TYPES[typ]}")
            self._con.executemany("INSERT INTO _columns VALUES (?, ?, ?, ?, ?)",
                                  [[entry.table, kind, key, col, typ] for col, (kind, key, typ) in zip(cols, new)])
            self._con.execute("COMMIT")
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        for col, (kind, key, typ) in zip(cols, new):
            if kind == "t":
                entry.tag_cols[key] = col
            else:
                entry.field_cols[key] = col
                entry.field_types[key] = typ

    # --- write ---------------------------------------------------------------------------------

    def write(self, points: list[Point]) -> WriteResult:
        result = WriteResult()
        by_measurement: dict[str, list[tuple[int, Point]]] = defaultdict(list)
        for i, p in enumerate(points):
            if (reason := validate_point(p)) is not None:
                result.rejected.append((i, reason))
            else:
                by_measurement[p.measurement].append((i, p))
        mine = _Pending(by_measurement, result)
        with self._queue_lock:
            self._queue.append(mine)
        with self._lock:
            if not mine.done:  # nobody wrote it while we waited: write everything waiting
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._write_group(group)
                self._stats["group_writes"] += 1
            self._stats["write_calls"] += 1  # under the lock: the counters stay exact
        if mine.error is not None:
            raise mine.error
        result.rejected.sort()
        self._stats["points_written"] += result.accepted
        self._stats["points_rejected"] += len(result.rejected)
        return result

    def _write_group(self, group: list[_Pending]) -> None:
        merged: dict[str, list[tuple[WriteResult, int, Point]]] = defaultdict(list)
        for pending in group:  # in arrival order: a later batch's point wins, as if written after
            for measurement, items in pending.by_measurement.items():
                merged[measurement] += [(pending.result, i, p) for i, p in items]
        try:
            for measurement, merged_items in merged.items():
                self._write_measurement(measurement, merged_items)
        except Exception as e:
            for pending in group:
                pending.error = e
        finally:
            for pending in group:
                pending.done = True

    def _write_measurement(self, measurement: str, items: list[tuple[WriteResult, int, Point]]) -> None:
        """Write one measurement's points; each point's accepted count or rejection goes to the
        result of the batch it came in."""
        entry = self._table_for(measurement)
        # Type check against the catalog and the rest of the batch; first type seen wins.
        batch_types: dict[str, FieldType] = {}
        rows: dict[tuple[int, int], tuple[dict[str, str], dict[str, FieldValue]]] = {}
        known_types = entry.field_types
        for result, i, p in items:
            conflict = None
            types = {key: field_type(measurement, key, value) for key, value in p.fields.items()}
            for key, typ in types.items():
                known = known_types.get(key) or batch_types.get(key)
                if known is not None and known != typ:
                    conflict = type_conflict(measurement, key, typ, known)
                    break
            if conflict:
                result.rejected.append((i, conflict))
                continue
            batch_types.update(types)
            result.accepted += 1
            row_key = (series_key(p.tags), p.ts)
            if row_key in rows:  # same series and time twice in one batch: merge, later wins
                rows[row_key][1].update(p.fields)
            else:
                rows[row_key] = (p.tags, dict(p.fields))
        if not rows:
            return
        tag_keys = sorted({k for tags, _ in rows.values() for k in tags})
        field_keys = sorted({k for _, fields in rows.values() for k in fields})
        self._add_columns(entry, [("t", key, "string") for key in tag_keys if key not in entry.tag_cols] +
                          [("f", key, batch_types[key]) for key in field_keys if key not in entry.field_cols])
        types = entry.field_types

        columns = {"time": pa.array([k[1] for k in rows], pa.int64()),
                   "sk": pa.array([k[0] for k in rows], pa.uint64())}
        for key in tag_keys:
            columns[entry.tag_cols[key]] = pa.array([tags.get(key) for tags, _ in rows.values()], pa.string())
        for key in field_keys:
            columns[entry.field_cols[key]] = pa.array(
                [fields.get(key) for _, fields in rows.values()], _ARROW_TYPES[types[key]])
        batch = pa.table(columns)
        names = ", ".join(columns)
        updates = ", ".join(f"{c} = COALESCE(EXCLUDED.{c}, {entry.table}.{c})"
                            for c in list(columns)[2:])
        conflict = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
        try:
            self._con.register("_batch", batch)
            self._con.execute(f"INSERT INTO {entry.table} ({names}) SELECT {names} FROM _batch ON CONFLICT {conflict}")
        except duckdb.Error as e:
            raise StoreError(f"embedded store write failed: {e}") from e
        finally:
            self._con.unregister("_batch")

    # --- read ----------------------------------------------------------------------------------

    def _where(self, entry: _Table, tags: dict[str, list[str]]) -> tuple[list[str], list[object]] | None:
        clauses: list[str] = []
        params: list[object] = []
        for key, values in tags.items():
            col = entry.tag_cols.get(key)
            if col is None:
                return None  # filter on a tag the measurement never had: nothing matches
            clauses.append(f"{col} IN ({', '.join('?' for _ in values)})")
            params.extend(values)
        return clauses, params

    def _series(self, measurement: str, entry: _Table, fields: list[str], rows: list[tuple[Any, ...]]) -> list[Series]:
        """rows: (sk, time, *tag columns, *field values), ordered by sk then time."""
        tag_keys = list(entry.tag_cols)
        out: list[Series] = []
        current_sk = None
        for row in rows:
            sk, ts = row[0], row[1]
            if sk != current_sk:
                tags = {k: v for k, v in zip(tag_keys, row[2:2 + len(tag_keys)]) if v is not None}
                out.append(Series(measurement=measurement, tags=tags, columns=["time", *fields], values=[]))
                current_sk = sk
            out[-1].values.append([ts, *row[2 + len(tag_keys):]])
        out.sort(key=lambda s: sorted(s.tags.items()))
        return out

    def query(self, q: Query) -> list[Series]:
        with self._lock:
            entry = self._known(q.measurement)
            if entry is None:
                return []
            where = self._where(entry, q.tags)
            if where is None:
                return []
            clauses, params = where
            clauses = ["time >= ?", "time < ?", *clauses]
            params = [q.start, q.end, *params]
            fields = q.fields if q.fields is not None else sorted(entry.field_cols)
            known = [f for f in fields if f in entry.field_cols]
            if not known:
                return []
            tag_sel = "".join(f", any_value({c})" if q.agg else f", {c}" for c in entry.tag_cols.values())
            if q.agg is None:
                values = ", ".join(entry.field_cols[f] if f in entry.field_cols else "NULL" for f in fields)
                not_all_null = " OR ".join(f"{entry.field_cols[f]} IS NOT NULL" for f in known)
                sql = (f"SELECT sk, time{tag_sel}, {values} FROM {entry.table} "
                       f"WHERE {' AND '.join(clauses)} AND ({not_all_null}) "
                       f"QUALIFY row_number() OVER (PARTITION BY sk ORDER BY time) <= {q.limit} "
                       f"ORDER BY sk, time")
            else:
                aggs = []
                for f in fields:
                    col = entry.field_cols.get(f)
                    tmpl = _AGG_SQL[q.agg]
                    aggs.append("NULL" if col is None else
                                tmpl.format(c=col) if "{c}" in tmpl else f"{tmpl}({col})")
                having = " OR ".join(f"{a} IS NOT NULL" for a in aggs if a != "NULL")
                if q.agg == "count":
                    having = " OR ".join(f"{a} > 0" for a in aggs if a != "NULL")
                w = q.window_ns
                sql = (f"SELECT sk, (time // {w}) * {w} AS bucket{tag_sel}, {', '.join(aggs)} "
                       f"FROM {entry.table} WHERE {' AND '.join(clauses)} "
                       f"GROUP BY sk, bucket HAVING {having} "
                       f"QUALIFY row_number() OVER (PARTITION BY sk ORDER BY bucket) <= {q.limit} "
                       f"ORDER BY sk, bucket")
            try:
                rows = self._con.execute(sql, params).fetchall()
            except duckdb.Error as e:
                raise StoreError(f"query failed: {e}") from e
        series = self._series(q.measurement, entry, fields, rows)
        if q.agg == "mean":
            for s in series:
                for row in s.values:
                    row[1:] = [None if v is None else float(v) for v in row[1:]]
        return series

    def latest(self, measurement: str, tags: dict[str, list[str]] | None = None,
               fields: list[str] | None = None) -> list[Series]:
        with self._lock:
            entry = self._known(measurement)
            if entry is None:
                return []
            where = self._where(entry, tags or {})
            if where is None:
                return []
            clauses, params = where
            fields = fields if fields is not None else sorted(entry.field_cols)
            known = [f for f in fields if f in entry.field_cols]
            if not known:
                return []
            clauses.append("(" + " OR ".join(f"{entry.field_cols[f]} IS NOT NULL" for f in known) + ")")
            tag_sel = "".join(f", {c}" for c in entry.tag_cols.values())
            values = ", ".join(entry.field_cols.get(f, "NULL") for f in fields)
            sql = (f"SELECT sk, time{tag_sel}, {values} FROM {entry.table} WHERE {' AND '.join(clauses)} "
                   f"QUALIFY row_number() OVER (PARTITION BY sk ORDER BY time DESC) = 1 ORDER BY sk")
            rows = self._con.execute(sql, params).fetchall()
        return self._series(measurement, entry, fields, rows)

    # --- housekeeping --------------------------------------------------------------------------

    def prune(self, older_than_ns: int) -> int:
        deleted = 0
        with self._lock:
            for entry in self._tables.values():
                res = self._con.execute(f"DELETE FROM {entry.table} WHERE time < ?", [older_than_ns]).fetchone()
                deleted += res[0] if res else 0
        return deleted

    def flush(self, timeout: float = 10.0) -> bool:
        with self._lock:
            self._con.execute("CHECKPOINT")
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._con.execute("CHECKPOINT")
            finally:
                self._con.close()
                self._closed = True

    def stats(self) -> dict[str, float]:
        return dict(self._stats, measurements=float(len(self._tables)))

    def health(self) -> dict[str, object]:
        return {"backend": self.name, "ok": True, "path": str(self.path)}
