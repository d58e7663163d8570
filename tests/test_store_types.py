"""Field types that never change, on both backends (issue: a counter past 2^63 turned the field
to float and every later write of it was refused).

- every record type with boundary values (0, 2^32-1, 2^63-1, 2^63, 2^64-1, the integer and float
  extremes, -0.0 (stored as 0.0), unicode and escaping in tags and strings) is written and read back exactly, and
  its fields keep their declared types across writes: hypothesis, against a real influxd 1.6 and
  the embedded DuckDB store;
- generic points: whatever the embedded store accepts, InfluxDB stores and returns alike;
- a batch InfluxDB refuses in part (type conflict, beyond retention) loses nothing: the refused
  points are quarantined with the reason, the others land, and the quarantine can be replayed;
- an embedded file an earlier version wrote (counters as BIGINT, or DOUBLE after the bug) is
  converted in place, and InfluxDB float columns of counters read back as integers.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from nms.config.models import InfluxStoreConfig
from nms.records import INGEST_KINDS, DeviceFacts, InterfaceAddress, LinkEvent, LldpNeighbor, NcclStepStats, PortSample
from nms.store.base import INT64_MAX, INT64_MIN, MAX_TIMESTAMP_NS, UINT64_MAX, Point, Query, declared_fields
from nms.store.embedded import EmbeddedStore, series_key
from nms.store.influx import InfluxStore

S = 10**9
T0 = 1_700_000_000 * S
RECORDS = [cls for cls in INGEST_KINDS.values() if hasattr(cls, "tag_keys")] + [
    LinkEvent, LldpNeighbor, DeviceFacts, InterfaceAddress]
# What InfluxDB 1.6 (no unsigned integers) calls each declared type.
SERVER_TYPE = {"unsigned": "integer", "integer": "integer", "float": "float", "boolean": "boolean",
               "string": "string"}
# No shrinking: a failure prints its example at once (shrinking records of a dozen kinds takes
# minutes). NMS_TYPES_EXAMPLES raises the budget for a longer hunt.
HYPOTHESIS = settings(max_examples=int(os.environ.get("NMS_TYPES_EXAMPLES", "25")), deadline=None,
                      suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                      phases=[Phase.explicit, Phase.reuse, Phase.generate])


# --- stores -------------------------------------------------------------------------------------

def open_store(backend: str, influxd=None, directory: Path | None = None, **kw):
    directory = directory or Path(tempfile.mkdtemp(prefix="nms-types-"))
    if backend == "embedded":
        return EmbeddedStore(directory / "t.duckdb")
    cfg = InfluxStoreConfig(url=influxd.url, database=f"t_{uuid.uuid4().hex[:12]}",
                            **{"flush_interval": 0.05, "timeout": 2.0, **kw})
    return InfluxStore(cfg, directory)


@pytest.fixture(params=["embedded", "influxdb"])
def backend(request):
    influxd = request.getfixturevalue("influxd") if request.param == "influxdb" else None
    return request.param, influxd


def written(store, points: list[Point]):
    result = store.write(points)
    assert store.flush(timeout=10)
    return result


def read_row(store, p: Point) -> dict:
    series = store.query(Query(measurement=p.measurement, start=p.ts, end=p.ts + 1,
                               tags={k: [v] for k, v in p.tags.items()}))
    [s] = [s for s in series if s.tags == p.tags]
    [row] = s.values
    return {k: v for k, v in zip(s.columns, row) if k != "time" and v is not None}


def assert_exact(got: dict, want: dict) -> None:
    assert got.keys() == want.keys(), (got, want)
    for key, value in want.items():
        assert type(got[key]) is type(value), (key, got[key], value)
        assert repr(got[key]) == repr(value), (key, got[key], value)  # repr: -0.0 and every float bit


# --- strategies from the records' own schemas ----------------------------------------------------

# Tags and strings: unicode, line-protocol specials (',', ' ', '=', '"'), no control characters or
# backslashes (the Ident pattern refuses them in identifiers).
IDENT = st.text(st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="\\"), min_size=1, max_size=24)
SPECIALS = st.sampled_from([",", " ", "=", '"', "\\", "\n", "'", "é", "日本", "🚀", "\u2028", "a\\", "\\\\\""])
TEXT = st.lists(st.one_of(SPECIALS, st.text(st.characters(exclude_categories=("Cs",)), max_size=8)),
                max_size=6).map("".join)


def _int_strategy(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, 2**32 - 1, 2**32, 2**53 + 1, INT64_MAX, 2**63, UINT64_MAX - 1, UINT64_MAX,
                         INT64_MIN, -1, low, high) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e308, 1.7976931348623157e308,
                                    -1.7976931348623157e308, 1 / 3, 2.0**63, 2.0**64, 123456789.0]),
                   st.floats(allow_nan=False, allow_infinity=False))


def _value_strategy(prop: dict) -> st.SearchStrategy:
    option = next(o for o in prop.get("anyOf", [prop]) if o.get("type") != "null")
    if "enum" in option:
        return st.sampled_from(option["enum"])
    kind = option.get("type")
    if kind == "integer":
        # Optional annotated ints keep pydantic's own "ge"/"le" keys in the schema.
        return _int_strategy(option.get("minimum", option.get("ge", INT64_MIN)),
                             option.get("maximum", option.get("le", INT64_MAX)))
    if kind == "number":
        low = option.get("minimum", option.get("exclusiveMinimum"))
        floats = FLOATS.filter(lambda v: low is None or v > low or (v == low and "minimum" in option))
        return floats.map(lambda v: abs(v) if low is not None and low >= 0 else v)
    if kind == "boolean":
        return st.booleans()
    shortest, longest = option.get("minLength", 0), min(option.get("maxLength", 1000), 64)
    text = st.from_regex(option["pattern"], fullmatch=True) if "pattern" in option else TEXT  # e.g. a rank number
    return text.filter(lambda v: shortest <= len(v) <= longest)


@functools.cache
def _field_strategies(cls) -> dict[str, st.SearchStrategy]:
    """Each field's strategy, built once per record type (building them per draw was half the
    test's time)."""
    props = cls.model_json_schema()["properties"]
    out = {}
    for name in cls.model_fields:
        if name in cls.tag_keys or name == cls.time_attr:
            option = next(o for o in props[name].get("anyOf", [props[name]]) if o.get("type") != "null")
            choices = option.get("enum") or (["10.0.0.1", "fe80::1"] if name == "address" else None)
            out[name] = (st.sampled_from(choices) if choices else
                         _value_strategy(props[name]) if "pattern" in option else IDENT)
        else:
            out[name] = _value_strategy(props[name])
    return out


