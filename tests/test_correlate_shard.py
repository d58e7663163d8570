"""Correlation sharded by fabric partition, at the feed (nms/app/correlate_feed.py): two `correlate`
members (each its own NATS connection, membership and durable consumer) on a real nats-server with
JetStream (tests/_nats.py), `partitions: leaf` on the synthetic fabric (tests/_fabric_synth.py: 3
leaves, 2 spines, 6 hosts; its windows are the record models the agents send), published by the API's
own publisher. Each member must get every window of the partitions it owns and no window twice (the
correlator adds a window's counts to its slot), across a join, a kill -9 (no leave: the survivor takes
the partitions within 2 heartbeats and re-reads them from the stream) and a rejoin.
tests/test_cluster_correlate.py runs the same with real processes up to the incident."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from prometheus_client import CollectorRegistry
from test_cluster_poll import bounded, until

from nms.app import polled
from nms.app.correlate_feed import CorrelateFeed
from nms.app.correlate_partitions import owned
from nms.app.polled import PolledPublisher
from nms.app.telemetry_bus import CORRELATED, POLLED_KINDS, TelemetryPublisher, stream_name, stream_specs
from nms.bus.nats import NatsBus
from nms.config.models import BusConfig, CorrelateFeedConfig
from nms.records import LldpNeighbor
from tests._fabric_synth import Synth

HEARTBEAT = 1.0
T0 = 1_700_000_000


def _key(w) -> tuple:
    return w.src_host, w.src_nic, w.dst_host, w.dst_nic, w.path_id, w.window_start


class Member:
    def __init__(self, nats_url: str | list[str], name: str, synth: Synth, heartbeat: float = HEARTBEAT,
                 replicas: int = 1) -> None:
        self.bus_cfg = BusConfig(servers=[nats_url] if isinstance(nats_url, str) else nats_url, prefix="cs",
                                 replicas=replicas)
        self.cfg = CorrelateFeedConfig(member=name, partitions="leaf", heartbeat=heartbeat, replay=60,
                                       fetch_timeout=0.2, batch_messages=64)
        self.synth, self.name = synth, name
        self.handed: Counter[tuple] = Counter()
        self.polled: list[tuple[str, object]] = []  # (kind, record) of the switch records handed
        self.down = False

    def on_ingest(self, kind: str, records: list) -> list:
        if kind == "probe_windows":
            self.handed.update(_key(w) for w in records)
        elif kind in POLLED_KINDS:
            self.polled += [(kind, r) for r in records]
        return records

    async def start(self) -> Member:
        self.bus = NatsBus(self.bus_cfg)
        await self.bus.connect()
        await self.bus.ensure_streams(stream_specs(self.bus_cfg))
        self.feed = CorrelateFeed(self.bus, self.bus_cfg, self.cfg, self.synth.fabric, self.on_ingest,
                                  CollectorRegistry())
        await self.feed.start()
        return self

    def missing(self, windows: list) -> list:
        """Windows of this member's partitions it was not handed."""
        return [w for w in windows if self.feed.split.of_record("probe_windows", w) & self.feed.owned
                and _key(w) not in self.handed]

    def twice(self) -> list:
        return [k for k, n in self.handed.items() if n > 1]

    async def kill(self) -> None:
        """Stop at once without leaving (kill -9): no more heartbeats, the connection closed."""
        self.down = True
        self.feed._stopping.set()
        for task in [*self.feed._tasks, self.feed._task]:
            task.cancel()
        await self.bus._nc.close()

    async def stop(self) -> None:
        if self.down:
            return
        self.down = True
        await self.feed.stop()
        await self.bus.close()


async def _publishing_bus(url: str) -> tuple[NatsBus, BusConfig]:
    """The publishers' own connection, with the streams made."""
    bus_cfg = BusConfig(servers=[url], prefix="cs")
    bus = NatsBus(bus_cfg)
    await bus.connect()
    await bus.ensure_streams(stream_specs(bus_cfg))
    return bus, bus_cfg


