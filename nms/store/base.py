"""The telemetry store contract shared by every backend.

Data model (the InfluxDB one, so dashboards read it naturally): a point is a measurement name,
string tags (identifiers), typed fields (numbers, booleans, strings) and a nanosecond timestamp.
A series is a measurement plus one tag set. Writing a point whose series and timestamp already
exist merges its fields into the stored point (InfluxDB semantics), so replaying a batch never
duplicates data.

Field types: a field's stored type is fixed by its first write, for ever. Fields of the record
types are *declared* (nms.records declares them through `declare_fields`), so their type never
depends on a value: an unsigned 64-bit counter stays an integer at 2^64-1, a float field given an
integer stores a float. Undeclared fields (generic points) take the type of their first value.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FieldValue = bool | int | float | str
FieldType = Literal["float", "integer", "unsigned", "boolean", "string"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
# InfluxDB refuses math.MaxInt64 itself as a timestamp ("time outside range"): one below is the last.
MAX_TIMESTAMP_NS = INT64_MAX - 1
MAX_NAME_LEN = 256
MAX_STRING_FIELD = 64 * 1024  # InfluxDB's limit for a string field
# Names and tag values cannot end in a backslash or hold one before ',', ' ' or '=':
# InfluxDB 1.x line protocol has no way to write those (it does not unescape '\\' in tags).


class StoreError(Exception):
    """A backend failed in a way the caller should see (bad query, backend error)."""


class StoreUnavailable(StoreError):
    """The backend cannot take or answer requests now (down, spool full); retry later."""


@dataclass(slots=True)
class Point:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    ts: int  # nanoseconds since the Unix epoch, UTC


@dataclass
class WriteResult:
    accepted: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index in batch, reason)


Aggregate = Literal["mean", "min", "max", "sum", "count", "first", "last"]


class Query(BaseModel):
    """A time-range read of one measurement. Times are ns since the epoch; the range is [start, end)."""

    model_config = ConfigDict(extra="forbid")

    measurement: str = Field(min_length=1, max_length=MAX_NAME_LEN)
    start: int = Field(ge=0)
    end: int = Field(gt=0)
    tags: dict[str, list[str]] = Field(default_factory=dict, description="tag key -> accepted values (OR)")
    fields: list[str] | None = Field(None, description="fields to return; all when absent")
    window_ns: int | None = Field(None, gt=0, description="aggregation window; buckets align to the epoch")
    agg: Aggregate | None = None
    limit: int = Field(10_000, ge=1, le=1_000_000, description="rows per series")

    @model_validator(mode="after")
    def _check(self) -> Query:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        if (self.window_ns is None) != (self.agg is None):
            raise ValueError("window_ns and agg go together")
        if self.agg is not None and not self.fields:
            raise ValueError("an aggregation needs an explicit list of fields")
        for key, values in self.tags.items():
            if not values:
                raise ValueError(f"tag filter {key!r} has no values")
        return self


class Series(BaseModel):
    """One series of a result: rows are [time, field1, field2, ...] in the order of `columns`."""

    measurement: str
    tags: dict[str, str]
    columns: list[str]
    values: list[list[FieldValue | None]]


def parse_tag_filters(items: list[str]) -> dict[str, list[str]]:
    """['device=leaf1', 'device=leaf2', 'port=eth1'] -> {'device': ['leaf1', 'leaf2'], 'port': ['eth1']}."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"tag filter {item!r} must look like key=value")
        out.setdefault(key, []).append(value)
    return out


# Control characters, or a backslash at the end or before ',', ' ' or '='.
_BAD_NAME = re.compile(r"[\x00-\x1f]|\\(?:[, =]|$)")
# Names repeat across points (tag keys, field keys, device names): remember the good ones.
_good_names: set[str] = set()


