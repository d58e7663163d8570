"""The cluster's write path over a 3-node NATS JetStream cluster (replicas 3), with real processes:
three nats-server nodes on loopback (nms/app/local_daemons.py: nats_cluster), influxd, an
`nms serve --role api` and an `nms serve --role write` member listing all three nodes.

While agents' batches are POSTed, a node is killed with SIGKILL, twice: first the node the API is
connected to, then (once that one is back) the leader of the stream the batches go to. Every batch
answered 202 is in InfluxDB exactly once; the batches answered 503 meanwhile are sent again (as an
agent's spool does) and end there too; JetStream keeps one message per batch (its de-duplication
survives the failover); the members reconnect to the surviving nodes by themselves; the killed
node, started again, catches up (every stream's replicas current). Then two nodes die at once (no
quorum): every batch is answered 503 until one is back, and then all of them are stored once.

The streams are made once before the members start, as `nms cluster up` does (cluster_launcher.make_bus).
Members and counting come from tests/test_cluster_write.py; counts are asked of InfluxDB and
JetStream directly, not through the service."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import nats.errors
import pytest
import test_cluster_poll as poll
import test_correlate_shard as shard
from _nats import have_nats_server
from prometheus_client import CollectorRegistry
from test_cluster_write import PREFIX, Member, _count, _points, members  # noqa: F401  (the members fixture)

from nms.app.cluster_launcher import make_bus
from nms.app.correlate_partitions import owned
from nms.app.local_daemons import nats_cluster, start_nats_cluster
from nms.app.telemetry_bus import FAMILIES, TelemetryPublisher, stream_name, stream_specs
from nms.bus import BusError, BusUnavailable
from nms.bus.nats import NatsBus
from nms.config.models import BusConfig
from nms.rendezvous import assign
from tests._fabric_synth import T0, Synth
from tests.helpers import auth, wait_until

pytestmark = pytest.mark.skipif(not have_nats_server(), reason="nats-server not installed: apt-get install nats-server")

ROUND = 40  # batches of 100 points from 4 hosts per killed node
POINTS = 100
KILL_AFTER = 10  # batches of a round acknowledged before the node dies


@pytest.fixture
def nats3(tmp_path):
    nodes = nats_cluster(tmp_path / "nats", 3)
    took = start_nats_cluster(nodes)
    print(f"3-node NATS cluster ready (JetStream metadata leader) in {took:.2f} s")
    yield nodes
    for node in nodes:
        node.cleanup()


def _stream_info(url: str, stream: str) -> tuple[int, str, list[tuple[str, bool]], int]:
    """(configured replicas, leader, [(follower, current)], messages) of a stream, from JetStream."""
    async def ask():
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream(timeout=5).stream_info(stream)
            peers = [(p.name, bool(p.current) and not p.offline) for p in (info.cluster.replicas or [])]
            return info.config.num_replicas, info.cluster.leader, peers, info.state.messages
        finally:
            await nc.close()

    return asyncio.run(ask())


def _connected_url(member: Member) -> str:
    """The NATS node the member is connected to now: its log's last `connected`/`reconnected` line."""
    return re.findall(r"(?:re)?connected to NATS (nats://\S+)", member.text())[-1]


def _reconnects(member: Member) -> list[float]:
    """The epoch times of the member's `reconnected` log lines (its log's timestamps are local)."""
    return [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in member.text().splitlines() if "reconnected to NATS" in line]


