"""The InfluxDB backend against a real influxd 1.6 (Debian package influxdb): encoding, types,
queries, auth, and no loss / no duplicates across outages and restarts."""

from __future__ import annotations

import http.server
import logging
import math
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from _influx import INFLUXD, SKIP_REASON, InfluxServer, free_port

from nms.config.models import InfluxStoreConfig, NmsConfig
from nms.store.base import Point, Query, StoreError, StoreUnavailable
from nms.store.influx import InfluxStore, read_ledger
from nms.store.lineprotocol import encode_point
from nms.store.spool import Spool, SpoolFull
from tests.helpers import wait_until

pytestmark = pytest.mark.influx

S = 10**9
T0 = 1_700_000_000 * S
PASSWORD = "S3cret-Passw0rd!"


def make_store(url: str, spool_parent: Path, database: str | None = None, **kw) -> InfluxStore:
    cfg = InfluxStoreConfig(url=url, database=database or f"t_{uuid.uuid4().hex[:12]}",
                            **{"flush_interval": 0.05, "timeout": 1.0, **kw})
    return InfluxStore(cfg, spool_parent)


def count_points(server: InfluxServer, db: str, measurement: str, field: str = "v") -> int:
    doc = server.query(f'SELECT count("{field}") FROM "{measurement}"', db=db)
    series = doc["results"][0].get("series")
    return series[0]["values"][0][1] if series else 0


@pytest.fixture
def own_influxd():
    """A private influxd that a test may stop and restart."""
    if not INFLUXD.exists():
        pytest.skip(SKIP_REASON)
    server = InfluxServer()
    server.start()
    yield server
    server.cleanup()


# --- encoding and the spool (no server needed, but they belong to this backend) ------------------


def test_line_protocol_escaping():
    p = Point("m x,y=z", {"t k": "v,1", "a=b": 'q"x'}, {"f k": 1.0, 'q"': "a\"b\\c\nd", "i": -3, "b": False}, 5)
    assert encode_point(p) == 'm\\ x\\,y=z,a\\=b=q"x,t\\ k=v\\,1 f\\ k=1.0,q\\"="a\\"b\\\\c\nd",i=-3i,b=false 5'
    assert encode_point(Point("m", {}, {"f": 1e300, "g": -0.0}, 0)) == "m f=1e+300,g=-0.0 0"


def test_spool_is_fifo_bounded_and_survives_reopen(tmp_path):
    spool = Spool(tmp_path / "sp", max_bytes=100)
    spool.push(b"a" * 40, 4)
    spool.push(b"b" * 40, 3)
    with pytest.raises(SpoolFull, match="spool full"):
        spool.push(b"c" * 30, 1)
    assert (len(spool), spool.bytes, spool.points) == (2, 80, 7)
    with pytest.raises(StoreError, match="in use"):
        Spool(tmp_path / "sp", max_bytes=100)  # a second user of the same directory
    spool.close()

    again = Spool(tmp_path / "sp", max_bytes=100)
    (tmp_path / "sp" / "00000000000000000099.tmp").write_bytes(b"half-written")
    first = again.peek()
    assert first.read() == b"a" * 40 and first.points == 4
    again.pop(first)
    again.push(b"d" * 10, 1)
    assert [s.points for s in again.head(max_points=100, max_bytes=1000)] == [3, 1]  # oldest first
    assert [s.points for s in again.head(max_points=3, max_bytes=1000)] == [3]
    assert [s.points for s in again.head(max_points=1, max_bytes=1)] == [3]  # at least one
    assert [again.peek().read()] == [b"b" * 40]
    again.close()
    third = Spool(tmp_path / "sp", max_bytes=100)
    order = []
    while (seg := third.peek()) is not None:
        order.append(seg.read())
        third.pop(seg)
    assert order == [b"b" * 40, b"d" * 10]
    assert not list((tmp_path / "sp").glob("*.tmp"))
    third.close()


# --- round trips ------------------------------------------------------------------------------