def _check_name(kind: str, name: object) -> str | None:
    if name.__class__ is str and name in _good_names:
        return None
    if not isinstance(name, str) or not name:
        return f"{kind} must be a non-empty string"
    if len(name) > MAX_NAME_LEN:
        return f"{kind} {name[:40]!r}... is longer than {MAX_NAME_LEN} characters"
    if (bad := _BAD_NAME.search(name)) is not None:
        if "\n" in name or "\r" in name:
            return f"{kind} {name!r} contains a newline"
        if bad.group().startswith("\\"):
            return (f"{kind} {name!r} has a backslash at its end or before ',', ' ' or '=' "
                    "(not storable in InfluxDB)")
        return f"{kind} {name!r} contains a control character"
    if len(_good_names) > 100_000:
        _good_names.clear()
    _good_names.add(name)
    return None


_DECLARED: dict[str, dict[str, FieldType]] = {}


def declare_fields(measurement: str, types: Mapping[str, FieldType]) -> None:
    """Fix the stored types of a measurement's fields (the record types do this on definition)."""
    bad = {k: t for k, t in types.items() if t not in _CHECKS}
    if bad:
        raise ValueError(f"unknown field types for {measurement!r}: {bad}")
    _DECLARED.setdefault(measurement, {}).update(types)


def declared_fields(measurement: str) -> Mapping[str, FieldType]:
    """Declared field -> type of a measurement (empty when none are declared)."""
    return _DECLARED.get(measurement, {})


def _check_float(key: str, value: object) -> str | None:
    if value.__class__ is not float:
        return f"field {key!r} is declared float, got {type(value).__name__}"
    if not math.isfinite(value):
        return f"field {key!r}: NaN and infinity cannot be stored"
    return None


def _check_int(key: str, value: object, low: int, high: int, declared: str) -> str | None:
    if value.__class__ is not int:
        return f"field {key!r} is declared {declared}, got {type(value).__name__}"
    if not low <= value <= high:
        return f"field {key!r}: {value} is outside the {declared} 64-bit range"
    return None


_CHECKS: dict[str, Callable[[str, object], str | None]] = {
    "float": _check_float,
    "integer": lambda k, v: _check_int(k, v, INT64_MIN, INT64_MAX, "integer"),
    "unsigned": lambda k, v: _check_int(k, v, 0, UINT64_MAX, "unsigned"),
    "boolean": lambda k, v: None if v.__class__ is bool else f"field {k!r} is declared boolean, got {type(v).__name__}",
    "string": lambda k, v: (f"field {k!r} is declared string, got {type(v).__name__}" if v.__class__ is not str
                            else _check_string(k, v)),
}


def _check_string(key: str, value: str) -> str | None:
    if len(value) > MAX_STRING_FIELD // 4 and len(value.encode()) > MAX_STRING_FIELD:
        return f"field {key!r}: string longer than 64 KiB"
    return None


def validate_point(p: Point) -> str | None:
    """Return why a point cannot be stored, or None. Shared by all backends.

    A declared float field given an integer is converted to a float in place (the declared type
    wins), so that an integer-valued rate can never turn a float field into an integer one; -0.0
    becomes 0.0 in place."""
    if (err := _check_name("measurement", p.measurement)) is not None:
        return err
    if p.measurement.startswith("_"):
        return f"measurement {p.measurement!r} starts with '_' (reserved)"
    if p.measurement.startswith("#"):  # a comment line in InfluxDB line protocol: silently lost
        return f"measurement {p.measurement!r} starts with '#' (a comment in line protocol)"
    if '\\"' in p.measurement:  # InfluxDB 1.x stores it under two different names
        return f"measurement {p.measurement!r} has a backslash before '\"' (not storable in InfluxDB)"
    if not isinstance(p.ts, int) or isinstance(p.ts, bool) or not (0 <= p.ts <= MAX_TIMESTAMP_NS):
        return f"timestamp must be an integer number of nanoseconds since the epoch, 0 to {MAX_TIMESTAMP_NS}"
    for key, tag_value in p.tags.items():
        if (err := _check_name("tag key", key)) is not None:
            return err
        if key in ("time", "_field", "_measurement"):
            return f"tag key {key!r} is reserved"
        if not isinstance(tag_value, str):
            return f"tag {key!r} must be a string"
        if (err := _check_name(f"tag {key!r} value", tag_value)) is not None:
            return err
    if not p.fields:
        return "a point needs at least one field"
    declared = _DECLARED.get(p.measurement, {})
    for key, value in p.fields.items():
        if (err := _check_name("field key", key)) is not None:
            return err
        if key == "time":
            return "field key 'time' is reserved"
        if key in p.tags:
            return f"{key!r} is both a tag and a field"
        if (typ := declared.get(key)) is not None:
            if typ == "float" and value.__class__ is int:
                p.fields[key] = value = float(value)
            if (err := _CHECKS[typ](key, value)) is not None:
                return err
            if value.__class__ is float and value == 0.0:
                p.fields[key] = 0.0  # -0.0: see below
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                return f"field {key!r}: integer outside the signed 64-bit range"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return f"field {key!r}: NaN and infinity cannot be stored"
            if value == 0.0:  # -0.0 is stored as 0.0: DuckDB cannot overwrite a zero with the other one
                p.fields[key] = 0.0
        elif isinstance(value, str):
            if (err := _check_string(key, value)) is not None:
                return err
        else:
            return f"field {key!r}: unsupported type {type(value).__name__}"
    return None