def test_two_members_split_the_windows_by_partition_across_a_kill_and_a_rejoin(nats_server):
    synth = Synth()

    async def run():
        pub_bus, bus_cfg = await _publishing_bus(nats_server.url)
        publisher = TelemetryPublisher(pub_bus, bus_cfg, CollectorRegistry())
        sent: list = []

        async def publish(seconds: range) -> None:
            for t in seconds:
                windows = synth.windows(T0 + t)
                await publisher.publish("probe_windows", windows)
                sent.extend(windows)

        await publish(range(0, 5))  # before any member: the first one reads them from the stream
        a = await Member(nats_server.url, "corr-a", synth).start()
        b = await Member(nats_server.url, "corr-b", synth).start()
        members = [a, b]
        try:
            split = a.feed.partitions
            expected = {m.name: owned(split, ("corr-a", "corr-b"), m.name) for m in members}
            assert all(expected.values())
            await until(lambda: all(m.feed.owned == expected[m.name] for m in members), 10, "the split")
            await publish(range(5, 10))
            await until(lambda: not a.missing(sent) and not b.missing(sent), 15, "every window to its owners")
            assert a.twice() == [] and b.twice() == []
            # a window between two of b's leaves never reaches a (b's partitions only: no core, no leaf3)
            only_b = [w for w in sent if a.feed.split.of_record("probe_windows", w) <= expected["corr-b"]]
            assert only_b and not any(_key(w) in a.handed for w in only_b if w.window_start >= (T0 + 5) * 10**9)
            assert a.feed.owned_gauge._value.get() == len(expected["corr-a"])

            await b.kill()
            killed = time.monotonic()
            feeding = asyncio.create_task(publish(range(10, 14)))
            await until(lambda: a.feed.owned == set(split), 10, "corr-a to take every partition")
            took = time.monotonic() - killed
            assert took <= 2 * HEARTBEAT, f"took {took:.2f} s, more than 2 heartbeats"
            await feeding
            await until(lambda: not a.missing(sent), 15, "corr-a to have every window, b's re-read from the stream")
            assert a.twice() == [], f"{len(a.twice())} windows handed twice to corr-a"
            assert a.feed.replayed._value.get() > 0

            b2 = await Member(nats_server.url, "corr-b", synth).start()  # rejoins under its name
            members = [a, b2]
            await until(lambda: all(m.feed.owned == expected[m.name] for m in members), 10, "the split back")
            await publish(range(14, 16))
            await until(lambda: not b2.missing(sent), 15, "corr-b to have its windows again")
            assert b2.twice() == [] and a.twice() == []
            await a.stop()
            await b2.stop()
            # a clean stop deletes the member's consumers; the killed one's were deleted by its rejoin
            left = [c.name for f in CORRELATED for c in await pub_bus._js.consumers_info(stream_name("cs", f))]
            assert left == [], left
            return took
        finally:
            for m in members:
                await m.stop()
            await pub_bus.close()

    took = bounded(run())
    print(f"corr-b's partitions taken by corr-a {took:.2f} s after the kill")


def test_a_poll_members_switch_records_reach_every_correlate_member(nats_server, monkeypatch):
    """What a poll member publishes (PolledPublisher, fed as the poller's hook feeds it): the records the
    correlator reads reach both members of a leaf split, a spine's too (its ports end leaves' links), the
    others (LLDP) go out for the members' views only (nms/app/polled_view.py), not to the correlator;
    a device's addresses go out again with its poll once ADDRESSES_AGAIN_S
    passed; with the bus gone, submitting holds nothing up and the records are counted as failed."""
    monkeypatch.setattr(polled, "ADDRESSES_AGAIN_S", 0.5)
    synth = Synth()

    async def run():
        pub_bus, bus_cfg = await _publishing_bus(nats_server.url)
        a = await Member(nats_server.url, "corr-a", synth).start()
        b = await Member(nats_server.url, "corr-b", synth).start()
        members = [a, b]
        try:
            await until(lambda: a.feed.owned and b.feed.owned and not a.feed.owned & b.feed.owned, 10, "the split")
            addresses = [r for r in synth.inventory_records(T0, with_paths=False) if r.device in ("spine1", "leaf2")]
            recent = {d: [r for r in addresses if r.device == d] for d in ("spine1", "leaf2")}
            publisher = PolledPublisher(TelemetryPublisher(pub_bus, bus_cfg, CollectorRegistry()),
                                        lambda device: recent.get(device, []), CollectorRegistry())
            poll = [r for r in synth.switch_records(T0) if getattr(r, "device", None) in ("spine1", "leaf2")]
            neighbor = LldpNeighbor(device="spine1", port="swp2", ts=T0 * 10**9, remote_name="leaf2",
                                    remote_port="swp3")
            publisher.submit(poll + addresses + [neighbor])
            sent = sorted((type(r).__name__, r.device, r.port) for r in poll + addresses)
            got = lambda m: sorted((type(r).__name__, r.device, r.port) for _, r in m.polled)  # noqa: E731
            await until(lambda: got(a) == sent and got(b) == sent, 10, "every switch record to both members")
            assert {k for k, _ in a.polled} == {"port_samples", "port_rates", "interface_addresses"}

            # the next poll, without an address walk: the addresses go again once ADDRESSES_AGAIN_S passed
            def poll_at(t: int) -> list:
                return [r for r in synth.switch_records(t) if getattr(r, "device", None) in ("spine1", "leaf2")]

            before = len(a.polled)
            publisher.submit(poll_at(T0 + 1))
            await until(lambda: len(a.polled) == before + len(poll), 10, "the second poll")
            await asyncio.sleep(0.6)
            publisher.submit(poll_at(T0 + 2))
            await until(lambda: len(a.polled) == before + 2 * len(poll) + len(addresses), 10, "the addresses again")
            assert publisher.records.labels("published")._value.get() == 3 * len(poll) + 2 * len(addresses) + 1

            await pub_bus.close()  # the bus is gone: a poll's submit returns at once, the copy is counted failed
            started = time.monotonic()
            publisher.submit(poll_at(T0 + 3))
            assert time.monotonic() - started < 0.1
            await publisher.close()
            assert publisher.records.labels("failed")._value.get() == len(poll)
        finally:
            for m in members:
                await m.stop()
            await pub_bus.close()

    bounded(run())