def test_every_field_type_round_trips_exactly(influx_store):
    fields = {
        "f1": 1.0, "fnegzero": -0.0, "fbig": 1e300, "ftiny": 5e-324, "fpi": math.pi, "f1e20": 1e20,
        "imin": -(1 << 63), "imax": (1 << 63) - 1, "izero": 0,
        "btrue": True, "bfalse": False,
        "sempty": "", "snl": "line1\nline2\r\n", "suni": "Grüße 東京 🚀", "sq": 'a "b" \\c\\ \\', "sbs": "\\",
    }
    assert influx_store.write([Point("types", {"dev": "a"}, fields, T0)]).accepted == 1
    assert influx_store.flush(5)
    [series] = influx_store.query(Query(measurement="types", start=T0, end=T0 + 1))
    row = dict(zip(series.columns, series.values[0]))
    assert row.pop("time") == T0
    assert row == fields
    for key, value in fields.items():
        assert type(row[key]) is type(value), key
    assert math.copysign(1.0, row["fnegzero"]) == 1.0  # -0.0 is stored as 0.0 (both backends alike)
    [latest] = influx_store.latest("types")
    assert dict(zip(latest.columns, latest.values[0])) == {"time": T0, **fields}


HOSTILE = [
    "with space", " lead", "trail ", "comma,here", "eq=sign", 'double"quote', "single'quote", "it's \"both\"",
    "back\\slash", "\\lead", "two\\\\backslashes", 'bs\\"quote', "Grüße 東京", "emoji 🚀🔥", "hash#", "a,b=c d",
    "=", ",", " ", "\u00a0nbsp", "true", "1.5",
]


def test_hostile_names_and_values_survive_exactly(influx_store):
    points = []
    for i, name in enumerate(HOSTILE):
        # A backslash before '"' is not storable in a measurement name (see validate_point()).
        measurement = name if '\\"' not in name else f"m{i}"
        points.append(Point(measurement, {name: name, "idx": str(i)}, {f"{name}_f": i, "s": name}, T0 + i))
    result = influx_store.write(points)
    assert result.rejected == [] and result.accepted == len(points)
    assert influx_store.flush(5)
    for i, (p, name) in enumerate(zip(points, HOSTILE)):
        # Filter on the hostile tag and select the hostile field: exercises InfluxQL quoting too.
        got = influx_store.query(Query(measurement=p.measurement, start=T0, end=T0 + 100,
                                       tags={name: [name]}, fields=[f"{name}_f", "s"]))
        assert len(got) == 1, name
        assert got[0].measurement == p.measurement
        assert got[0].tags == {name: name, "idx": str(i)}
        assert got[0].columns == ["time", f"{name}_f", "s"]
        assert got[0].values == [[T0 + i, i, name]]


def test_bad_points_rejected_with_reasons_good_ones_of_the_batch_kept(influx_store):
    good = [Point("ok", {"dev": "a"}, {"v": 1.0}, T0), Point("ok", {"dev": "b"}, {"v": 2.0}, T0 + 1)]
    bad = [
        (Point("ok", {"dev": "x\ny"}, {"v": 1.0}, T0), "newline"),
        (Point("new\nline", {}, {"v": 1.0}, T0), "newline"),
        (Point("ok", {"new\nkey": "a"}, {"v": 1.0}, T0), "newline"),
        (Point("ok", {}, {"f\n": 1.0}, T0), "newline"),
        (Point("ok", {"time": "a"}, {"v": 1.0}, T0), "reserved"),
        (Point("", {}, {"v": 1.0}, T0), "non-empty"),
        (Point("#comment", {}, {"v": 1.0}, T0), "comment"),
        (Point('bs\\"q', {}, {"v": 1.0}, T0), "backslash"),
        (Point("ok", {"dev": "trailing\\"}, {"v": 1.0}, T0), "backslash"),
        (Point("ok", {}, {"v": float("inf")}, T0), "infinity"),
        (Point("ok", {}, {"v": 1 << 63}, T0), "64-bit"),
        (Point("ok", {}, {"v": 1.0}, -1), "timestamp"),
    ]
    batch = [good[0], *[p for p, _ in bad], good[1]]
    result = influx_store.write(batch)
    assert result.accepted == 2
    reasons = dict(result.rejected)
    assert sorted(reasons) == list(range(1, len(bad) + 1))
    for i, (_, word) in enumerate(bad, start=1):
        assert word in reasons[i], (i, reasons[i])
    assert influx_store.flush(5)
    got = {tuple(s.tags.items()): s.values for s in influx_store.query(Query(measurement="ok", start=0, end=T0 + 10))}
    assert got == {(("dev", "a"),): [[T0, 1.0]], (("dev", "b"),): [[T0 + 1, 2.0]]}
    assert influx_store.stats()["points_rejected"] == len(bad)
    assert influx_store.stats()["points_dropped"] == 0