@st.composite
def records(draw, cls):
    strategies = _field_strategies(cls)
    data = {}
    for name in cls.model_fields:
        if name in cls.tag_keys or name == cls.time_attr or cls.model_fields[name].is_required() or draw(st.booleans()):
            data[name] = draw(strategies[name])
    values = [n for n in cls.model_fields if n not in cls.tag_keys and n != cls.time_attr]
    if all(data.get(n) is None for n in values):  # a point needs at least one field
        name = draw(st.sampled_from(values))
        data[name] = draw(strategies[name])
    data[cls.time_attr] = draw(st.one_of(st.sampled_from([0, 1, T0, MAX_TIMESTAMP_NS - 1]),
                                         st.integers(0, MAX_TIMESTAMP_NS - 1)))
    if "sent" in data:  # ProbeWindow: received <= sent, pure_pairs <= pairs
        data["received"] = min(data["received"], data["sent"])
        if data.get("pure_pairs") is not None and data.get("pairs") is not None:
            data["pure_pairs"] = min(data["pure_pairs"], data["pairs"])
    if cls is NcclStepStats and data["stop_ns"] <= data["start_ns"]:  # a second that ends after it starts
        low, high = sorted((data["start_ns"], data["stop_ns"]))
        data["start_ns"], data["stop_ns"] = (low - 1, high) if low == high and low > 0 else (low, high + (low == high))
    if data.get("counter_bits") == 32:  # PortSample: 32-bit octet and packet counters fit in 32 bits
        for name in cls.traffic_counters:
            if data.get(name) is not None:
                data[name] &= 2**32 - 1
    return cls.model_validate(data)


