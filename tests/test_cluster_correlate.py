"""A `correlate` member in its own process takes its telemetry from the bus: agents' batches -> an
`nms serve --role api` process -> NATS JetStream -> an `nms serve --role correlate` process, which
opens the incident in the shared PostgreSQL state, where the API reads it. The input is the
single-process test's (tests/test_correlation_service.py: a synthetic fabric, one link down), and so
must the incident be. Killed with SIGKILL while the fault goes on and started again, the member
re-reads the streams' retention (its context, the probe paths included): every message acknowledged,
the incident not opened twice and continued by the restarted member.

Real parts: nats-server with JetStream (tests/_nats.py), influxd (each member's store), PostgreSQL
(tests/_postgres.py), the service's own CLI as subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import signal
import threading
import time
import uuid

import httpx
import yaml
from prometheus_client import CollectorRegistry
from test_cluster_write import Member, members  # noqa: F401  (the members fixture)

from nms.app.correlate_partitions import Split, owned
from nms.app.polled import PolledPublisher
from nms.app.service import Service
from nms.app.telemetry_bus import CORRELATED, TelemetryPublisher, stream_name
from nms.bus.nats import NatsBus
from nms.config.models import BusConfig
from tests._fabric_synth import Synth
from tests.helpers import auth, make_config, wait_until

PREFIX = "tw"  # test_cluster_write's Member
SECOND = 10**9
HEARTBEAT = 1.0  # the correlate members' (cluster.correlate.heartbeat)
POLL_S = 5  # the pollers' interval
KIND = {"probe_window": "probe_windows", "path_event": "path_events", "probe_path": "probe_paths"}


def _member(tmp_path, name: str, role: str, influxd, nats_url: str, dsn: str, fabric: dict, sinks: list | None = None,
            **correlate) -> Member:
    m = Member(tmp_path, name, role, influxd.url, f"t_{uuid.uuid4().hex[:12]}", nats_url)
    doc = yaml.safe_load(m.config.read_text())
    doc.update(fabric=fabric, state={"backend": "postgresql", "dsn": dsn},
               correlator={"enabled": True}, thresholds={"resolve_after_clean_windows": 2},
               notifications={"sinks": sinks or []})
    doc["cluster"]["correlate"] = {"fetch_timeout": 0.2, "ack_wait": 2, "member": name, **correlate}
    m.config.write_text(yaml.safe_dump(doc))
    return m


def _post(api: Member, records: list) -> None:
    for measurement, kind in KIND.items():
        items = [r.model_dump(mode="json", exclude_none=True) for r in records if r.measurement == measurement]
        if items:
            r = httpx.post(f"{api.url}/ingest/{kind}", json={"items": items}, headers=auth("ingest"), timeout=30)
            assert r.status_code == 202 and r.json()["rejected"] == [], r.text


def _incidents(api: Member) -> list[dict]:
    r = httpx.get(f"{api.url}/incidents", headers=auth("read"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _addresses(synth: Synth, t: int) -> list:
    """The switches' interface addresses, as the poll members hand them to the correlators."""
    return synth.inventory_records(t, with_paths=False)


def _poll(synth: Synth, t: int) -> list:
    """What the poll members hand the correlators at second t: a poll of every switch port (state,
    rates) every POLL_S."""
    return [] if t % POLL_S else [r for r in synth.switch_records(t, POLL_S) if hasattr(r, "device")]


def _publish_polled(nats_url: str, records: list) -> None:
    """Published as a poll member does (nms/app/polled.py, the poller's hook)."""
    async def publish():
        cfg = BusConfig(servers=[nats_url], prefix=PREFIX)
        bus = NatsBus(cfg)
        await bus.connect()
        try:
            publisher = PolledPublisher(TelemetryPublisher(bus, cfg, CollectorRegistry()), lambda _: [],
                                        CollectorRegistry())
            publisher.submit(records)
            await publisher.close()
            assert publisher.records.labels("published")._value.get() == len(records)
        finally:
            await bus.close()

    if records:
        asyncio.run(publish())