def test_type_conflicts_rejected_synchronously(influx_store, influxd):
    db = influx_store.cfg.database
    # Someone else (not this store) already wrote "ext" as an integer.
    r = httpx.post(f"{influxd.url}/write", params={"db": db, "precision": "ns"}, content=b"tc ext=5i 1\n")
    assert r.status_code == 204
    result = influx_store.write([
        Point("tc", {}, {"ext": 1.5}, T0),  # conflicts with the server's type
        Point("tc", {}, {"v": 1}, T0 + 1),
        Point("tc", {}, {"v": 2.0}, T0 + 2),  # conflicts with the previous point of this batch
        Point("tc", {}, {"ext": 7}, T0 + 3),
    ])
    assert result.accepted == 2
    assert [i for i, _ in result.rejected] == [0, 2]
    assert all("type" in reason for _, reason in result.rejected)
    later = influx_store.write([Point("tc", {}, {"v": "text"}, T0 + 4)])  # against our own earlier write
    assert later.accepted == 0 and "type" in later.rejected[0][1]
    assert influx_store.flush(5)
    [series] = influx_store.query(Query(measurement="tc", start=T0, end=T0 + 10))
    assert series.values == [[T0 + 1, None, 1], [T0 + 3, 7, None]]
    assert influx_store.stats()["points_dropped"] == 0  # nothing reached influxd to be refused there


def test_gzip_is_used_on_writes(influx_store):
    seen = []
    influx_store._send_http.event_hooks["request"].append(
        lambda req: seen.append((req.url.path, req.headers.get("content-encoding"), req.content[:2])))
    influx_store.write([Point("gz", {"dev": "a"}, {"v": float(i)}, T0 + i) for i in range(200)])
    assert influx_store.flush(5)
    writes = [s for s in seen if s[0] == "/write"]
    assert writes and all(enc == "gzip" and magic == b"\x1f\x8b" for _, enc, magic in writes)
    [series] = influx_store.query(Query(measurement="gz", start=T0, end=T0 + 1000))
    assert len(series.values) == 200  # and influxd understood it


def test_aggregation_and_tag_filters(influx_store):
    points = []
    for dev, base in (("a", 0), ("b", 100), ("c", 1000)):
        for port in ("p1", "p2"):
            for t in range(20):  # two 10 s windows
                points.append(Point("agg", {"dev": dev, "port": port}, {"v": float(base + t), "n": t}, T0 + t * S))
    assert influx_store.write(points).accepted == len(points)
    assert influx_store.flush(5)
    series = influx_store.query(Query(measurement="agg", start=T0, end=T0 + 20 * S, fields=["v", "n"],
                                      window_ns=10 * S, agg="mean", tags={"dev": ["a", "b"], "port": ["p2"]}))
    got = {s.tags["dev"]: s.values for s in series}
    assert {tuple(sorted(s.tags.items())) for s in series} == {(("dev", "a"), ("port", "p2")),
                                                               (("dev", "b"), ("port", "p2"))}
    assert got["a"] == [[T0, 4.5, 4.5], [T0 + 10 * S, 14.5, 14.5]]
    assert got["b"] == [[T0, 104.5, 4.5], [T0 + 10 * S, 114.5, 14.5]]
    summed = influx_store.query(Query(measurement="agg", start=T0 + 5 * S, end=T0 + 15 * S, fields=["n"],
                                      window_ns=10 * S, agg="sum", tags={"dev": ["c"], "port": ["p1"]}))
    assert summed[0].values == [[T0, 5 + 6 + 7 + 8 + 9], [T0 + 10 * S, 10 + 11 + 12 + 13 + 14]]
    assert all(type(v) is int for row in summed[0].values for v in row)
    counted = influx_store.query(Query(measurement="agg", start=T0, end=T0 + 20 * S, fields=["v"],
                                       window_ns=20 * S, agg="count"))
    assert sorted(s.values[0][1] for s in counted) == [20] * 6
    assert influx_store.query(Query(measurement="agg", start=T0, end=T0 + 20 * S, tags={"dev": ["zzz"]})) == []


def test_query_errors(influx_store, tmp_path):
    assert influx_store.query(Query(measurement="never_written", start=0, end=T0)) == []
    with pytest.raises(StoreError, match="InfluxDB") as err:  # a window InfluxQL cannot express
        influx_store.query(Query(measurement="x", start=0, end=T0, fields=["v"], window_ns=10**30, agg="mean"))
    assert not isinstance(err.value, StoreUnavailable)
    dead = make_store(f"http://127.0.0.1:{free_port()}", tmp_path / "dead")
    try:
        with pytest.raises(StoreUnavailable):
            dead.query(Query(measurement="x", start=0, end=T0))
        assert dead.health()["ok"] is False
    finally:
        dead.close()
    health = influx_store.health()
    assert health["backend"] == "influxdb" and health["ok"] is True