class Agent:
    """Sends batches to the API in a thread, each until it is answered 202; a 503 is sent again 0.2 s
    later (what the agent's spool does). Keeps every answer's time and status. After `hold_after`
    acknowledged batches it waits for `release` (the node dies meanwhile: the rest of the round is
    sent after the kill, however fast the first part went)."""

    def __init__(self, api: Member, batches: list[tuple[str, int]], hold_after: int) -> None:
        self.api, self.batches, self.hold_after = api, batches, hold_after
        self.answers: list[tuple[float, int]] = []
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self.release = threading.Event()
        self._pause = threading.Event()  # never set: the pause between tries
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=30) as client:
                for host, b in self.batches:
                    if len(self.acked) == self.hold_after and not self.release.wait(60):
                        raise AssertionError("never released")
                    while True:
                        r = client.post(f"{self.api.url}/ingest/points", json={"items": _points(host, b, POINTS)},
                                        headers=auth("ingest"))
                        self.answers.append((time.time(), r.status_code))
                        if r.status_code == 202:
                            self.acked.append(r.json()["accepted"])
                            break
                        assert r.status_code == 503 and "telemetry bus" in r.text, r.text
                        self._pause.wait(0.2)  # the agent's retry pace, not a clock for a condition
        except BaseException as e:  # reported by the test
            self.errors.append(e)

    def finish(self) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive() and not self.errors, self.errors
        assert self.acked == [POINTS] * len(self.batches)

    def gap(self, kill_at: float) -> tuple[float, int]:
        """(the longest wait from the kill to a 202 or between two 202s after it, 503s answered)."""
        since = [kill_at] + [t for t, status in self.answers if status == 202 and t > kill_at]
        return max(b - a for a, b in zip(since, since[1:], strict=False)), \
            sum(1 for _, status in self.answers if status == 503)


def _wait_current(url: str, when: str) -> None:
    """Every stream's two followers current, as `url`'s node sees them."""
    streams = [stream_name(PREFIX, family) for family in FAMILIES]
    wait_until(lambda: all(len(peers) == 2 and all(ok for _, ok in peers)
                           for _, _, peers, _ in (_stream_info(url, s) for s in streams)), 60,
               what=f"every stream's 3 replicas current {when}",
               ignore=(nats.errors.Error,),  # while a node catches up, a stream info may go unanswered
               why=lambda: [_stream_info(url, s)[2] for s in streams])


def _kill_round(nats3: list, api: Member, writer: Member, round_: int, victim, why: str) -> list[str]:
    """Agents send a round of batches; `victim` is killed once KILL_AFTER of them were acknowledged
    (the agent holds there until it is dead: in a fast round the rest came before the kill, and the
    failover went unmeasured), then started again once the round is through. Returns what was measured."""
    host_stream = stream_name(PREFIX, "host")
    survivors = [node.url for node in nats3 if node is not victim]
    was_leader = victim.server_name == _stream_info(survivors[0], host_stream)[1]
    agent = Agent(api, [(f"h{b % 4}", b) for b in range(round_ * ROUND, (round_ + 1) * ROUND)], KILL_AFTER)
    wait_until(lambda: len(agent.acked) >= KILL_AFTER, 60, what=f"{KILL_AFTER} batches acknowledged", why=api.tail)
    assert victim.proc is not None
    kill_at = time.time()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    victim.proc = None
    agent.release.set()
    agent.finish()
    # the members found a surviving node by themselves
    for member in (api, writer):
        if _connected_url(member) == victim.url:
            wait_until(lambda m=member: _connected_url(m) in survivors, 30, what=f"{member.role} reconnected",
                       why=member.tail)
    assert httpx.get(f"{api.url}/health", timeout=5).json()["bus_ok"] is True
    gap, refused = agent.gap(kill_at)
    reconnected = [t - kill_at for t in _reconnects(api) if t >= kill_at - 0.01]
    measured = [f"{victim.name} killed ({why}{', the stream leader' if was_leader else ''}): 503 answered "
                f"{refused} times, ack gap {gap:.2f} s, "
                f"{f'API reconnected {reconnected[0]:.2f} s after' if reconnected else 'the API was on another node'}"]

    # the killed node, started again on its port and store, catches up: every stream's peers current
    restarted = time.monotonic()
    victim.start()

    _wait_current(survivors[0], "after the node's restart")
    measured.append(f"{victim.name} restarted: its replicas current within {time.monotonic() - restarted:.2f} s")
    return measured