class _EventStream(threading.Thread):
    """An API worker's live incident stream (SSE), read into `events` as (event, data)."""

    def __init__(self, api: Member) -> None:
        super().__init__(daemon=True)
        self.url, self.events = f"{api.url}/incidents/stream", []

    def run(self) -> None:
        event = None
        with contextlib.suppress(httpx.HTTPError), httpx.stream(
                "GET", self.url, headers=auth("read"), timeout=httpx.Timeout(10, read=None)) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[len("event: "):]
                elif line.startswith("data: "):
                    self.events.append((event, json.loads(line[len("data: "):])))


class _Pace:
    """The agents' and pollers' input in real time (the correlator steps on new seconds of windows): a
    clean past (delay baselines, no finding), then one second of windows per call; three clean ones first."""

    def __init__(self, api, synth, nats_url: str) -> None:
        self.api, self.synth, self.nats_url = api, synth, nats_url
        self.start = self.t = time.time_ns() // SECOND
        _publish_polled(nats_url, _addresses(synth, self.start - 20))
        _post(api, synth.inventory_records(self.start - 20))
        for t in range(self.start - 15, self.start):
            _post(api, synth.windows(t))
        for _ in range(3):
            self()
        assert _incidents(api) == []

    def __call__(self) -> None:
        _publish_polled(self.nats_url, _poll(self.synth, self.t))
        _post(self.api, self.synth.windows(self.t))
        self.t += 1
        time.sleep(max(0.0, self.t - time.time_ns() / SECOND))


def _single_process(tmp_path, fabric: dict, cable: str, now: int) -> tuple[str, str]:
    """(kind, element) of the first incident the single process (a Service, its own SQLite state)
    opens for the same input through the same entry points (Service.on_ingest, the poller's hook),
    stepped per second."""
    synth = Synth()
    service = Service(make_config(tmp_path / "single", fabric=fabric, polling={"enabled": False}))
    try:
        service.poller.on_records(_addresses(synth, now - 20))
        paths = [r for r in synth.inventory_records(now - 20) if r.measurement == "probe_path"]
        service.on_ingest("probe_paths", paths)
        for t in range(now - 15, now + 15):
            if t == now + 3:
                synth.down.add(cable)
            if t >= now:
                service.poller.on_records(_poll(synth, t))
            service.on_ingest("probe_windows", synth.windows(t))
            for event in service.correlation.step((t + 1) * SECOND):
                if event.event == "opened":
                    return event.incident.kind, event.incident.element
        raise AssertionError("the single process opened no incident")
    finally:
        service.store.close()
        service.state.close()