def test_from_config_uses_data_dir_spool(influxd, tmp_path):
    cfg = NmsConfig(
        data_dir=tmp_path, store={"backend": "influxdb", "influxdb": {"url": influxd.url, "database": "fc"}}
    )
    store = InfluxStore.from_config(cfg)
    try:
        assert store._spool.directory == tmp_path / "spool"
        assert (tmp_path / "spool").is_dir()
    finally:
        store.close()


def test_retention_policy_is_used(influxd, tmp_path):
    store = make_store(influxd.url, tmp_path, retention_policy="autogen")
    try:
        assert store.write([Point("rp", {"d": "a"}, {"v": 1}, T0)]).accepted == 1
        assert store.flush(5)
        assert store._write_params["rp"] == "autogen"
        assert store.query(Query(measurement="rp", start=T0, end=T0 + 1))[0].values == [[T0, 1]]
        assert store.latest("rp")[0].values == [[T0, 1]]
    finally:
        store.close()


def test_credentials_in_the_url_are_used_but_not_shown(auth_influxd, tmp_path):
    host = auth_influxd.url.removeprefix("http://")
    store = make_store(f"http://admin:{PASSWORD}@{host}", tmp_path)
    try:
        assert store.write([Point("urlauth", {}, {"v": 1.0}, T0)]).accepted == 1
        assert store.drain(10)
        assert store.query(Query(measurement="urlauth", start=T0, end=T0 + 1))[0].values == [[T0, 1.0]]
    finally:
        store.close()
    dead = make_store(f"http://admin:{PASSWORD}@127.0.0.1:{free_port()}", tmp_path / "dead")
    try:
        with pytest.raises(StoreUnavailable) as err:
            dead.query(Query(measurement="x", start=0, end=T0))
        assert PASSWORD not in str(err.value)
    finally:
        dead.close()


# --- auth -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_influxd():
    if not INFLUXD.exists():
        pytest.skip(SKIP_REASON)
    server = InfluxServer(auth=True)
    server.start()
    # With auth on and no users yet, influxd accepts creating the first admin without credentials.
    doc = server.query(f"CREATE USER admin WITH PASSWORD '{PASSWORD}' WITH ALL PRIVILEGES")
    assert "error" not in doc["results"][0], doc
    yield server
    server.cleanup()


def test_basic_auth_works(auth_influxd, tmp_path):
    store = make_store(auth_influxd.url, tmp_path, username="admin", password=PASSWORD)
    try:
        assert store.write([Point("au", {}, {"v": 1.0}, T0)]).accepted == 1
        assert store.drain(10)
        [series] = store.query(Query(measurement="au", start=T0, end=T0 + 1))
        assert series.values == [[T0, 1.0]]
        assert store.stats()["points_written"] == 1
    finally:
        store.close()
    # The server really enforces auth: no credentials, no data.
    assert "error" in auth_influxd.query("SHOW DATABASES")


def test_wrong_password_never_leaks(auth_influxd, tmp_path, caplog):
    wrong = "Wr0ng-Passw0rd-xyz"
    caplog.set_level(logging.DEBUG)
    store = make_store(auth_influxd.url, tmp_path, username="admin", password=wrong)
    try:
        with pytest.raises(StoreError) as err:
            store.query(Query(measurement="au", start=0, end=T0))
        assert "401" in str(err.value) or "auth" in str(err.value)
        # A write is kept (401 is retried: credentials can be fixed) and not lost.
        assert store.write([Point("au2", {}, {"v": 1.0}, T0)]).accepted == 1
        assert store.flush(5)
        wait_until(lambda: store.stats()["write_errors"] >= 1, 15, 0.02, what="a refused write")
        assert store.stats()["spool_points"] == 1 and store.stats()["points_dropped"] == 0
        health = store.health()
        texts = [str(err.value), repr(err.value), str(health), str(store.stats()), caplog.text, repr(store.cfg)]
        for text in texts:
            assert wrong not in text and PASSWORD not in text
    finally:
        store.close()


