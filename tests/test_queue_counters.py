"""Egress queue counters -> QueueRates: the counter math of ports applied to queues (nms/counters.py),
the records' rules, and the poller storing both."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nms.counters import ABSOLUTE_MAX_BPS, MIN_FRAME_WIRE_BITS, U32, RateTracker, queue_rates
from nms.records import INGEST_KINDS, QueueRates, QueueSample

T0 = 1_700_000_000 * 10**9
S = 10**9
TC_BITS = {"dropped_pkts": 32}  # a Linux qdisc's drop counter is 32-bit
G1 = 10**9


def q(ts=T0, queue="root", **kw) -> QueueSample:
    return QueueSample(device="spine1", port="l2", queue=queue, ts=ts, **kw)


def test_exact_rates_of_every_counter():
    a = q(transmit_pkts=100, transmit_octets=1_000, dropped_pkts=7, dropped_octets=0, ecn_marked_pkts=3)
    b = q(ts=T0 + 2 * S, transmit_pkts=100 + 20_000, transmit_octets=1_000 + 25_000_000, dropped_pkts=7 + 400,
          dropped_octets=600_000, ecn_marked_pkts=3 + 10)
    r = queue_rates(a, b, TC_BITS, G1).rates
    assert isinstance(r, QueueRates)
    assert (r.transmit_pps, r.transmit_bps, r.dropped_pps, r.dropped_bps, r.ecn_marked_pps) == (
        10_000.0, 100_000_000.0, 200.0, 2_400_000.0, 5.0)
    assert r.interval_s == 2.0 and (r.device, r.port, r.queue, r.ts) == ("spine1", "l2", "root", T0 + 2 * S)


def test_missing_counters_give_no_rate_not_zero():
    r = queue_rates(q(transmit_pkts=1), q(ts=T0 + S, transmit_pkts=11, dropped_pkts=5), {}).rates
    assert r.transmit_pps == 10.0
    assert r.dropped_pps is None and r.ecn_marked_pps is None and r.transmit_bps is None


def test_32_bit_drop_counter_wraps_once():
    a = q(dropped_pkts=U32 - 100, transmit_pkts=10)
    b = q(ts=T0 + S, dropped_pkts=50, transmit_pkts=20)
    assert queue_rates(a, b, TC_BITS).rates.dropped_pps == 150.0


def test_64_bit_counter_going_back_drops_the_interval():
    # the qdisc was replaced by another kind: every counter restarts at 0
    a = q(transmit_pkts=1_000_000, transmit_octets=10**9, dropped_pkts=5_000)
    b = q(ts=T0 + S, transmit_pkts=10, transmit_octets=1_000, dropped_pkts=0)
    res = queue_rates(a, b, TC_BITS)
    assert res.rates is None and "reset" in res.dropped


def test_32_bit_reset_that_no_wrap_explains_drops_the_interval():
    # drops went from 4e9 to 3: as a wrap that is 2^32 - 4e9 + 3 drops in 0.2 s on a 1 Gbit/s port...
    # drops are bounded only absolutely (incast); make the wrap absurd against that bound
    a = q(dropped_pkts=10, transmit_pkts=5)
    b = q(ts=T0 + S // 5, dropped_pkts=5, transmit_pkts=6)
    res = queue_rates(a, b, TC_BITS)
    assert res.rates is None and "no single wrap" in res.dropped


def test_transmit_above_line_rate_is_left_out_drops_are_not_bounded_by_the_port():
    a = q(transmit_octets=0, dropped_octets=0)
    # 5 Gbit/s transmitted on a 1 Gbit/s port: impossible; 3 Gbit/s dropped: incast, possible
    b = q(ts=T0 + S, transmit_octets=625_000_000, dropped_octets=375_000_000)
    res = queue_rates(a, b, {}, G1)
    assert res.rates.transmit_bps is None and res.implausible == ("transmit_octets",)
    assert res.rates.dropped_bps == 3 * 10**9


def test_short_interval_and_other_queue():
    assert queue_rates(q(), q(ts=T0 + 1000), {}).rates is None
    with pytest.raises(ValueError):
        queue_rates(q(), q(ts=T0 + S, queue="1:10"), {})


def test_tracker_keys_queues_apart_from_each_other_and_from_ports():
    t = RateTracker(TC_BITS)
    assert t.update(q(dropped_pkts=0)).dropped == "first sample"
    assert t.update(q(queue="1:10", dropped_pkts=100)).dropped == "first sample"
    r = t.update(q(ts=T0 + S, dropped_pkts=30), speed_bps=G1).rates
    assert r.dropped_pps == 30.0 and r.queue == "root"
    assert t.update(q(ts=T0 + S, dropped_pkts=30)).dropped == "sample is not newer than the previous one"


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, U32 - 1), delta=st.integers(0, U32 - 1), dt_ms=st.integers(100, 60_000))
def test_32_bit_drops_never_give_an_absurd_rate(start, delta, dt_ms):
    a = q(dropped_pkts=start)
    b = q(ts=T0 + dt_ms * 10**6, dropped_pkts=(start + delta) % U32)
    res = queue_rates(a, b, TC_BITS, G1)
    limit = ABSOLUTE_MAX_BPS / MIN_FRAME_WIRE_BITS
    if res.rates is not None and res.rates.dropped_pps is not None:
        assert res.rates.dropped_pps == pytest.approx(delta * 1000 / dt_ms) and res.rates.dropped_pps <= limit


def test_record_rules():
    with pytest.raises(ValidationError):
        q(dropped_pkts=-1)
    with pytest.raises(ValidationError):
        q(dropped_pkts=True)  # strict: a boolean is not a counter
    with pytest.raises(ValidationError):
        q(dropped_pkts=1 << 64)
    with pytest.raises(ValidationError):
        QueueSample(device="a", port="b", queue="", ts=T0)
    p = q(transmit_pkts=5, ecn_marked_pkts=None).to_point()
    assert p.measurement == "queue_counters" and p.tags == {"device": "spine1", "port": "l2", "queue": "root"}
    assert p.fields == {"transmit_pkts": 5}  # not counted = absent, never 0
    assert INGEST_KINDS["queue_samples"] is QueueSample and INGEST_KINDS["queue_rates"] is QueueRates


def test_poller_stores_queue_samples_and_their_rates(tmp_path):
    """A poll's QueueSamples go to the store with the QueueRates derived from them (the port's speed,
    from its PortSample, bounding what the queue transmits)."""
    import asyncio

    import yaml

    from collectors.base import Collector, PollResult
    from nms.app.polling import Poller
    from nms.config import parse_config
    from nms.records import PortSample
    from nms.store import WriteResult

    class Store:
        points: list = []

        def write(self, points):
            self.points += points
            return WriteResult(accepted=len(points))

    class Fake(Collector):
        name = "gnmi"
        counter_bits = {"dropped_pkts": 32}

        async def collect(self, device):
            raise AssertionError("not polled here")

    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path), "fabric": {"switches": [
        {"name": "spine1", "mgmt_address": "192.0.2.1", "collectors": {"gnmi": {"insecure": True}}}]}}))
    seen: list = []
    store = Store()
    poller = Poller(cfg, store, registry=None, collectors={"gnmi": Fake()}, on_records=seen.extend)

    def result(ts, drops, sent):
        port = PortSample(device="spine1", port="l2", ts=ts, out_octets=sent * 1500, speed_bps=10**9)
        queues = [q(ts=ts, transmit_pkts=sent, transmit_octets=sent * 1500, dropped_pkts=drops),
                  q(ts=ts, queue="1:10", transmit_pkts=0, dropped_pkts=0)]
        return PollResult(device="spine1", collector="gnmi", started_ns=ts, records=[port, *queues],
                          counter_bits=Fake.counter_bits)

    asyncio.run(poller.ingest(result(T0, U32 - 10, 1000)))
    asyncio.run(poller.ingest(result(T0 + S, 90, 1000 + 80_000)))  # drops wrapped: +100
    rates = {r.queue: r for r in seen if isinstance(r, QueueRates)}
    assert rates["root"].dropped_pps == 100.0 and rates["root"].transmit_bps == 80_000 * 1500 * 8
    assert rates["1:10"].dropped_pps == 0.0
    stored = {(p.measurement, p.tags.get("queue")) for p in store.points}
    assert {("queue_counters", "root"), ("queue_rates", "root"), ("queue_rates", "1:10")} <= stored