ALL_RECORDS = st.tuples(*(records(cls) for cls in RECORDS))


def server_field_types(store: InfluxStore, measurement: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in store._run_query(f'SHOW FIELD KEYS FROM "{measurement}"'):
        for key, typ in s["values"]:
            out.setdefault(key, []).append(typ)
    return out


# --- every record type, boundary values, both backends -------------------------------------------

@pytest.mark.influx
def test_every_record_type_round_trips_exactly_and_keeps_its_types(backend):
    name, influxd = backend

    @HYPOTHESIS
    @given(first=ALL_RECORDS, second=ALL_RECORDS)
    def check(first, second):
        store = open_store(name, influxd)
        try:
            rows: dict[tuple, dict] = {}  # a point at the time and series of an earlier one merges into it
            for batch in (first, second):  # the second batch meets the types the first one set
                points = [r.to_point() for r in batch]
                result = written(store, points)
                assert result.rejected == [] and result.accepted == len(points)
                for record, point in zip(batch, points):
                    key = (point.measurement, tuple(sorted(point.tags.items())), point.ts)
                    want = rows.setdefault(key, {})
                    # As written, before any store touched it; -0.0 is stored as 0.0 (a documented rule).
                    want.update({k: 0.0 if v == 0.0 and type(v) is float else v
                                 for k, v in record.to_point().fields.items()})
                    assert_exact(read_row(store, point), want)
            if name == "influxdb":
                assert store.stats()["quarantine_points"] == 0
                for cls in RECORDS:
                    types = server_field_types(store, cls.measurement)
                    for key, typ in types.items():
                        assert typ == [SERVER_TYPE[declared_fields(cls.measurement)[key]]], (cls.measurement, key)
        finally:
            store.close()

    check()


@pytest.mark.influx
def test_the_issue_counter_past_2_63_stays_an_integer(backend):
    """POST /ingest/port_samples with in_octets 2^64-1 among ordinary ones, then 12345: both kept,
    both exact, the field still an integer."""
    name, influxd = backend
    store = open_store(name, influxd)
    try:
        batch = [PortSample(device="leaf1", port="swp1", ts=T0 + i, in_octets=v).to_point()
                 for i, v in enumerate([UINT64_MAX, 5, 2**63, INT64_MAX])]
        assert written(store, batch).accepted == 4
        later = PortSample(device="leaf1", port="swp1", ts=T0 + 10, in_octets=12345).to_point()
        assert written(store, [later]).rejected == []
        [series] = store.query(Query(measurement="port_counters", start=T0, end=T0 + 20, fields=["in_octets"]))
        assert series.values == [[T0, UINT64_MAX], [T0 + 1, 5], [T0 + 2, 2**63], [T0 + 3, INT64_MAX],
                                 [T0 + 10, 12345]]
        [latest] = store.latest("port_counters", fields=["in_octets"])
        assert latest.values == [[T0 + 10, 12345]]
        [agg] = store.query(Query(measurement="port_counters", start=T0, end=T0 + 20, fields=["in_octets"],
                                  window_ns=S, agg="last"))
        assert agg.values == [[T0, 12345]]
        if name == "influxdb":
            assert server_field_types(store, "port_counters") == {"in_octets": ["integer"]}
    finally:
        store.close()


@pytest.mark.influx
def test_nan_and_infinity_are_refused_alike_with_a_reason(backend):
    name, influxd = backend
    store = open_store(name, influxd)
    try:
        points = [Point("port_rates", {"device": "a", "port": "p"}, {"interval_s": 1.0, "in_bps": v}, T0 + i)
                  for i, v in enumerate([math.nan, math.inf, -math.inf, 2.0])]
        points.append(Point("port_counters", {"device": "a", "port": "p"}, {"in_octets": -1}, T0))
        points.append(Point("port_counters", {"device": "a", "port": "p"}, {"in_octets": 1.5}, T0 + 1))
        points.append(Point("port_rates", {"device": "a", "port": "p"}, {"interval_s": 2}, T0 + 9))
        result = written(store, points)
        reasons = dict(result.rejected)
        assert sorted(reasons) == [0, 1, 2, 4, 5] and result.accepted == 2
        assert all("NaN and infinity" in reasons[i] for i in (0, 1, 2))
        assert "outside the unsigned 64-bit range" in reasons[4]
        assert "declared unsigned, got float" in reasons[5]
        # A float field given an integer stores a float: the field's type cannot flip.
        assert_exact(read_row(store, points[6]), {"interval_s": 2.0})
    finally:
        store.close()


# --- generic points: InfluxDB stores whatever the embedded store accepts --------------------------

GENERIC_VALUES = st.one_of(st.booleans(), _int_strategy(INT64_MIN, INT64_MAX), FLOATS, TEXT)


@st.composite
def generic_batches(draw):
    measurement = "g" + draw(IDENT)
    tag_keys = draw(st.lists(IDENT, max_size=3, unique=True))
    points = []
    for i in range(draw(st.integers(1, 4))):
        fields = draw(st.dictionaries(IDENT.filter(lambda k: k not in tag_keys and k != "time"),
                                      GENERIC_VALUES, min_size=1, max_size=4))
        points.append(Point(measurement, {k: draw(IDENT) for k in tag_keys}, fields, T0 + i))
    return points


@pytest.mark.influx
def test_influxdb_stores_what_the_embedded_store_accepts(influxd):
    @HYPOTHESIS
    @given(batch=generic_batches())
    def check(batch):
        embedded, influx = open_store("embedded"), open_store("influxdb", influxd)
        try:
            copy = [Point(p.measurement, dict(p.tags), dict(p.fields), p.ts) for p in batch]
            got_e, got_i = written(embedded, batch), written(influx, copy)
            assert got_e.rejected == got_i.rejected  # the same points, for the same reasons
            assert influx.stats()["quarantine_points"] == 0, influx.quarantined()
            rejected = {i for i, _ in got_e.rejected}
            for i, p in enumerate(batch):
                if i not in rejected:
                    assert_exact(read_row(influx, p), read_row(embedded, p))
        finally:
            embedded.close()
            influx.close()

    check()


# --- refused by InfluxDB: quarantined, never dropped ---------------------------------------------

@pytest.mark.influx
def test_a_type_conflict_quarantines_only_its_points(influxd, tmp_path, caplog):
    store = open_store("influxdb", influxd, tmp_path)
    db = store.cfg.database
    try:
        assert store.flush(5)
        store._ensure_database_once()
        # Another writer (an older version, another tool) made in_octets a float in this shard
        # (InfluxDB 1.x keeps a field's type per shard: a week by default).
        r = httpx.post(f"{influxd.url}/write", params={"db": db},
                       content=f"port_counters,device=old,port=p in_octets=1.8446744073709552e19 {T0 - 1}\n".encode())
        assert r.status_code == 204
        good = [PortSample(device="leaf1", port="swp1", ts=T0 + i, out_octets=i).to_point() for i in range(5)]
        bad = [PortSample(device="leaf1", port="swp2", ts=T0 + i, in_octets=10 + i, out_octets=i).to_point()
               for i in range(3)]
        other = [Point("other", {"d": "x"}, {"v": 1.5}, T0)]
        with caplog.at_level(logging.WARNING, logger="nms.store.influx"):
            result = written(store, good[:2] + bad + good[2:] + other)
        assert result.accepted == 9 and result.rejected == []  # judged by InfluxDB, not the caller
        stats = store.stats()
        assert stats["points_quarantined"] == 3 and stats["quarantine_points"] == 3, stats
        assert stats["points_written"] == 6 and stats["spool_segments"] == 0
        assert ("field 'in_octets' of measurement 'port_counters' is integer but InfluxDB stores it as float "
                "(type conflict)") in caplog.text
        entries = store.quarantined()
        assert len(entries) == 3 and all("type conflict" in e["reason"] for e in entries)
        assert {e["line"].split(" ")[0] for e in entries} == {"port_counters,device=leaf1,port=swp2"}
        rows = store.query(Query(measurement="port_counters", start=T0, end=T0 + 10, fields=["out_octets"],
                                 tags={"port": ["swp1"]}))
        assert rows[0].values == [[T0 + i, i] for i in range(5)]
        assert store.query(Query(measurement="other", start=T0, end=T0 + 1))[0].values == [[T0, 1.5]]
        # The old float row reads back as the exact counter it stood for (2^64 rounded: 2^64-1).
        assert store.latest("port_counters", tags={"device": ["old"]})[0].values[0][1:] == [UINT64_MAX, None]
        assert store.health()["quarantine"]["points"] == 3

        # The operator drops the measurement holding the wrong type, then replays.
        influxd.query('DROP MEASUREMENT "port_counters"', db=db)
        store._types.clear()
        store._types_loaded.clear()
        assert store.replay_quarantine() == 3
        assert store.drain(10)
        assert store.stats()["quarantine_points"] == 0
        [series] = store.query(Query(measurement="port_counters", start=T0, end=T0 + 10, fields=["in_octets"]))
        assert series.values == [[T0 + i, 10 + i] for i in range(3)]
    finally:
        store.close()


@pytest.mark.influx
def test_points_beyond_retention_are_found_by_halving_and_kept(influxd, tmp_path):
    """InfluxDB names no point when it drops those beyond retention: halves are re-sent until each
    refused point stands alone; the others land once (a re-sent point overwrites itself)."""
    store = open_store("influxdb", influxd, tmp_path, retention_policy="hour")
    db = store.cfg.database
    try:
        store._ensure_database_once()
        influxd.query(f'CREATE RETENTION POLICY "hour" ON "{db}" DURATION 1h REPLICATION 1', db=db)
        import time
        now = time.time_ns()
        points = [Point("ret", {"i": str(i)}, {"v": i}, now - (3 * 3600 * S if i in (3, 11) else i * S))
                  for i in range(16)]
        assert written(store, points).accepted == 16
        stats = store.stats()
        assert stats["quarantine_points"] == 2 and stats["points_written"] == 14
        assert all("beyond retention" in e["reason"] for e in store.quarantined())
        assert {e["line"].split(" ")[0] for e in store.quarantined()} == {"ret,i=3", "ret,i=11"}
        series = store.query(Query(measurement="ret", start=now - 3600 * S, end=now + S))
        assert sorted(int(s.tags["i"]) for s in series) == [i for i in range(16) if i not in (3, 11)]
        assert all(len(s.values) == 1 for s in series)
    finally:
        store.close()


@pytest.mark.influx
def test_the_quarantine_survives_a_restart_and_is_bounded(influxd, tmp_path, caplog):
    store = open_store("influxdb", influxd, tmp_path, quarantine_max_bytes=4000)
    try:
        store._quarantine.add([b"m v=1i 1"], "first reason")
        store.close()
        store = open_store("influxdb", influxd, tmp_path, quarantine_max_bytes=4000)
        assert store.stats()["quarantine_points"] == 1
        assert store.quarantined()[0]["reason"] == "first reason"
        with caplog.at_level(logging.ERROR, logger="nms.store.quarantine"):
            for i in range(100):
                store._quarantine.add([f"m v={i}i {i}".encode()], "filler")
        assert store.stats()["quarantine_bytes"] <= 4000
        assert store.health()["quarantine"]["dropped"] > 0 and "oldest points were deleted" in caplog.text
        assert store.quarantined(1)[0]["line"] == "m v=99i 99"  # the newest are kept
    finally:
        store.close()


# --- unsigned integers where the server has them -------------------------------------------------

class _UnsignedInflux(BaseHTTPRequestHandler):
    """Answers as InfluxDB 1.8+/2.x's 1.x API does where it matters here: the capability probe
    parses (its time is out of range), writes are taken and kept."""

    bodies: list[bytes] = []

    def do_GET(self):  # /ping
        self.send_response(204)
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/write"):
            if b"nms_capability_probe" in body:
                return self._answer(400, {"error": "unable to parse '...': time outside range"})
            self.bodies.append(body)
            self.send_response(204)
            return self.end_headers()
        return self._answer(200, {"results": [{"statement_id": 0}]})

    def _answer(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_counters_are_written_unsigned_where_the_server_takes_them(tmp_path):
    """No InfluxDB with unsigned integers runs here (Debian's 1.6 has none): a stand-in on loopback
    answers the capability probe as they do."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _UnsignedInflux)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = InfluxStoreConfig(url=f"http://127.0.0.1:{server.server_port}", database="d", gzip=False,
                            flush_interval=0.05)
    store = InfluxStore(cfg, tmp_path)
    try:
        store.write([PortSample(device="a", port="b", ts=T0, in_octets=UINT64_MAX, mtu=9000).to_point()])
        assert store.flush(5) and store.stats()["points_written"] == 1
        sent = b"".join(_UnsignedInflux.bodies)
        assert b"in_octets=18446744073709551615u" in sent and b"mtu=9000i" in sent
        assert store.health()["unsigned_integers"] is True
        assert (tmp_path / "spool" / "capabilities.json").read_text() == '{"unsigned": true}'
    finally:
        store.close()
        server.shutdown()


@pytest.mark.influx
def test_influxdb_1_6_gets_the_signed_encoding(influxd, tmp_path):
    store = open_store("influxdb", influxd, tmp_path)
    try:
        written(store, [PortSample(device="a", port="b", ts=T0, in_octets=UINT64_MAX).to_point()])
        assert store.health()["unsigned_integers"] is False
        raw = influxd.query('SELECT in_octets FROM port_counters', db=store.cfg.database)
        assert raw["results"][0]["series"][0]["values"] == [[T0, -1]]  # the same 64 bits, signed
        assert server_field_types(store, "nms_capability_probe") == {}  # the probe wrote nothing
    finally:
        store.close()


# --- embedded files written by earlier versions ---------------------------------------------------

def test_an_embedded_file_from_an_earlier_version_is_converted(tmp_path):
    path = tmp_path / "t.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE _measurements (name VARCHAR PRIMARY KEY, tbl VARCHAR)")
    con.execute("CREATE TABLE _columns (tbl VARCHAR, kind VARCHAR, key VARCHAR, col VARCHAR, type VARCHAR)")
    con.execute("CREATE TABLE m0 (time BIGINT NOT NULL, sk UBIGINT NOT NULL, PRIMARY KEY (sk, time))")
    con.execute("INSERT INTO _measurements VALUES ('port_counters', 'm0')")
    for col, key, typ, sql in [("c0", "device", "string", "VARCHAR"), ("c1", "port", "string", "VARCHAR"),
                               ("c2", "in_octets", "float", "DOUBLE"), ("c3", "out_octets", "integer", "BIGINT")]:
        con.execute(f"ALTER TABLE m0 ADD COLUMN {col} {sql}")
        con.execute("INSERT INTO _columns VALUES ('m0', ?, ?, ?, ?)", ["t" if typ == "string" else "f", key, col, typ])
    sk = series_key({"device": "a", "port": "p"})
    con.execute("INSERT INTO m0 VALUES (?, ?, 'a', 'p', 1.8446744073709552e19, 7), (?, ?, 'a', 'p', 12345.0, 8)",
                [T0, sk, T0 + 1, sk])
    con.close()

    store = EmbeddedStore(path)
    try:
        later = PortSample(device="a", port="p", ts=T0 + 2, in_octets=UINT64_MAX - 1, out_octets=2**63).to_point()
        assert written(store, [later]).rejected == []
        [series] = store.query(Query(measurement="port_counters", start=T0, end=T0 + 10))
        assert series.values == [[T0, UINT64_MAX, 7], [T0 + 1, 12345, 8], [T0 + 2, UINT64_MAX - 1, 2**63]]
    finally:
        store.close()