def test_token_auth_header_is_sent(auth_influxd, tmp_path):
    store = make_store(auth_influxd.url, tmp_path, token="tok-123")
    headers = []
    store._http.event_hooks["request"].append(lambda req: headers.append(req.headers.get("authorization")))
    try:
        with pytest.raises(StoreError) as err:  # influxd 1.6 has no token auth: refused
            store.query(Query(measurement="x", start=0, end=T0))
        assert headers and headers[-1] == "Token tok-123"
        assert "tok-123" not in str(err.value)
    finally:
        store.close()


# --- outages, restarts, a full spool ---------------------------------------------------------


class Writer(threading.Thread):
    """Writes batches of 10 points with unique timestamps until stopped; remembers every one accepted."""

    def __init__(self, store: InfluxStore) -> None:
        super().__init__(daemon=True)
        self.store, self.written, self.failures = store, [], []
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        try:
            while not self.halt.is_set():
                batch = [Point("out", {"w": str(j % 3)}, {"v": i + j}, T0 + (i + j) * 1000) for j in range(10)]
                result = self.store.write(batch)
                assert result.accepted == 10, result
                self.written.extend(p.ts for p in batch)
                i += 10
                time.sleep(0.002)
        except BaseException as e:  # surfaced by finish()
            self.failures.append(e)

    def wait_more(self, n: int, what: str) -> None:
        target = len(self.written) + n
        wait_until(lambda: len(self.written) >= target or self.failures, 15, 0.02, what=what)
        assert not self.failures, self.failures

    def finish(self) -> list[int]:
        self.halt.set()
        self.join()
        assert not self.failures, self.failures
        assert len(set(self.written)) == len(self.written)
        return self.written


def assert_exactly_once(store: InfluxStore, server: InfluxServer, written: list[int]) -> None:
    assert store.drain(20)
    stats = store.stats()
    assert stats["points_dropped"] == 0 and stats["buffered_points"] == 0 and stats["spool_segments"] == 0
    assert not list(store._spool.directory.glob("*.lp"))
    n = len(written)
    assert count_points(server, store.cfg.database, "out") == n
    series = store.query(Query(measurement="out", start=T0, end=T0 + 10 * n * 1000 + 1, limit=1_000_000))
    got = [row[0] for s in series for row in s.values]
    assert len(got) == n and set(got) == set(written)
    # the ledger on disk says what InfluxDB acknowledged: every point once, nothing in flight or spooled
    ledger = read_ledger(store._spool.directory)
    assert ledger is not None and (ledger["points_written"], ledger["points_in_flight"], ledger["spool_points"]) == (
        n, 0, 0), ledger


def test_outage_loses_nothing_and_duplicates_nothing(own_influxd, tmp_path):
    store = make_store(own_influxd.url, tmp_path, batch_size=500)
    writer = Writer(store)
    writer.start()
    try:
        wait_until(lambda: store.stats()["points_written"] >= 300, 15, 0.02, what="writes before the outage")
        own_influxd.stop()
        wait_until(lambda: store.stats()["spool_bytes"] > 0, 15, 0.02, what="the spool to be used")
        writer.wait_more(500, "writes during the outage")
        during = store.stats()
        assert during["spool_segments"] >= 2 and during["spool_points"] >= 400 and during["write_errors"] >= 1
        assert read_ledger(store._spool.directory)["spool_points"] >= during["spool_points"]  # spooled: kept on disk
        assert store.health()["ok"] is False
        own_influxd.start()
        wait_until(lambda: store.stats()["spool_bytes"] == 0, 20, 0.02, what="the spool to drain")
        writer.wait_more(300, "writes after the outage")
    finally:
        written = writer.finish()
    assert_exactly_once(store, own_influxd, written)
    store.close()


class FlakyProxy:
    """An HTTP proxy in front of influxd whose /write answers can be made to fail:
    mode "503" (server error), "slow" (forwards, then answers after the client gave up)."""

    def __init__(self, target: str) -> None:
        self.mode = "pass"
        upstream = httpx.Client(base_url=target, timeout=10.0)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client timed out and left

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = proxy.mode if self.path.startswith("/write") else "pass"
                if mode == "503":
                    return self._answer(503, b'{"error":"overloaded"}')
                keep = {k: v for k, v in self.headers.items()
                        if k.lower() in ("content-type", "content-encoding", "authorization")}
                r = upstream.request(self.command, self.path, content=body, headers=keep)
                if mode == "slow":
                    time.sleep(1.0)  # influxd has the data; the store's 0.3 s timeout has passed
                self._answer(r.status_code, r.content, r.headers.get("content-type", "application/json"))

            do_GET = do_POST = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky(influxd):
    proxy = FlakyProxy(influxd.url)
    yield proxy
    proxy.close()


