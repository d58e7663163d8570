"""InfluxDB line protocol encoding (nanosecond precision).

Escaping follows what InfluxDB 1.6 actually parses (checked against influxd 1.6.7):
- measurement: ',' and ' ' are escaped; a '"' is left as is (1.6 would unescape '\\"').
- tag keys and values: ',', ' ', '=' are escaped; other backslashes are literal (1.6 does not
  unescape '\\\\' in tags, so they must not be doubled).
- field keys: ',', ' ', '=' and '"' are escaped (1.6 unescapes '\\"' in field keys, so a
  literal backslash before a quote survives only when the quote is escaped).
- string field values: '\\' and '"' are escaped; newlines are allowed raw.
Points are assumed valid (nms.store.base.validate_point).
"""

from __future__ import annotations

from nms.store.base import FieldValue, Point

_MEASUREMENT = str.maketrans({",": r"\,", " ": r"\ "})
_TAG = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\="})
_FIELD_KEY = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\=", '"': r"\""})
_STRING = str.maketrans({"\\": "\\\\", '"': r"\""})


def format_value(value: FieldValue) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        # repr() is the shortest exact form and always reads back as a float ("1.0", "1e+300").
        return repr(value)
    return '"' + value.translate(_STRING) + '"'


def encode_point(p: Point) -> str:
    """One line (without the trailing newline). Tags are sorted by key, as InfluxDB prefers."""
    parts = [p.measurement.translate(_MEASUREMENT)]
    for key in sorted(p.tags):
        parts.append(f",{key.translate(_TAG)}={p.tags[key].translate(_TAG)}")
    fields = ",".join(f"{k.translate(_FIELD_KEY)}={format_value(v)}" for k, v in p.fields.items())
    return f"{''.join(parts)} {fields} {p.ts}"


def encode_batch(points: list[Point]) -> bytes:
    """A /write body."""
    return "".join(encode_point(p) + "\n" for p in points).encode()
