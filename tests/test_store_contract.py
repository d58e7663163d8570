"""The store contract: the same tests pass on the embedded (DuckDB) and InfluxDB backends."""

from __future__ import annotations

import pytest

from nms.store import Point, Query, TimeSeriesStore
from nms.store.embedded import EmbeddedStore

S = 10**9  # one second in ns
T0 = 1_700_000_000 * S


@pytest.fixture(params=["embedded", "influxdb"])
def store(request, tmp_path) -> TimeSeriesStore:
    if request.param == "embedded":
        s = EmbeddedStore(tmp_path / "t.duckdb")
        yield s
        s.close()
    else:
        yield request.getfixturevalue("influx_store")


def _write(store: TimeSeriesStore, points: list[Point]):
    result = store.write(points)
    assert store.flush(timeout=10)
    return result


def _rows(series) -> dict[tuple, list]:
    return {tuple(sorted(s.tags.items())): s.values for s in series}


def test_round_trip_of_every_field_type(store):
    fields = {"f": 1.0, "neg": -2.5, "big": 1e300, "i": 42, "imin": -(1 << 63), "imax": (1 << 63) - 1,
              "yes": True, "no": False, "s": "hello", "empty": ""}
    _write(store, [Point("types", {"dev": "a"}, fields, T0)])
    [series] = store.query(Query(measurement="types", start=T0, end=T0 + 1))
    row = dict(zip(series.columns, series.values[0]))
    assert row.pop("time") == T0
    assert row == fields
    for key, value in fields.items():
        assert type(row[key]) is type(value), key


def test_bad_points_rejected_with_reasons_and_good_ones_kept(store):
    points = [
        Point("m", {"dev": "a"}, {"v": 1.0}, T0),
        Point("m", {"dev": "a\nb"}, {"v": 1.0}, T0 + 1),  # newline in a tag value
        Point("bad\nname", {}, {"v": 1.0}, T0),
        Point("m", {"dev": "b"}, {}, T0),  # no fields
        Point("m", {"dev": "c"}, {"v": float("nan")}, T0),
        Point("m", {"dev": "d"}, {"v": 2.0}, T0 + 2),
    ]
    result = _write(store, points)
    assert result.accepted == 2
    reasons = dict(result.rejected)
    assert sorted(reasons) == [1, 2, 3, 4]
    assert "newline" in reasons[1] and "newline" in reasons[2]
    assert "field" in reasons[3] and "NaN" in reasons[4]
    got = _rows(store.query(Query(measurement="m", start=T0, end=T0 + 10)))
    assert got == {(("dev", "a"),): [[T0, 1.0]], (("dev", "d"),): [[T0 + 2, 2.0]]}


def test_field_type_conflict_is_rejected(store):
    _write(store, [Point("conf", {"dev": "a"}, {"v": 1.0}, T0)])
    result = _write(store, [Point("conf", {"dev": "a"}, {"v": "text"}, T0 + 1),
                            Point("conf", {"dev": "a"}, {"v": 3.0}, T0 + 2)])
    assert result.accepted == 1
    [(index, reason)] = result.rejected
    assert index == 0 and "type" in reason
    [series] = store.query(Query(measurement="conf", start=T0, end=T0 + 10))
    assert series.values == [[T0, 1.0], [T0 + 2, 3.0]]


def test_same_series_and_time_merges_instead_of_duplicating(store):
    _write(store, [Point("dup", {"dev": "a"}, {"x": 1.0}, T0)])
    _write(store, [Point("dup", {"dev": "a"}, {"x": 1.0}, T0)])  # a replayed batch
    _write(store, [Point("dup", {"dev": "a"}, {"y": 2}, T0)])  # another field, same point
    [series] = store.query(Query(measurement="dup", start=T0, end=T0 + 1))
    assert series.columns == ["time", "x", "y"]
    assert series.values == [[T0, 1.0, 2]]


def test_tag_filters_or_within_a_key_and_across_keys(store):
    points = [Point("tf", {"dev": d, "port": p}, {"v": float(i)}, T0 + i)
              for i, (d, p) in enumerate([("l1", "e1"), ("l1", "e2"), ("l2", "e1"), ("l3", "e1")])]
    _write(store, points)
    got = _rows(store.query(Query(measurement="tf", start=T0, end=T0 + 10,
                                  tags={"dev": ["l1", "l2"], "port": ["e1"]})))
    assert got == {(("dev", "l1"), ("port", "e1")): [[T0, 0.0]], (("dev", "l2"), ("port", "e1")): [[T0 + 2, 2.0]]}
    assert store.query(Query(measurement="tf", start=T0, end=T0 + 10, tags={"nosuchtag": ["x"]})) == []
    assert store.query(Query(measurement="no_such_measurement", start=T0, end=T0 + 10)) == []