def _group_state(nats_url: str, consumer: str = "correlate-correlate") -> dict[str, tuple[int, int, int]]:
    """family -> (taken not acknowledged, not yet delivered, stream messages not acknowledged by the
    member's consumer `<group>-<member>`), asked of JetStream directly."""
    import nats

    async def ask():
        nc = await nats.connect(nats_url)
        try:
            js, out = nc.jetstream(), {}
            for family in CORRELATED:
                stream = await js.stream_info(stream_name(PREFIX, family))
                info = await js.consumer_info(stream_name(PREFIX, family), consumer)
                out[family] = (info.num_ack_pending, info.num_pending,
                               stream.state.last_seq - info.ack_floor.stream_seq)
            return out
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_correlate_member_on_the_bus_opens_the_incident_once_across_a_kill(
        nats_server, influxd, postgres_database, tmp_path, members, rx):  # noqa: F811  (the fixture)
    synth = Synth()
    cable = "--".join(sorted(synth.up_link(2, 1).split("->")))
    fabric = synth.fabric.model_dump(mode="json", exclude_none=True)
    dsn = postgres_database()
    # both members run a notifier on the one outbox in PostgreSQL: the incident's webhook goes out once
    sinks = [{"name": "noc", "kind": "webhook", "url": rx.url("/hook")}]
    api = _member(tmp_path, "api", "api", influxd, nats_server.url, dsn, fabric, sinks)
    corr = _member(tmp_path, "correlate", "correlate", influxd, nats_server.url, dsn, fabric, sinks)
    members.extend([api, corr])
    api.start()
    corr.start()
    api.wait_ready()
    corr.wait_ready("correlate feed: consuming")

    stream = _EventStream(api)  # the API worker opens nothing: its stream shows what the member commits
    stream.start()
    pace = _Pace(api, synth, nats_server.url)
    now = pace.start

    synth.down.add(cable)  # the link fails: its paths' windows come back empty
    fault_at = time.monotonic()
    while not (found := _incidents(api)):
        pace()
        assert pace.t - now < 15, f"no incident within 12 s of the fault; correlate log:\n{corr.tail()}"
    [incident] = found
    print(f"incident open {time.monotonic() - fault_at:.1f} s after the first faulty windows were posted")
    # what the single process opens for the same agents' and pollers' input: the cable (the pollers'
    # interface addresses map the traceroute hops to ports; without them both said leaf2)
    expected = _single_process(tmp_path, fabric, cable, now)
    assert expected == ("link_down", cable)
    assert (incident["kind"], incident["element"], incident["state"]) == (*expected, "open"), expected

    wait_until(lambda: ("opened", incident["id"]) in [(e, d["incident"]["id"]) for e, d in stream.events], 10,
               what="the opened event on the API worker's stream", why=lambda: f"{stream.events}")
    # the webhook, sent by one of the two members, and listed by the API worker, which opened nothing
    wait_until(lambda: rx.at("/hook"), 15, what="the incident's webhook", why=corr.tail)
    deliveries = httpx.get(f"{api.url}/notifications/deliveries", headers=auth("read"), timeout=10).json()
    assert [(d["incident_id"], d["event"]) for d in deliveries] == [(incident["id"], "opened")]

    corr.kill(signal.SIGKILL)  # mid-stream: the fault goes on, the API keeps taking windows
    killed_at = time.monotonic()
    for _ in range(3):
        pace()
    corr.start()
    wait_until(lambda: corr.text().count("correlate feed: consuming") == 2, 60,  # the first one's line is there
               what="the restarted correlate member", why=corr.tail)
    restarted_ns = time.time_ns()
    # the restarted member starts with an empty context and re-reads the streams' last
    # cluster.correlate.replay (150 s): the probe paths posted at the start come with it, no retrace needed
    for _ in range(4):
        pace()
    # every window posted since was taken by the member's new consumer and acknowledged
    wait_until(lambda: all(v == (0, 0, 0) for v in _group_state(nats_server.url).values()), 30,
               what="every telemetry message acknowledged by the correlate member",
               why=lambda: f"{_group_state(nats_server.url)}\n{corr.tail()}")
    print(f"every message acknowledged {time.monotonic() - killed_at:.1f} s after the kill")
    found = _incidents(api)
    # not opened again, the same element
    assert [(i["id"], i["element"], i["state"]) for i in found] == [(incident["id"], expected[1], "open")], found
    # continued: the restarted member (it loads the open incidents) refreshes it with its own windows
    deadline = time.monotonic() + 30
    while _incidents(api)[0]["last_seen_ns"] < restarted_ns:
        pace()
        assert time.monotonic() < deadline, f"the restarted member did not continue the incident:\n{corr.tail()}"
    assert len(_incidents(api)) == 1
    # and it said what the single process says at every event, the restarted member's too (its re-read
    # of the streams once read device_down for a few windows, when no switch record reached it)
    events = httpx.get(f"{api.url}/incidents/{incident['id']}/events", headers=auth("read"), timeout=10).json()
    kinds = [(e["event"], e["incident"]["kind"]) for e in events]
    assert {kind for _, kind in kinds} == {expected[0]}, kinds
    sent = [(r.json()["incident"]["id"], r.json()["event"]) for r in rx.at("/hook")]
    assert sent.count((incident["id"], "opened")) == 1, sent  # the restart sent it not again
    assert "Traceback" not in api.text() + corr.text()


