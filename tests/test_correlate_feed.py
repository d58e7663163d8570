"""The correlate feed (nms/app/correlate_feed.py) on a real nats-server: telemetry published by the
API's publisher reaches the entry point once, acknowledged after it returned; a message delivered
again to the member that already handed it (its acknowledgement was lost) is acknowledged without
being handed twice (the correlator adds a window's counts to its slot: twice would double them); a
message that is no telemetry batch is terminated, not handed."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from nms.app.correlate_feed import CorrelateFeed
from nms.app.telemetry_bus import TelemetryPublisher, stream_name, stream_specs
from nms.bus.nats import NatsBus
from nms.config.models import BusConfig, CorrelateFeedConfig, FabricConfig
from nms.records import ProbeWindow

T0 = 1_764_000_000_000_000_000


class LostAck:
    """A delivered message whose acknowledgement never reaches the server (a connection dropped
    right after): everything else is the real message."""

    def __init__(self, msg) -> None:
        self.msg, self.subject, self.data = msg, msg.subject, msg.data
        self.deliveries, self.seq, self.pending = msg.deliveries, msg.seq, msg.pending

    async def ack(self) -> None:
        pass


def _window(i: int) -> ProbeWindow:
    return ProbeWindow(src_host="h1", src_nic="eth0", dst_host="h2", dst_nic="eth0", path_id="0",
                       window_start=T0 + i * 10**9, sent=100, received=100 - i)


def test_feed_hands_each_message_once_and_acks_after(nats_server):
    async def scenario():
        cfg = BusConfig(servers=[nats_server.url], prefix="cf")
        bus = NatsBus(cfg)
        await bus.connect()
        await bus.ensure_streams(stream_specs(cfg))
        handed: list[tuple[str, list]] = []
        feed = CorrelateFeed(bus, cfg, CorrelateFeedConfig(ack_wait=1.0), FabricConfig(),
                             lambda k, r: handed.append((k, r)) or r,
                             CollectorRegistry())
        await feed.join()  # the only member of its group: it owns the one partition (`fabric`)
        assert feed.owned == {"fabric"}
        await TelemetryPublisher(bus, cfg, CollectorRegistry()).publish("probe_windows", [_window(1), _window(2)])
        consumer = await bus.consumer(stream_name("cf", "probe"), "correlate", "cf.tel.probe.>", 1.0, 16)
        [msg] = await consumer.fetch(10, 2.0)
        await feed.handle("probe", LostAck(msg))  # handed, but the ack is lost
        assert [(k, [w.received for w in r]) for k, r in handed] == [("probe_windows", [99, 98])]
        [again] = await consumer.fetch(10, 4.0)  # after ack_wait: delivered again
        assert (again.deliveries, again.seq) == (2, msg.seq)
        await feed.handle("probe", again)
        assert len(handed) == 1  # not handed twice
        assert feed.messages.labels("probe", "already_taken")._value.get() == 1
        assert await consumer.fetch(10, 1.5) == []  # acknowledged this time

        await bus.publish("cf.tel.probe.probe_windows.h1", b'{"items": [{"bad": 1}]}')
        [bad] = await consumer.fetch(10, 2.0)
        await feed.handle("probe", bad)
        assert len(handed) == 1 and feed.messages.labels("probe", "undecodable")._value.get() == 1
        assert await consumer.fetch(10, 1.5) == []  # terminated: not delivered again
        await feed.leave()
        await bus.close()

    asyncio.run(scenario())