_TYPE_NAMES: dict[type, FieldType] = {bool: "boolean", int: "integer", float: "float", str: "string"}


def type_conflict(measurement: str, key: str, got: str, stored: str, store: str = "the store") -> str:
    """The one wording of a field type conflict, whichever store found it."""
    return f"field {key!r} of measurement {measurement!r} is {got} but {store} stores it as {stored} (type conflict)"


def field_type(measurement: str, key: str, value: FieldValue) -> FieldType:
    """The stored type of a (valid) field: its declared type, else the type of its value."""
    declared = _DECLARED.get(measurement)
    if declared is not None and (typ := declared.get(key)) is not None:
        return typ
    return _TYPE_NAMES[value.__class__]


class TimeSeriesStore(ABC):
    """What the service needs from a telemetry backend. Implementations are thread-safe."""

    name: str = "abstract"

    @abstractmethod
    def write(self, points: list[Point]) -> WriteResult:
        """Store a batch. Bad points are rejected with a reason; good ones in the same batch are kept.
        Raises StoreUnavailable when the batch could not be taken at all (nothing of it was kept)."""

    @abstractmethod
    def query(self, q: Query) -> list[Series]:
        """Rows of q.measurement in [start, end), one Series per tag set, ascending time."""

    @abstractmethod
    def latest(self, measurement: str, tags: dict[str, list[str]] | None = None,
               fields: list[str] | None = None) -> list[Series]:
        """The newest row of each matching series."""

    def flush(self, timeout: float = 10.0) -> bool:
        """Make every accepted write durable (or spooled). True when nothing is left in memory."""
        return True

    def close(self) -> None:  # noqa: B027  (optional: a backend without resources keeps it)
        """Flush and release resources."""

    def stats(self) -> dict[str, float]:
        """Numbers for /metrics and /health (points written, spool bytes, ...)."""
        return {}

    def health(self) -> dict[str, object]:
        return {"backend": self.name, "ok": True}

    def prune(self, older_than_ns: int) -> int:
        """Delete data older than the given time; return rows deleted (backends with own retention: 0)."""
        return 0

    def quarantined(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest points the backend refused for good after accepting them ({ts, reason, line}).
        Backends that judge every point at write() (the embedded store) have none."""
        return []

    def keep_refused(self, refused: list[tuple[Point, str]]) -> int:
        """Keep points write() refused, with their reasons, where quarantined() shows them: for a writer
        whose senders got their answer long before (a cluster's `write` role). Returns how many were
        kept; backends without a quarantine keep none (the caller logs them)."""
        return 0

    def replay_quarantine(self) -> int:
        """Send the quarantined points again (after the operator fixed the cause); return how many."""
        return 0
