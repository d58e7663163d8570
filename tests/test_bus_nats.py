"""The bus on a real nats-server with JetStream (nms/bus/nats.py), and a cluster API's ingest through it
(nms/app/api/ingest.py): 202 once JetStream acknowledged, the ingest's own rejections, 503 while
the bus is down. The fixture starts nats-server on a free loopback port (tests/_nats.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.service import Service
from nms.app.telemetry_bus import decode, stream_name
from nms.bus import BusUnavailable, StreamSpec
from nms.bus.nats import NatsBus
from nms.config.models import BusConfig
from tests.helpers import auth, make_config, wait_until

T0 = 1_764_000_000_000_000_000


def test_publish_acknowledged_deduplicated_and_redelivered_until_acked(nats_server):
    async def scenario():
        bus = NatsBus(BusConfig(servers=[nats_server.url]))
        await bus.connect()
        spec = StreamSpec("T_TEL_X", ("t.tel.x.>",), max_age_s=3600)
        await bus.ensure_streams([spec])
        await bus.ensure_streams([spec])  # a second member finds it and keeps it
        first = await bus.publish("t.tel.x.k.h1", b"one", msg_id="m1")
        again = await bus.publish("t.tel.x.k.h1", b"one", msg_id="m1")
        other = await bus.publish("t.tel.x.k.h2", b"two", msg_id="m2")
        assert (first.stream, first.seq, first.duplicate) == ("T_TEL_X", 1, False)
        assert again.duplicate and again.seq == 1 and other.seq == 2  # the duplicate is stored once
        consumer = await bus.consumer("T_TEL_X", "w", "t.tel.x.>", ack_wait_s=1.0, max_pending=10)
        got = await consumer.fetch(10, 2.0)
        assert [(m.subject, m.data, m.deliveries) for m in got] == [("t.tel.x.k.h1", b"one", 1),
                                                                   ("t.tel.x.k.h2", b"two", 1)]
        await got[1].ack()
        # never acknowledged (its taker died): delivered again after ack_wait, to whoever fetches
        redelivered = await consumer.fetch(10, 3.0)
        assert [(m.data, m.deliveries) for m in redelivered] == [(b"one", 2)]
        await redelivered[0].ack()
        assert await consumer.fetch(10, 1.5) == []
        assert bus.health()["ok"] is True
        await bus.close()

    asyncio.run(scenario())


def test_ensure_streams_asks_for_an_update_only_when_a_stream_differs(nats_server, caplog):
    """Every member ensures the streams at its start: one that finds them as wanted sends JetStream no
    update (seen by a plain subscriber of the update API's subject), one that wants other settings
    updates the stream and says which."""
    import nats

    async def scenario():
        watcher = await nats.connect(nats_server.url)
        updates = await watcher.subscribe("$JS.API.STREAM.UPDATE.T_TEL_Y")
        bus = NatsBus(BusConfig(servers=[nats_server.url]))
        await bus.connect()
        spec = StreamSpec("T_TEL_Y", ("t.tel.y.>",), max_age_s=3600)
        await bus.ensure_streams([spec])
        await bus.ensure_streams([spec])  # a second member: as wanted
        await watcher.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await updates.next_msg(timeout=0.5)
        await bus.ensure_streams([StreamSpec("T_TEL_Y", ("t.tel.y.>",), max_age_s=7200.0)])
        request = await updates.next_msg(timeout=5)
        assert json.loads(request.data)["max_age"] == 7200 * 10**9
        info = await watcher.jetstream().stream_info("T_TEL_Y")
        await bus.close()
        await watcher.close()
        return info.config.max_age

    with caplog.at_level("INFO", logger="nms.bus.nats"):
        assert asyncio.run(scenario()) == 7200
    logged = [r.getMessage() for r in caplog.records if r.name == "nms.bus.nats"]
    assert [m for m in logged if "updated" in m] == ["bus: stream T_TEL_Y updated (max_age: 3600.0 -> 7200.0)"]


def test_a_stream_short_of_peers_is_unavailable_for_now_other_refusals_are_errors(tmp_path):
    """JetStream answers "no suitable peers for placement" (400, err_code 10005) while fewer of its
    cluster's nodes are up than a stream's replicas: `nms cluster up` met it with three nodes
    starting (tests/lab/test_cluster_lab.py, once). That is the bus not ready yet (BusUnavailable:
    the launcher asks again), not a configuration it refuses (BusError). A plain nats-server (no
    JetStream) and a responder on the JetStream API's subject give the client that answer."""
    import shutil
    import socket
    import subprocess

    import nats

    from nms.bus import BusError
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server not installed: apt-get install nats-server (CI installs it: scripts/test.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"

    async def ensure(err_code: int, description: str) -> Exception:
        responder = await nats.connect(url)

        async def answer(msg) -> None:
            await msg.respond(json.dumps({"type": "io.nats.jetstream.api.v1.stream_info_response", "error": {
                "code": 400, "err_code": err_code, "description": description}}).encode())
        await responder.subscribe("$JS.API.STREAM.INFO.T_PEERS", cb=answer)
        await responder.flush()
        bus = NatsBus(BusConfig(servers=[url], publish_timeout=2))
        await bus.connect()
        try:
            await bus.ensure_streams([StreamSpec("T_PEERS", ("t.peers.>",), max_age_s=60, replicas=3)])
        except BusError as e:
            return e
        finally:
            await bus.close()
            await responder.close()
        raise AssertionError("ensure_streams took the refusal")

    try:
        wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 10)
        short = asyncio.run(ensure(10005, "no suitable peers for placement"))
        assert isinstance(short, BusUnavailable) and "no suitable peers" in str(short)
        refused = asyncio.run(ensure(10074, "replicas > 1 not supported in non-clustered mode"))
        assert not isinstance(refused, BusUnavailable) and "refused its configuration" in str(refused)
    finally:
        server.terminate()
        server.wait(10)


def test_connect_to_no_server_is_a_clear_error():
    async def scenario():
        bus = NatsBus(BusConfig(servers=["nats://127.0.0.1:1"], connect_timeout=1))
        try:
            await bus.connect()
        except BusUnavailable as e:
            return str(e)
        raise AssertionError("connected to nothing")

    assert "no NATS server answered at nats://127.0.0.1:1" in asyncio.run(scenario())


def _api_service(tmp_path, influx_url: str, nats_url: str) -> Service:
    cfg = make_config(tmp_path / "api", store={"backend": "influxdb", "influxdb": {"url": influx_url,
                                                                                  "database": "t_bus_api"}},
                      cluster={"bus": {"servers": [nats_url], "publish_timeout": "2s", "prefix": "t1"}})
    return Service(cfg, roles=frozenset({"api"}))


def _stream_messages(nats_url: str, stream: str) -> list[tuple[str, bytes]]:
    async def read():
        bus = NatsBus(BusConfig(servers=[nats_url]))
        await bus.connect()
        consumer = await bus.consumer(stream, "reader", ">", ack_wait_s=30, max_pending=100)
        msgs = await consumer.fetch(100, 2.0)
        await bus.close()
        return [(m.subject, m.data) for m in msgs]

    return asyncio.run(read())


def test_cluster_api_publishes_validated_records_and_answers_202_422_503(nats_server, influxd, tmp_path):
    service = _api_service(tmp_path, influxd.url, nats_server.url)
    with TestClient(create_app(service)) as client:
        items = [{"device": d, "port": "swp1", "ts": T0 + i, "in_octets": i} for d in ("leaf1", "leaf2")
                 for i in range(3)]
        items.insert(2, {"device": "leaf1", "port": "swp1", "ts": T0, "in_octets": -1})  # the ingest refuses it
        r = client.post("/ingest/port_samples", json={"items": items}, headers=auth("ingest"))
        assert r.status_code == 202, r.text
        assert r.json()["accepted"] == 6 and [e["index"] for e in r.json()["rejected"]] == [2]
        bad = client.post("/ingest/port_samples", json={"items": [{"device": "leaf1"}]}, headers=auth("ingest"))
        assert bad.status_code == 422  # nothing worth publishing: as the single process answers
        # the store's own point checks apply before publishing (a NaN-free float, no reserved names)
        point = {"measurement": "_internal", "fields": {"v": 1}, "ts": T0}
        refused = client.post("/ingest/points", json={"items": [point]}, headers=auth("ingest"))
        assert refused.status_code == 422 and "reserved" in refused.json()["rejected"][0]["errors"][0]
        assert service.store.stats().get("points_written", 0) == 0  # the API wrote nothing itself
        metrics = client.get("/metrics", headers=auth("read")).text
        assert 'nms_bus_published_messages_total{kind="port_samples",result="acked"} 2.0' in metrics

        assert client.get("/health").json() == {"status": "ok", "store_ok": True, "bus_ok": True}
        nats_server.stop()  # the bus goes away: no 202 for what it did not acknowledge
        health = wait_until(lambda: (r := client.get("/health")).status_code == 503 and r.json(), 15,
                            what="/health to say the bus is down")
        assert health == {"status": "degraded", "store_ok": True, "bus_ok": False}
        down = client.post("/ingest/port_samples", json={"items": items[:1]}, headers=auth("ingest"))
        assert down.status_code == 503 and "telemetry bus" in down.json()["detail"], down.text
        nats_server.start()  # same port and store: the API reconnects, the stream kept what it acknowledged
        wait_until(lambda: client.post("/ingest/port_samples", json={"items": items[:1]},
                                       headers=auth("ingest")).status_code == 202, 30, what="202 after NATS restart")

    messages = _stream_messages(nats_server.url, stream_name("t1", "switch"))
    by_subject: dict[str, list] = {}
    for subj, data in messages:
        by_subject.setdefault(subj, []).extend(decode(subj, data)[1])
    assert sorted(by_subject) == ["t1.tel.switch.port_samples.leaf1", "t1.tel.switch.port_samples.leaf2"]
    assert [r.in_octets for r in by_subject["t1.tel.switch.port_samples.leaf2"]] == [0, 1, 2]
    # the batch sent again after the restart is the same message: stored once (duplicate window)
    assert [r.in_octets for r in by_subject["t1.tel.switch.port_samples.leaf1"]] == [0, 1, 2, 0]
    assert json.loads(messages[0][1])["items"]  # an ingest body


def test_agent_reporter_delivers_to_a_cluster_api_and_spools_while_the_bus_is_away(nats_server, influxd, tmp_path):
    """The host agent's reporter (hostprobe/report.py) against a cluster API: 202 counts as delivered;
    a 503 while NATS is away keeps the batch in the agent's spool, replayed once the bus is back."""
    from collections import defaultdict

    from pydantic import SecretStr

    from hostprobe.client import ServiceClient
    from hostprobe.config import ServiceSettings
    from hostprobe.report import Reporter
    from tests.helpers import TOKENS, serve_in_thread

    service = _api_service(tmp_path, influxd.url, nats_server.url)
    app = create_app(service)
    url, server, thread = serve_in_thread(app)
    stats: dict = defaultdict(int)
    settings = ServiceSettings(url=url, token=SecretStr(TOKENS["ingest"]), timeout=5.0)
    reporter = Reporter(ServiceClient(settings, "h1"), tmp_path / "agent", 1 << 20, 1.0, stats)

    def window(i: int) -> dict:
        return {"src_host": "h1", "src_nic": "eth0", "dst_host": "h2", "dst_nic": "eth0", "path_id": f"p{i}",
                "window_start": T0 + i * 10**9, "sent": 10, "received": 10}

    try:
        for i in range(5):
            reporter.put("probe_windows", window(i))
        reporter.flush()
        assert stats["records_delivered"] == 5 and len(reporter.spool) == 0
        nats_server.stop()
        wait_until(lambda: not service.bus.health()["ok"], 15, what="the API to notice NATS is gone")
        for i in range(5, 8):
            reporter.put("probe_windows", window(i))
        reporter.flush()
        assert stats["records_delivered"] == 5 and len(reporter.spool) == 1  # kept by the agent
        nats_server.start()

        def replayed() -> bool:
            reporter.flush()
            return len(reporter.spool) == 0
        wait_until(replayed, 30, what="the spooled batch replayed to the API")
        assert stats["records_delivered"] == 8
    finally:
        reporter.stop()
        server.should_exit = True
        thread.join(30)
    windows = [r for subj, data in _stream_messages(nats_server.url, stream_name("t1", "probe"))
               for r in decode(subj, data)[1]]
    assert sorted(w.path_id for w in windows) == [f"p{i}" for i in range(8)]  # each once, none lost