def test_time_range_is_half_open_and_limit_is_per_series(store):
    _write(store, [Point("tr", {"dev": d}, {"v": float(i)}, T0 + i * S) for d in ("a", "b") for i in range(10)])
    got = _rows(store.query(Query(measurement="tr", start=T0 + 2 * S, end=T0 + 5 * S)))
    assert [row[0] for row in got[(("dev", "a"),)]] == [T0 + 2 * S, T0 + 3 * S, T0 + 4 * S]
    limited = _rows(store.query(Query(measurement="tr", start=T0, end=T0 + 10 * S, limit=2)))
    assert {k: len(v) for k, v in limited.items()} == {(("dev", "a"),): 2, (("dev", "b"),): 2}


def test_field_selection(store):
    _write(store, [Point("fs", {"dev": "a"}, {"x": 1.0, "y": 2.0, "z": "s"}, T0)])
    [series] = store.query(Query(measurement="fs", start=T0, end=T0 + 1, fields=["z", "x"]))
    assert series.columns == ["time", "z", "x"]
    assert series.values == [[T0, "s", 1.0]]


@pytest.mark.parametrize("agg,expected", [
    ("mean", [[T0, 1.5], [T0 + 10 * S, 12.0]]),
    ("max", [[T0, 3.0], [T0 + 10 * S, 14.0]]),
    ("min", [[T0, 0.0], [T0 + 10 * S, 10.0]]),
    ("sum", [[T0, 6.0], [T0 + 10 * S, 60.0]]),
    ("count", [[T0, 4], [T0 + 10 * S, 5]]),
    ("first", [[T0, 0.0], [T0 + 10 * S, 10.0]]),
    ("last", [[T0, 3.0], [T0 + 10 * S, 14.0]]),
])
def test_windowed_aggregation(store, agg, expected):
    # Values 0..3 in the first 10 s bucket, 10..14 in the second; nothing in the third.
    times = [0, 2, 4, 6, 10, 11, 12, 13, 14]
    values = [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0, 14.0]
    _write(store, [Point("agg", {"dev": "a"}, {"v": v}, T0 + t * S) for t, v in zip(times, values)])
    _write(store, [Point("agg", {"dev": "b"}, {"v": 100.0}, T0)])
    series = store.query(Query(measurement="agg", start=T0, end=T0 + 30 * S, fields=["v"],
                               window_ns=10 * S, agg=agg, tags={"dev": ["a"]}))
    assert len(series) == 1 and series[0].tags == {"dev": "a"}
    assert series[0].columns == ["time", "v"]
    assert series[0].values == expected


def test_latest_gives_newest_row_per_series(store):
    _write(store, [Point("lt", {"dev": d}, {"v": float(i), "n": i}, T0 + i) for d in ("a", "b") for i in range(5)])
    _write(store, [Point("lt", {"dev": "c"}, {"n": 7}, T0)])
    got = _rows(store.latest("lt", fields=["v"]))
    assert got == {(("dev", "a"),): [[T0 + 4, 4.0]], (("dev", "b"),): [[T0 + 4, 4.0]]}
    got = _rows(store.latest("lt", tags={"dev": ["c"]}))
    assert got == {(("dev", "c"),): [[T0, 7, None]]}
    assert store.latest("nothing_here") == []


def test_hostile_names_and_values_survive(store):
    tags = {"tag with space": "a b", "comma,key": "c,d", "eq=key": "e=f", "quote\"key": "say \"hi\"",
            "unicode": "Grüße, 東京 🚀", "path": "C:\\temp\\x", "single'q": "it's"}
    fields = {"field with space": 1.0, "comma,field": 2, "s": 'quotes " and \\ backslash\\',
              "multi": "line1\nline2", "ü": True}
    measurement = "hostile meas,ure=ment"
    _write(store, [Point(measurement, tags, fields, T0)])
    [series] = store.query(Query(measurement=measurement, start=T0, end=T0 + 1, tags={"unicode": [tags["unicode"]]}))
    assert series.tags == tags
    assert dict(zip(series.columns[1:], series.values[0][1:])) == fields