def _no_quorum_round(nats3: list, api: Member, writer: Member, round_: int) -> list[str]:
    """Two of the three nodes die at once (SIGKILL), the API's among them: no quorum, so JetStream
    acknowledges nothing and every ingest is answered 503 (the agent keeps its batches) until one node
    is back; then the round goes through, and the last node, back too, catches up."""
    victims = [next(node for node in nats3 if node.url == _connected_url(api))]
    victims.append(next(node for node in nats3 if node not in victims))
    agent = Agent(api, [(f"h{b % 4}", b) for b in range(round_ * ROUND, (round_ + 1) * ROUND)], KILL_AFTER)
    wait_until(lambda: len(agent.acked) >= KILL_AFTER, 60, what=f"{KILL_AFTER} batches acknowledged", why=api.tail)
    kill_at = time.time()
    for node in victims:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
    for node in victims:
        node.proc.wait(10)
        node.proc = None
    agent.release.set()
    wait_until(lambda: sum(1 for t, status in agent.answers if status == 503 and t > kill_at) >= 3, 60,
               what="ingest answered 503 while JetStream has no quorum", why=api.tail)
    time.sleep(2.0)  # a while without quorum: nothing may be acknowledged
    assert len(agent.acked) == KILL_AFTER and [status for t, status in agent.answers if t > kill_at + 0.5
                                               and status != 503] == [], agent.answers[-5:]
    back_at = time.time()
    victims[0].start()
    agent.finish()
    first = min(t for t, status in agent.answers if status == 202 and t > back_at)
    refused = sum(1 for t, status in agent.answers if status == 503 and t > kill_at)
    victims[1].start()
    _wait_current(next(node for node in nats3 if node not in victims).url, "after both nodes are back")
    return [f"{' and '.join(n.name for n in victims)} killed at once (no quorum): 503 answered {refused} times, "
            f"the first 202 {first - back_at:.2f} s after {victims[0].name} was started again"]