def test_server_errors_and_timeouts_lose_and_duplicate_nothing(flaky, influxd, tmp_path):
    store = make_store(flaky.url, tmp_path, batch_size=500, timeout=0.3)
    writer = Writer(store)
    writer.start()
    try:
        wait_until(lambda: store.stats()["points_written"] >= 200, 15, 0.02, what="writes through the proxy")
        flaky.mode = "503"
        wait_until(lambda: store.stats()["spool_bytes"] > 0, 15, 0.02, what="5xx answers to be spooled")
        writer.wait_more(300, "writes while influxd answers 503")
        assert "503" in store.health()["last_error"]
        flaky.mode = "slow"  # replays reach influxd, but their answers come too late
        errors = store.stats()["write_errors"]
        wait_until(lambda: store.stats()["write_errors"] >= errors + 2, 15, 0.02, what="timed-out replays")
        # a batch waiting for its answer is on the ledger as in flight (a process killed then may have stored it)
        wait_until(lambda: (read_ledger(store._spool.directory) or {}).get("points_in_flight", 0) > 0, 10, 0.005,
                   what="the ledger to show a batch in flight")
        assert "Timeout" in store.health()["last_error"]
        assert store.stats()["spool_segments"] >= 1
        flaky.mode = "pass"
        wait_until(lambda: store.stats()["spool_bytes"] == 0, 20, 0.02, what="the spool to drain")
        writer.wait_more(200, "writes after recovery")
    finally:
        written = writer.finish()
    assert_exactly_once(store, influxd, written)
    store.close()


def test_store_starts_while_influxd_is_down_and_creates_the_database_later(own_influxd, tmp_path):
    own_influxd.stop()
    store = make_store(own_influxd.url, tmp_path)
    try:
        assert store.write([Point("late", {}, {"v": i}, T0 + i) for i in range(100)]).accepted == 100
        assert store.flush(5)
        assert store.stats()["spool_points"] == 100 and store.health()["ok"] is False
        own_influxd.start()
        assert store.drain(20)
        assert count_points(own_influxd, store.cfg.database, "late") == 100
    finally:
        store.close()


def test_spool_survives_a_store_restart(own_influxd, tmp_path):
    first = make_store(own_influxd.url, tmp_path)
    db = first.cfg.database
    assert first.write([Point("sr", {}, {"v": 0}, T0)]).accepted == 1
    assert first.drain(10)  # the database exists now
    own_influxd.stop()
    for k in range(5):
        assert (
            first.write([Point("sr", {"k": str(k)}, {"v": i}, T0 + 1 + k * 100 + i) for i in range(100)]).accepted
            == 100
        )
    first.close()  # influxd is down: everything unsent goes to the spool
    segments = list((tmp_path / "spool").glob("*.lp"))
    assert segments

    second = make_store(own_influxd.url, tmp_path, database=db)
    try:
        assert second.stats()["spool_points"] == 500
        own_influxd.start()
        assert second.drain(20)
        assert count_points(own_influxd, db, "sr") == 501
        assert second.stats()["points_written"] == 500
        assert not list((tmp_path / "spool").glob("*.lp"))
    finally:
        second.close()


def test_full_spool_refuses_writes_and_keeps_nothing_of_them(tmp_path):
    port = free_port()  # nothing listens there
    store = make_store(f"http://127.0.0.1:{port}", tmp_path, spool_max_bytes=8192)
    accepted = 0
    try:
        with pytest.raises(StoreUnavailable, match="full"):
            for k in range(1000):
                accepted += store.write(
                    [Point("full", {"k": str(k)}, {"v": float(i)}, T0 + i) for i in range(10)]
                ).accepted
        before = store.stats()
        assert 0 < accepted < 10_000
        with pytest.raises(StoreUnavailable):
            store.write([Point("full", {}, {"v": 1.0}, T0)] * 5)
        assert store.flush(5)
        after = store.stats()
        assert after["spool_points"] == accepted and after["buffered_points"] == 0
        assert after["spool_bytes"] <= 8192
        assert before["spool_points"] + before["buffered_points"] == accepted
    finally:
        store.close()
    assert sum(int(p.name.split("-")[1].split(".")[0]) for p in (tmp_path / "spool").glob("*.lp")) == accepted