def _logged_at(member: Member, line: str, after: int = 0) -> float | None:
    """The epoch time of the first log line holding `line` after the first `after` such lines."""
    found = [row for row in member.text().splitlines() if line in row]
    if len(found) <= after:
        return None
    return datetime.datetime.strptime(found[after][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_two_members_split_by_leaf_open_the_incident_once_across_a_kill_and_a_rejoin(
        nats_server, influxd, postgres_database, tmp_path, members):  # noqa: F811  (the fixture)
    """`partitions: leaf`: the incident is opened by the owner of its element's partition only, with the
    kind and element the single process gives; when that owner is killed (SIGKILL) the other takes its
    partitions within 2 heartbeats, continues the incident (not opened again, still refreshed); when the
    owner rejoins, the split goes back, and it resolves the incident once the link heals."""
    synth = Synth()
    cable = "--".join(sorted(synth.up_link(2, 1).split("->")))
    fabric = synth.fabric.model_dump(mode="json", exclude_none=True)
    dsn = postgres_database()
    shard = {"partitions": "leaf", "heartbeat": HEARTBEAT}
    api = _member(tmp_path, "api", "api", influxd, nats_server.url, dsn, fabric)
    corr = {n: _member(tmp_path, n, "correlate", influxd, nats_server.url, dsn, fabric, **shard)
            for n in ("corr-a", "corr-b")}
    members.extend([api, *corr.values()])
    for m in members:
        m.start()
    api.wait_ready()
    for m in corr.values():
        m.wait_ready("correlate feed: consuming")
    split = Split(synth.fabric, "leaf")
    share = {n: owned(split.parts, corr, n) for n in corr}
    other_of = {"corr-a": "corr-b", "corr-b": "corr-a"}
    # the one that joined last takes its share; the first took everything, then gives the other's
    wait_until(lambda: all(f"{n} takes partitions {_list(share[n])}" in m.text()
                           or f"{n} gives partitions {_list(share[other_of[n]])}" in m.text() for n, m in corr.items()),
               30, what="the split of two members", why=lambda: "\n".join(m.tail() for m in corr.values()))

    pace = _Pace(api, synth, nats_server.url)
    now = pace.start
    synth.down.add(cable)
    while not (found := _incidents(api)):
        pace()
        assert pace.t - now < 15, "no incident within 12 s of the fault:\n" + "\n".join(m.tail() for m in corr.values())
    [incident] = found
    expected = _single_process(tmp_path, fabric, cable, now)
    assert (incident["kind"], incident["element"]) == expected
    [owner] = [n for n in corr if split.owner(incident["element_kind"], incident["element"]) in share[n]]
    [other] = set(corr) - {owner}
    opened = f"incident {incident['id']} opened"
    assert opened in corr[owner].text() and opened not in corr[other].text()

    corr[owner].kill(signal.SIGKILL)
    killed_at = time.time()
    took_line = f"correlate member {other} takes partitions {_list(share[owner])}"
    while (took := _logged_at(corr[other], took_line)) is None:
        pace()
        assert time.time() - killed_at < 15, corr[other].tail()
    print(f"{other} took {owner}'s partitions {took - killed_at:.2f} s after the kill")
    assert took - killed_at <= 2 * HEARTBEAT
    assert f"correlate member {other} continues 1 open incident(s): {incident['id']}" in corr[other].text()
    killed_ns = time.time_ns()
    while _incidents(api)[0]["last_seen_ns"] < killed_ns:  # not orphaned: the survivor refreshes it
        pace()
        assert time.time() - killed_at < 30, corr[other].tail()
    assert [(i["id"], i["state"]) for i in _incidents(api)] == [(incident["id"], "open")]

    # the same line may be in the log from the start (the first split): count, do not search
    gives = f"correlate member {other} gives partitions {_list(share[owner])}"
    gave = corr[other].text().count(gives)
    corr[owner].start()  # rejoins under its name: the split goes back
    wait_until(lambda: corr[owner].text().count("correlate feed: consuming") == 2, 90,
               what="the rejoined member", why=corr[owner].tail)
    wait_until(lambda: corr[other].text().count(gives) > gave, 30, what="the split back", why=corr[other].tail)
    assert f"correlate member {other} hands over 1 open incident(s): {incident['id']}" in corr[other].text()
    # the rejoined owner continues it once it has re-read the streams (not before: it would resolve it
    # for want of findings its empty context cannot give yet)
    wait_until(lambda: f"correlate member {owner} continues 1 open incident(s): {incident['id']}" in
               corr[owner].text(), 30, what="the rejoined owner to continue the incident", why=corr[owner].tail)
    synth.down.discard(cable)  # healed: the owner resolves it after 2 clean windows
    while _incidents(api)[0]["state"] == "open":
        pace()
        assert time.time() - killed_at < 90, corr[owner].tail()
    assert [(i["id"], i["state"]) for i in _incidents(api)] == [(incident["id"], "resolved")]
    resolved = f"incident {incident['id']} resolved"
    assert resolved in corr[owner].text() and resolved not in corr[other].text()
    assert "Traceback" not in "".join(m.text() for m in members)


def _list(parts: set[str]) -> str:
    return "[" + ", ".join(sorted(parts)) + "]"