def test_kill_9_of_a_nats_node_loses_and_doubles_nothing(nats3, influxd, tmp_path, members):  # noqa: F811
    urls = [node.url for node in nats3]
    started = time.monotonic()
    make_bus({"cluster": {"bus": {"prefix": PREFIX}}}, urls, None, {"write": 1}, 60.0)
    made = time.monotonic() - started
    database = f"t_{uuid.uuid4().hex[:12]}"
    replicated = {"replicas": 3}
    api = Member(tmp_path, "api", "api", influxd.url, database, urls, bus=replicated)
    writer = Member(tmp_path, "writer", "write", influxd.url, database, urls, bus=replicated)
    members.extend([api, writer])
    api.start()
    writer.start()
    api.wait_ready()
    writer.wait_ready("writer: consuming")
    host_stream = stream_name(PREFIX, "host")
    assert _stream_info(urls[0], host_stream)[0] == 3
    assert "updated" not in api.text() + writer.text()  # the streams were as wanted: no member changed them

    report = [f"streams made in {made:.2f} s"]
    first = next(node for node in nats3 if node.url == _connected_url(api))
    report += _kill_round(nats3, api, writer, 0, first, "the API's node")
    leader = _stream_info(urls[0], host_stream)[1]
    report += _kill_round(nats3, api, writer, 1, next(node for node in nats3 if node.server_name == leader),
                          f"the leader of {host_stream}")
    report += _no_quorum_round(nats3, api, writer, 2)

    total = 3 * ROUND * POINTS
    wait_until(lambda: _count(influxd, database, "bus_test", "seq") == total, 90,
               what=f"all {total} acknowledged points in InfluxDB",
               why=lambda: f"{_count(influxd, database, 'bus_test', 'seq')} there; writer log:\n{writer.tail()}")
    per_host = influxd.query('SELECT count("seq") FROM "bus_test" GROUP BY "host"', db=database)["results"][0]
    assert {s["tags"]["host"]: s["values"][0][1] for s in per_host["series"]} == {f"h{h}": total // 4 for h in range(4)}
    distinct = influxd.query('SELECT count(distinct("seq")) FROM "bus_test"', db=database)["results"][0]
    assert distinct["series"][0]["values"][0][1] == total
    # JetStream stored each batch once: a batch answered 503 and sent again was de-duplicated by its id
    assert _stream_info(urls[0], host_stream)[3] == 3 * ROUND
    assert "Traceback" not in api.text() + writer.text()
    report.append(f"{total} points acknowledged, {_count(influxd, database, 'bus_test', 'seq')} in InfluxDB")
    print("; ".join(report))


def test_poll_members_keep_their_switches_when_their_buckets_leader_dies(nats3, snmpd, tmp_path):
    """Two poll members on the 3-node cluster, their membership bucket on 3 replicas: the node leading
    the bucket is killed. The bucket answers no put for the election (seconds, longer than an entry's
    life), so every entry may have expired when it answers again; no switch moves meanwhile or after
    (nms/app/membership.py: for a heartbeat after the bus answers again nobody is counted gone), and
    every switch is polled again by its owner."""
    config = poll.cluster_config(tmp_path, [node.url for node in nats3], poll.snmp_switches(snmpd),
                                 heartbeat=poll.OUTAGE_HEARTBEAT, replicas=3)
    bucket = "KV_t_members_poll"

    async def run():
        pollers = [await poll.Member(config, name).start() for name in ("poll-a", "poll-b")]
        try:
            expected = assign(poll.SWITCHES, [m.name for m in pollers])
            await poll.until(lambda: all(m.scheduled() == expected[m.name] for m in pollers), 10,
                             "the shares scheduled")
            replicas, leader, _, _ = await asyncio.to_thread(_stream_info, nats3[0].url, bucket)
            assert replicas == 3
            victim = next(node for node in nats3 if node.server_name == leader)
            moved = [poll.handovers(m) for m in pollers]
            killed_ns = time.time_ns()
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            victim.proc = None
            # the election and what follows, watched until two heartbeats after the bucket answers every
            # member again: the shares never change
            def kept() -> None:
                assert all(m.scheduled() == expected[m.name] for m in pollers), [m.scheduled() for m in pollers]

            saw_down, cap = False, time.monotonic() + 15
            while not (saw_down and all(m.shard._bus_ok for m in pollers)) and time.monotonic() < cap:
                saw_down |= not all(m.shard._bus_ok for m in pollers)
                kept()
                await asyncio.sleep(0.05)
            back = time.monotonic()
            while time.monotonic() < back + 2 * poll.OUTAGE_HEARTBEAT:
                kept()
                await asyncio.sleep(0.05)
            assert [poll.handovers(m) for m in pollers] == moved
            assert all(m.shard.members == ("poll-a", "poll-b") for m in pollers)

            def polled_since_the_kill() -> bool:
                return all((st := m.poller.status[("snmp", s)]).last_success_ns and st.last_success_ns > killed_ns
                           for m in pollers for s in expected[m.name])
            await poll.until(polled_since_the_kill, 15, "every switch polled by its owner after the kill")
        finally:
            for m in pollers:
                await m.stop()

    poll.bounded(run())


async def _windows_publisher(urls: list[str]) -> tuple[NatsBus, Any]:
    """The publishers' own connection to the 3-node cluster (streams made, 3 replicas), and
    publish(synth, t, sent) -> publishes refused: second t's windows, sent again until acknowledged
    (as the agents' spools do), added to `sent` once they were."""
    bus_cfg = BusConfig(servers=urls, prefix="cs", replicas=3)
    pub_bus = NatsBus(bus_cfg)
    await pub_bus.connect()
    deadline = time.monotonic() + 30
    while True:  # a loaded machine: the nodes may not all be JetStream peers yet ("no suitable peers")
        try:
            await pub_bus.ensure_streams(stream_specs(bus_cfg))
            break
        except BusError as e:
            if "no suitable peers" not in str(e) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    publisher = TelemetryPublisher(pub_bus, bus_cfg, CollectorRegistry())

    async def publish(synth: Synth, t: int, sent: list) -> int:
        windows, refused = synth.windows(T0 + t), 0
        while True:
            try:
                await publisher.publish("probe_windows", windows)
                break
            except BusUnavailable:
                refused += 1
                await asyncio.sleep(0.2)
        sent.extend(windows)
        return refused
    return pub_bus, publish


def test_correlate_members_are_handed_every_window_once_when_the_stream_leader_dies(nats3):
    """Two correlate members (tests/test_correlate_shard.py: `partitions: leaf` on the synthetic
    fabric) on the 3-node cluster, streams and bucket on 3 replicas. Windows are published second by
    second (a batch not acknowledged is sent again, as the agents' spools do) while the node leading
    the probe stream is killed: each member is handed every window of its partitions and none twice
    (the correlator adds a window's counts: twice would double them), and no partition moves."""
    synth = Synth()
    urls = [node.url for node in nats3]

    async def run():
        pub_bus, publish_windows = await _windows_publisher(urls)
        sent: list = []
        refused = 0

        async def publish(t: int) -> None:
            nonlocal refused
            refused += await publish_windows(synth, t, sent)

        correlators = [await shard.Member(urls, name, synth, heartbeat=poll.OUTAGE_HEARTBEAT, replicas=3).start()
                   for name in ("corr-a", "corr-b")]
        try:
            split = correlators[0].feed.partitions
            expected = {m.name: owned(split, ("corr-a", "corr-b"), m.name) for m in correlators}
            await poll.until(lambda: all(m.feed.owned == expected[m.name] for m in correlators), 15, "the split")
            for t in range(3):
                await publish(t)
            await poll.until(lambda: not any(m.missing(sent) for m in correlators), 15, "the first windows handed")
            probe = stream_name("cs", "probe")
            leader = (await asyncio.to_thread(_stream_info, urls[0], probe))[1]
            victim = next(node for node in nats3 if node.server_name == leader)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            victim.proc = None
            for t in range(3, 14):  # through the election: a refused publish is sent again until acknowledged
                await publish(t)
                await asyncio.sleep(0.5)
                assert all(m.feed.owned == expected[m.name] for m in correlators), [m.feed.owned for m in correlators]
            await poll.until(lambda: not any(m.missing(sent) for m in correlators), 30, "every window to its owners",
                             step=0.2)
            assert [m.twice() for m in correlators] == [[], []]
            assert all(m.feed.owned == expected[m.name] for m in correlators)
            return refused
        finally:
            for m in correlators:
                await m.stop()
            await pub_bus.close()

    refused = poll.bounded(run())
    print(f"publishes refused during the election: {refused}")


def test_three_correlate_members_take_over_a_dead_ones_partitions_while_a_nats_node_dies(nats3):
    """Three correlate members on the 3-node cluster; one member and the node leading the probe stream
    are killed at once (a machine holding both dies): the two others take the dead member's
    partitions (the rendezvous split of the survivors) and re-read them from the stream through the
    election; every window of each survivor's partitions is handed to it once."""
    synth = Synth()
    urls = [node.url for node in nats3]
    names = ("corr-a", "corr-b", "corr-c")

    async def run():
        pub_bus, publish_windows = await _windows_publisher(urls)
        sent: list = []

        async def publish(t: int) -> None:
            await publish_windows(synth, t, sent)

        correlators = [await shard.Member(urls, name, synth, heartbeat=poll.OUTAGE_HEARTBEAT, replicas=3).start()
                       for name in names]
        try:
            split = correlators[0].feed.partitions
            expected = {m.name: owned(split, names, m.name) for m in correlators}
            assert sum(bool(p) for p in expected.values()) >= 2, expected  # the dead one's share must move
            await poll.until(lambda: all(m.feed.owned == expected[m.name] for m in correlators), 15, "the split")
            for t in range(3):
                await publish(t)
            await poll.until(lambda: not any(m.missing(sent) for m in correlators), 15, "the first windows handed")
            dead = max(correlators, key=lambda m: len(expected[m.name]))
            survivors = [m for m in correlators if m is not dead]
            after = {m.name: owned(split, [s.name for s in survivors], m.name) for m in survivors}
            leader = (await asyncio.to_thread(_stream_info, urls[0], stream_name("cs", "probe")))[1]
            victim = next(node for node in nats3 if node.server_name == leader)
            victim.proc.send_signal(signal.SIGKILL)
            await dead.kill()
            victim.proc.wait(10)
            victim.proc = None
            for t in range(3, 16):
                await publish(t)
                await asyncio.sleep(0.5)
            await poll.until(lambda: all(m.feed.owned == after[m.name] for m in survivors), 30,
                             "the survivors to own the dead member's partitions")
            await poll.until(lambda: not any(m.missing(sent) for m in survivors), 30, "every window to its owners",
                             step=0.2)
            assert [m.twice() for m in survivors] == [[], []]
            return dead.name, sorted(expected[dead.name])
        finally:
            for m in correlators:
                await m.stop()
            await pub_bus.close()

    dead, parts = poll.bounded(run())
    print(f"{dead}'s partitions {parts} taken over through a NATS node's death")
