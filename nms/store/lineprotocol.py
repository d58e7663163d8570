"""InfluxDB line protocol encoding (nanosecond precision).

Escaping follows what InfluxDB 1.6 actually parses (checked against influxd 1.6.7):
- measurement: ',' and ' ' are escaped; a '"' is left as is (1.6 would unescape '\\"').
- tag keys and values: ',', ' ', '=' are escaped; other backslashes are literal (1.6 does not
  unescape '\\\\' in tags, so they must not be doubled).
- field keys: ',', ' ', '=' and '"' are escaped (1.6 unescapes '\\"' in field keys, so a
  literal backslash before a quote survives only when the quote is escaped).
- string field values: '\\' and '"' are escaped; newlines are allowed raw.
Declared unsigned fields (counters) are written as InfluxDB unsigned integers (`123u`) where the
server has them, else in the signed encoding: the same 64 bits read as a two's-complement integer
(2^64-1 is written -1i), which `unsigned_from_signed` turns back exactly.
Points are assumed valid (nms.store.base.validate_point).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

from nms.store.base import INT64_MAX, FieldValue, Point, declared_fields

_TWO_64 = 1 << 64

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


def signed_from_unsigned(value: int) -> int:
    return value - _TWO_64 if value > INT64_MAX else value


def unsigned_from_signed(value: int) -> int:
    return value + _TWO_64 if value < 0 else value


def encode_point(p: Point, u_fields: Collection[str] = ()) -> str:
    """One line (without the trailing newline). Tags are sorted by key, as InfluxDB prefers.
    Declared unsigned fields named in `u_fields` are written as `Nu`, the others signed-encoded."""
    parts = [p.measurement.translate(_MEASUREMENT)]
    for key in sorted(p.tags):
        parts.append(f",{key.translate(_TAG)}={p.tags[key].translate(_TAG)}")
    declared = declared_fields(p.measurement)
    fields = []
    for k, v in p.fields.items():
        if declared.get(k) == "unsigned":
            # a valid point's declared unsigned field holds an int (validate_point)
            value = f"{v}u" if k in u_fields else f"{signed_from_unsigned(cast(int, v))}i"
        else:
            value = format_value(v)
        fields.append(f"{k.translate(_FIELD_KEY)}={value}")
    return f"{''.join(parts)} {','.join(fields)} {p.ts}"


def encode_batch(points: list[Point]) -> bytes:
    """A /write body."""
    return "".join(encode_point(p) + "\n" for p in points).encode()


# --- reading our own lines back (to find which points of a refused batch the server named) ------

def _value_type(raw: str) -> str:
    if raw.startswith('"'):
        return "string"
    if raw[-1] == "i":
        return "integer"
    if raw[-1] == "u":
        return "unsigned"
    if raw in ("t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"):
        return "boolean"
    return "float"


def parse_line(text: str, pos: int = 0) -> tuple[int, str, dict[str, str]]:
    """Scan one line of a batch this module encoded, from pos: (position after its newline,
    measurement, field key -> type). A string value may hold raw newlines, so lines cannot be
    found by splitting on them."""
    n = len(text)
    i = pos
    name: list[str] = []
    while i < n and text[i] not in ", ":  # measurement: ',' and ' ' escaped
        if text[i] == "\\" and i + 1 < n and text[i + 1] in ", ":
            i += 1
        name.append(text[i])
        i += 1
    while i < n and text[i] != " ":  # tags: ',', ' ', '=' escaped
        i += 2 if text[i] == "\\" and i + 1 < n and text[i + 1] in ", =" else 1
    fields: dict[str, str] = {}
    while i < n and text[i] in " ,":
        i += 1
        key: list[str] = []
        while i < n and text[i] != "=":  # field key: ',', ' ', '=', '"' escaped
            if text[i] == "\\" and i + 1 < n and text[i + 1] in ', ="':
                i += 1
            key.append(text[i])
            i += 1
        start = i = i + 1
        if i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            while i < n and text[i] not in ", ":
                i += 1
        fields["".join(key)] = _value_type(text[start:i])
        if i < n and text[i] == " ":
            break
    end = text.find("\n", i)
    return (n if end < 0 else end + 1), "".join(name), fields


def split_batch(body: bytes) -> list[bytes]:
    """The lines of a /write body this module encoded (each without its newline)."""
    text = body.decode()
    lines, pos = [], 0
    while pos < len(text):
        end, _, _ = parse_line(text, pos)
        line = text[pos:end].rstrip("\n")
        if line:
            lines.append(line.encode())
        pos = end
    return lines
