"""The cluster's write path with real processes: agents' batches -> an `nms serve --role api` process ->
NATS JetStream -> an `nms serve --role write` process -> InfluxDB. Points counted in InfluxDB equal
the points acknowledged (202) to the senders, also when the writer is killed with SIGKILL mid-stream
while it holds unacknowledged messages, and a new writer takes over: nothing lost, nothing doubled.

Real parts: nats-server with JetStream (tests/_nats.py), influxd (tests/_influx.py), the service's
own CLI as subprocesses. Counting goes to InfluxDB and JetStream directly, not through the service."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from _influx import free_port

from nms.app.telemetry_bus import stream_name
from tests.helpers import TOKENS, auth, wait_until

REPO = Path(__file__).resolve().parents[1]
T0 = 1_764_000_000_000_000_000
PREFIX = "tw"


class Member:
    """One `nms serve --role ...` process with its own data directory and log."""

    def __init__(self, tmp: Path, name: str, role: str, influx_url: str, database: str, nats_url: str | list[str],
                 bus: dict | None = None, **write: object) -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        self.role = role
        self.port = free_port()
        self.log = self.dir / "serve.log"
        doc = {"data_dir": str(self.dir / "data"), "log_level": "info",
               "api": {"host": "127.0.0.1", "port": self.port,
                       "tokens": [{"name": f"t-{s}", "scopes": [s], "token": t} for s, t in TOKENS.items()]},
               "store": {"backend": "influxdb", "influxdb": {"url": influx_url, "database": database,
                                                             "flush_interval": 0.05, "timeout": 2}},
               "correlator": {"enabled": False}, "polling": {"enabled": False},
               "cluster": {"bus": {"servers": [nats_url] if isinstance(nats_url, str) else nats_url, "prefix": PREFIX,
                                   "publish_timeout": "5s", **(bus or {})},
                           "write": {"batch_messages": 4, "fetch_timeout": 0.5, "ack_wait": 2, **write}}}
        self.config = self.dir / "nms.yaml"
        self.config.write_text(yaml.safe_dump(doc))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(self.config),
                                          "--role", self.role], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.text()[-3000:]

    def wait_ready(self, marker: str | None = None) -> None:
        def ready():
            assert self.proc is not None and self.proc.poll() is None, f"{self.role} exited:\n{self.tail()}"
            if marker is not None:
                return marker in self.text()
            return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
        wait_until(ready, 60, ignore=(httpx.HTTPError,), what=f"the {self.role} member to start", why=self.tail)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def members(tmp_path):
    started: list[Member] = []
    yield started
    for member in started:
        member.stop()


def _points(host: str, batch: int, n: int) -> list[dict]:
    """Deterministic points: the same batch sent twice is the same points (series and timestamps)."""
    return [{"measurement": "bus_test", "tags": {"host": host}, "fields": {"seq": batch * n + i, "batch": batch},
             "ts": T0 + (batch * n + i) * 1000} for i in range(n)]


def _post(api: Member, kind: str, items: list[dict]) -> int:
    r = httpx.post(f"{api.url}/ingest/{kind}", json={"items": items}, headers=auth("ingest"), timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["rejected"] == []
    return int(r.json()["accepted"])


def _count(influxd, database: str, measurement: str, field: str) -> int:
    result = influxd.query(f'SELECT count("{field}") FROM "{measurement}"', db=database)["results"][0]
    series = result.get("series")
    return int(series[0]["values"][0][1]) if series else 0


def _consumer_state(nats_url: str, family: str) -> tuple[int, int]:
    """(messages taken but not acknowledged, messages not yet delivered) of the writers' consumer,
    asked of JetStream directly."""
    import nats

    async def ask():
        nc = await nats.connect(nats_url)
        try:
            info = await nc.jetstream().consumer_info(stream_name(PREFIX, family), "writer")
            return info.num_ack_pending, info.num_pending
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_ingest_through_api_bus_writer_into_influxdb(nats_server, influxd, tmp_path, members):
    database = f"t_{uuid.uuid4().hex[:12]}"
    api = Member(tmp_path, "api", "api", influxd.url, database, nats_server.url)
    writer = Member(tmp_path, "writer", "write", influxd.url, database, nats_server.url)
    members.extend([api, writer])
    api.start()
    writer.start()
    api.wait_ready()
    writer.wait_ready("writer: consuming")

    acked = sum(_post(api, "points", _points(f"h{h}", b, 50)) for h in range(3) for b in range(8))
    samples = [{"device": f"leaf{d}", "port": f"swp{p}", "ts": T0 + i * 10**9, "in_octets": i * 1000 + p}
               for d in (1, 2) for p in range(4) for i in range(10)]
    acked_samples = sum(_post(api, "port_samples", samples[i:i + 20]) for i in range(0, len(samples), 20))
    assert (acked, acked_samples) == (1200, 80)

    wait_until(lambda: _count(influxd, database, "bus_test", "seq") == acked, 60,
               what=f"{acked} points in InfluxDB", why=lambda: f"{_count(influxd, database, 'bus_test', 'seq')} "
                                                            f"there; writer log:\n{writer.tail()}")
    wait_until(lambda: _count(influxd, database, "port_counters", "in_octets") == acked_samples, 30,
               what="the port samples in InfluxDB", why=writer.tail)
    assert _consumer_state(nats_server.url, "host") == (0, 0)  # every message acknowledged
    # the values, not only the count: leaf2 swp3's last counter
    row = influxd.query('SELECT last("in_octets") FROM "port_counters" WHERE device=\'leaf2\' AND port=\'swp3\'',
                        db=database)["results"][0]["series"][0]["values"][0]
    assert row[1] == 9 * 1000 + 3

    # a field whose type conflicts with what is stored: 202 (the API cannot know), then the writer
    # keeps it in the store's quarantine with the reason (issue 16), and stores the rest of its batch
    first = {"measurement": "bus_types", "tags": {"host": "h0"}, "fields": {"v": 1}, "ts": T0}
    assert _post(api, "points", [first]) == 1
    wait_until(lambda: _count(influxd, database, "bus_types", "v") == 1, 30, what="the first typed point")
    clash = dict(first, fields={"v": "text"}, ts=T0 + 1)
    assert _post(api, "points", [clash, dict(first, fields={"v": 2}, ts=T0 + 2)]) == 2
    quarantine = writer.dir / "data" / "spool" / "quarantine.jsonl"
    entry = wait_until(lambda: quarantine.exists() and quarantine.read_text(), 30, what="the quarantined point",
                       why=writer.tail)
    [kept] = [json.loads(line) for line in entry.splitlines()]
    assert "type conflict" in kept["reason"] and kept["line"] == f'bus_types,host=h0 v="text" {T0 + 1}', kept
    wait_until(lambda: _count(influxd, database, "bus_types", "v") == 2, 30, what="the clash's batch-mate stored")
    assert "Traceback" not in api.text() + writer.text()


def test_writer_killed_mid_stream_then_restarted_loses_and_doubles_nothing(nats_server, influxd, tmp_path, members):
    database = f"t_{uuid.uuid4().hex[:12]}"
    api = Member(tmp_path, "api", "api", influxd.url, database, nats_server.url)
    # a long pull: whenever it is frozen, the writer has a pull request open (or a batch in hand), so
    # JetStream hands it the next messages, which it never acknowledges
    writer = Member(tmp_path, "writer", "write", influxd.url, database, nats_server.url, fetch_timeout=30)
    members.extend([api, writer])
    api.start()
    writer.start()
    api.wait_ready()
    writer.wait_ready("writer: consuming")

    batches = [(f"h{h}", b) for b in range(10) for h in range(4)]
    acked = [_post(api, "points", _points(host, b, 400)) for host, b in batches[:20]]
    wait_until(lambda: _count(influxd, database, "bus_test", "seq") > 0, 60, what="the writer's first points",
               why=writer.tail)
    # freeze the writer: what JetStream hands it from now on is taken and never acknowledged
    writer.kill(signal.SIGSTOP)
    errors: list[BaseException] = []

    def sender():
        try:
            for host, b in batches[20:]:
                acked.append(_post(api, "points", _points(host, b, 400)))
        except BaseException as e:  # reported by the test
            errors.append(e)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    taken = wait_until(lambda: _consumer_state(nats_server.url, "host")[0] > 0, 30,
                       what="messages taken by the frozen writer")
    writer.kill(signal.SIGKILL)
    count_at_kill = _count(influxd, database, "bus_test", "seq")
    thread.join(120)
    assert not errors, errors  # the API answered 202 to every batch, writer or not
    assert len(acked) == len(batches) and sum(acked) == 16_000
    assert count_at_kill < sum(acked)  # killed mid-stream: the rest waits on the bus

    successor = Member(tmp_path, "writer2", "write", influxd.url, database, nats_server.url)
    members.append(successor)
    successor.start()
    wait_until(lambda: _count(influxd, database, "bus_test", "seq") == sum(acked), 90,
               what=f"all {sum(acked)} acknowledged points in InfluxDB",
               why=lambda: f"{_count(influxd, database, 'bus_test', 'seq')} there; log:\n{successor.tail()}")
    wait_until(lambda: _consumer_state(nats_server.url, "host") == (0, 0), 30,
               what="every message acknowledged", why=successor.tail)
    # the dead writer's unacknowledged messages were delivered again, and stored once
    assert taken and "delivered again" in successor.text(), successor.tail()
    per_host = influxd.query('SELECT count("seq") FROM "bus_test" GROUP BY "host"', db=database)["results"][0]
    assert {s["tags"]["host"]: s["values"][0][1] for s in per_host["series"]} == {f"h{h}": 4000 for h in range(4)}
    distinct = influxd.query('SELECT count(distinct("seq")) FROM "bus_test" WHERE host=\'h0\'', db=database)
    assert distinct["results"][0]["series"][0]["values"][0][1] == 4000
