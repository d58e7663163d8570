"""Counter math and link-state tracking: exact cases and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nms.counters import (
    ABSOLUTE_MAX_BPS,
    MIN_FRAME_WIRE_BITS,
    U32,
    U64,
    RateTracker,
    counter_delta,
    counter_width,
    max_rate,
    port_rates,
    uptime_restarted,
)
from nms.linkstate import LinkStateTracker
from nms.records import PortSample

T0 = 1_700_000_000 * 10**9
S = 10**9
SNMP_BITS = {"in_errors": 32, "out_errors": 32, "in_discards": 32, "out_discards": 32}
G100 = 100 * 10**9


def sample(ts=T0, uptime=100_000, **kw) -> PortSample:
    return PortSample(device="leaf1", port="swp1", ts=ts, uptime_ticks=uptime, **kw)


# --- exact cases -------------------------------------------------------------------------------


def test_plain_delta_gives_exact_rate_and_utilization():
    a = sample(in_octets=1_000, out_octets=0, in_errors=5, speed_bps=10**9)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=1_000 + 125_000_000, out_octets=12_500_000,
               in_errors=15, speed_bps=10**9)
    r = port_rates(a, b, SNMP_BITS).rates
    assert r.in_bps == 100_000_000.0 and r.out_bps == 10_000_000.0
    assert r.in_utilization == pytest.approx(0.1) and r.in_errors_ps == 1.0 and r.interval_s == 10.0


def test_100g_counter_near_2_64_keeps_full_precision():
    # float64 would lose the low bits of values near 2^64 (1 ulp = 4096 bytes there)
    start = U64 - 10 * 12_500_000_000 - 7
    a = sample(in_octets=start, speed_bps=G100)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=start + 10 * 12_500_000_000 + 3, speed_bps=G100)
    r = port_rates(a, b, {}).rates
    assert r.in_bps == (10 * 12_500_000_000 + 3) * 8 / 10
    assert float(start + 10) - float(start) != 10  # the trap being avoided


def test_32_bit_wrap_is_one_wrap():
    assert counter_delta(U32 - 10, 5, 32) == 15
    a = sample(in_errors=U32 - 10, speed_bps=10**9)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_errors=5, speed_bps=10**9)
    assert port_rates(a, b, SNMP_BITS).rates.in_errors_ps == 1.5


def test_32_bit_octet_counters_of_a_sample_wrap_at_2_32():
    """An ifTable-only device's octets (PortSample.counter_bits = 32): a wrap is a wrap; the same
    numbers from 64-bit counters are a reset."""
    a = sample(in_octets=U32 - 1000, out_octets=U32 - 1, in_pkts=U32 - 2, speed_bps=10**8)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=500, out_octets=124, in_pkts=8, speed_bps=10**8)
    r = port_rates(a.model_copy(update={"counter_bits": 32}), b.model_copy(update={"counter_bits": 32}),
                   SNMP_BITS).rates
    assert r.in_bps == 1500 * 8 / 10 and r.out_bps == 125 * 8 / 10 and r.in_utilization == 1200 / 10**8
    assert "reset" in port_rates(a, b, SNMP_BITS).dropped


def test_32_bit_wrap_of_a_sample_that_no_single_wrap_explains_is_dropped():
    # 1 Gbit/s: (2^32 - 3e9 + 10) packets in 10 s is 129 M packets/s, above the 2.2 M/s the link carries
    a = sample(in_pkts=3_000_000_000, in_octets=0, speed_bps=10**9, counter_bits=32)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_pkts=10, in_octets=100, speed_bps=10**9, counter_bits=32)
    res = port_rates(a, b, SNMP_BITS)
    assert res.rates is None and "in_pkts" in res.dropped and "wrap" in res.dropped


def test_a_changed_counter_width_drops_the_interval():
    """ifTable counters one poll, ifXTable the next (new firmware): different counters, no delta."""
    t = RateTracker(SNMP_BITS)
    t.update(sample(in_octets=1000, counter_bits=32))
    res = t.update(sample(ts=T0 + 10 * S, uptime=101_000, in_octets=2000))
    assert res.rates is None and "width changed" in res.dropped
    assert t.update(sample(ts=T0 + 20 * S, uptime=102_000, in_octets=3000)).rates.in_bps == 800.0
    assert counter_width(sample(counter_bits=32), "in_errors", {}) == 64  # errors: the collector's widths
    assert counter_width(sample(counter_bits=32), "out_pkts", {}) == 32


def test_64_bit_counter_going_back_is_a_reset_and_drops_the_interval():
    assert counter_delta(10**12, 5, 64) is None
    a = sample(in_octets=10**12, speed_bps=10**9)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=5, speed_bps=10**9)
    res = port_rates(a, b, SNMP_BITS)
    assert res.rates is None and "reset" in res.dropped


def test_32_bit_reset_that_no_single_wrap_explains_is_dropped():
    # 1 Gbit/s port: 1.5 M errors/s is not possible, so the "wrap" was a reset
    a = sample(in_errors=3_000_000_000, speed_bps=10**9)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_errors=10, speed_bps=10**9)
    res = port_rates(a, b, SNMP_BITS)
    assert res.rates is None and "wrap" in res.dropped


def test_reboot_drops_the_interval():
    a = sample(in_octets=10**9, uptime=500_000)
    b = sample(ts=T0 + 10 * S, uptime=300, in_octets=2 * 10**9)
    res = port_rates(a, b, {})
    assert res.rates is None and "restarted" in res.dropped


def test_reboot_in_between_polls_is_seen_though_uptime_grew():
    a = sample(in_octets=10**9, uptime=1_000)       # up 10 s
    b = sample(ts=T0 + 600 * S, uptime=5_000, in_octets=2 * 10**9)  # 10 min later: up only 50 s
    assert "restarted" in port_rates(a, b, {}).dropped


def test_sysuptime_wrap_after_497_days_is_not_a_reboot():
    a = sample(in_octets=0, uptime=U32 - 500)
    b = sample(ts=T0 + 10 * S, uptime=500, in_octets=1250)
    r = port_rates(a, b, {}).rates
    assert r is not None and r.in_bps == 1000.0


def test_discontinuity_time_change_drops_the_interval():
    a = sample(in_octets=0, discontinuity_ticks=0)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=10, discontinuity_ticks=100_500)
    assert "discontinuity" in port_rates(a, b, {}).dropped


def test_impossible_64_bit_jump_is_left_out_not_stored():
    a = sample(in_octets=0, out_octets=0, speed_bps=10**9)
    b = sample(ts=T0 + 10 * S, uptime=101_000, in_octets=1 << 62, out_octets=1000, speed_bps=10**9)
    res = port_rates(a, b, {})
    assert res.rates.in_bps is None and res.rates.out_bps == 800.0 and res.implausible == ("in_octets",)


def test_tracker_first_sample_then_rates_and_stale_samples():
    t = RateTracker(SNMP_BITS)
    assert t.update(sample(in_octets=0)).dropped == "first sample"
    assert t.update(sample(ts=T0 + S, uptime=100_100, in_octets=125)).rates.in_bps == 1000.0
    assert t.update(sample(ts=T0, in_octets=0)).rates is None  # older than the last one


def test_counters_a_device_has_not_refreshed_are_held_then_measured_over_the_whole_time():
    """An agent that refreshes its counters every 3 s, polled every 1 s: without the hold, rates
    would go 0, 0, 3x (dropped as impossible above 1.5x)."""
    t = RateTracker(SNMP_BITS, unchanged_hold_s=5)
    rate = 10**8 // 8  # 100 Mb/s in bytes/s on a 100 Mb/s port
    def polled(second: int, refreshed_at: int):
        return sample(ts=T0 + second * S, uptime=100_000 + 100 * second, in_octets=rate * refreshed_at,
                      out_octets=0, in_pkts=refreshed_at, out_pkts=0, speed_bps=10**8)
    assert t.update(polled(0, 0)).dropped == "first sample"
    got = [t.update(polled(s, s - s % 3)) for s in range(1, 7)]
    assert [r.dropped is not None for r in got] == [True, True, False, True, True, False]
    assert "not refreshed" in got[0].dropped and t.dropped == 0
    assert got[2].rates.in_bps == pytest.approx(10**8) and got[2].rates.interval_s == 3.0
    assert got[5].rates.in_utilization == pytest.approx(1.0)
    # an idle port: held no longer than the hold, then a rate of 0 over the whole time
    idle = [t.update(polled(s, 6)) for s in range(7, 13)]
    assert [r.rates is not None for r in idle] == [False, False, False, False, True, False]
    assert idle[4].rates.in_bps == 0.0 and idle[4].rates.interval_s == 5.0
    # no hold: every poll gives a rate (the old behaviour, `polling.unchanged_hold: 0`)
    t0 = RateTracker(SNMP_BITS, unchanged_hold_s=0)
    t0.update(polled(0, 0))
    assert t0.update(polled(1, 0)).rates.in_bps == 0.0


# --- properties --------------------------------------------------------------------------------

speeds = st.one_of(st.none(), st.sampled_from([0, 10**6, 10**8, 10**9, 25 * 10**9, G100, 400 * 10**9, 800 * 10**9]))
u64 = st.integers(0, U64 - 1)
u32 = st.integers(0, U32 - 1)
elapsed = st.integers(1, 3600 * S)


@settings(max_examples=400, deadline=None)
@given(prev_oct=u64, cur_oct=u64, prev_err=u32, cur_err=u32, dt=elapsed, speed=speeds,
       up0=u32, up1=st.one_of(st.none(), u32))
def test_no_negative_or_impossible_rate_ever(prev_oct, cur_oct, prev_err, cur_err, dt, speed, up0, up1):
    if up1 is None:  # mostly a device that kept running, sometimes an arbitrary (rebooted) uptime
        up1 = (up0 + dt * 100 // S) % U32
    a = sample(in_octets=prev_oct, out_octets=prev_oct, in_errors=prev_err, speed_bps=speed, uptime=up0)
    b = sample(ts=T0 + dt, in_octets=cur_oct, out_octets=cur_oct, in_errors=cur_err, speed_bps=speed, uptime=up1)
    res = port_rates(a, b, SNMP_BITS)
    if res.rates is None:
        assert res.dropped
        return
    bound_bps = max_rate("bits", speed, 1.5)
    for bps in (res.rates.in_bps, res.rates.out_bps):
        assert bps is None or 0 <= bps <= bound_bps <= ABSOLUTE_MAX_BPS
    if res.rates.in_errors_ps is not None:
        assert 0 <= res.rates.in_errors_ps <= bound_bps / MIN_FRAME_WIRE_BITS
    if speed and res.rates.in_utilization is not None:
        assert 0 <= res.rates.in_utilization <= 1.5
    assert cur_oct >= prev_oct, "a 64-bit decrease (a reset) must drop the interval"
    if uptime_restarted(up0, up1, dt):
        raise AssertionError("a restarted device must drop the interval")


@settings(max_examples=300, deadline=None)
@given(start=u32, increment=st.integers(0, U32 - 1), dt=st.integers(S, 600 * S))
def test_single_32_bit_wrap_recovers_the_exact_increment(start, increment, dt):
    cur = (start + increment) % U32
    a = sample(in_errors=start)
    b = sample(ts=T0 + dt, uptime=100_000 + dt * 100 // S, in_errors=cur)
    res = port_rates(a, b, SNMP_BITS)
    expected = increment * S / dt
    if expected <= max_rate("packets", None, 1.5):
        assert res.rates.in_errors_ps == expected
    else:
        assert res.rates is None or res.rates.in_errors_ps is None


@settings(max_examples=300, deadline=None)
@given(start=u32, increment=st.integers(0, U32 - 1), dt=st.integers(S, 600 * S), speed=speeds)
def test_32_bit_octets_wrap_once_to_the_exact_rate_or_none(start, increment, dt, speed):
    """32-bit octet counters (PortSample.counter_bits = 32): a single wrap gives the exact rate when
    that rate is possible; otherwise no rate, never a negative or absurd one."""
    a = sample(in_octets=start, speed_bps=speed, counter_bits=32)
    b = sample(ts=T0 + dt, uptime=100_000 + dt * 100 // S, in_octets=(start + increment) % U32, speed_bps=speed,
               counter_bits=32)
    res = port_rates(a, b, SNMP_BITS)
    exact = increment * 8 * S / dt
    if exact <= max_rate("bits", speed, 1.5):
        assert res.rates.in_bps == exact
    else:
        assert res.rates is None or res.rates.in_bps is None


@settings(max_examples=300, deadline=None)
@given(start=u64, increment=st.integers(0, 10**13), dt=st.integers(S, 600 * S), speed=speeds)
def test_64_bit_increments_are_exact_until_the_final_division(start, increment, dt, speed):
    if start + increment >= U64:
        start = U64 - 1 - increment
    a = sample(in_octets=start, speed_bps=speed)
    b = sample(ts=T0 + dt, uptime=100_000 + dt * 100 // S, in_octets=start + increment, speed_bps=speed)
    res = port_rates(a, b, {})
    exact = increment * 8 * S / dt
    if exact <= max_rate("bits", speed, 1.5):
        assert res.rates.in_bps == exact
    else:
        assert res.rates.in_bps is None and res.implausible == ("in_octets",)


@settings(max_examples=200, deadline=None)
@given(up0=st.integers(0, U32 - 1), dt=st.integers(S, 7 * 86400 * S))
def test_uptime_consistent_with_clock_is_never_a_restart(up0, dt):
    up1 = (up0 + dt * 100 // S) % U32
    assert not uptime_restarted(up0, up1, dt)


@settings(max_examples=200, deadline=None)
@given(up0=st.integers(100_000, U32 // 2), back=st.integers(1, 99_000), dt=st.integers(S, 600 * S))
def test_uptime_going_back_is_a_restart(up0, back, dt):
    assert uptime_restarted(up0, up0 - back, dt)


# --- link state and flaps ----------------------------------------------------------------------


def test_transitions_become_events_and_flapping_needs_more_than_the_threshold():
    t = LinkStateTracker(flap_count=3, flap_window_s=60)
    ts, up = T0, 100_000
    assert t.update(sample(ts=ts, uptime=up, oper_status="up")) is None
    events = []
    for i in range(8):  # down, up, down, up, ...
        ts += S
        up += 100
        ev = t.update(sample(ts=ts, uptime=up, oper_status="down" if i % 2 == 0 else "up"))
        events.append(ev)
    assert all(e is not None for e in events)
    assert [e.state for e in events[:2]] == ["down", "up"] and events[0].previous == "up"
    assert [e.flaps_in_window for e in events] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [e.flapping for e in events] == [False] * 6 + [True, True]
    # the window slides: a minute later the old flaps no longer count
    assert not t.flapping("leaf1", "swp1", ts + 61 * S)


def test_hidden_flap_seen_through_iflastchange():
    t = LinkStateTracker(flap_count=8, flap_window_s=3600)
    t.update(sample(oper_status="up", last_change_ticks=500))
    ev = t.update(sample(ts=T0 + 10 * S, uptime=101_000, oper_status="up", last_change_ticks=100_700))
    assert ev.transitions == 2 and ev.flaps_in_window == 1 and ev.state == ev.previous == "up"
    # no change: no event; net-snmp's 0 means unknown, not a change
    assert t.update(sample(ts=T0 + 20 * S, uptime=102_000, oper_status="up", last_change_ticks=100_700)) is None
    t2 = LinkStateTracker()
    t2.update(sample(oper_status="up", last_change_ticks=0))
    assert t2.update(sample(ts=T0 + 10 * S, uptime=101_000, oper_status="up", last_change_ticks=0)) is None


def test_more_than_8_flaps_in_an_hour_by_default():
    t = LinkStateTracker()
    ts, up = T0, 100_000
    t.update(sample(ts=ts, uptime=up, oper_status="up"))
    last = None
    for i in range(18):
        ts += 60 * S
        up += 6000
        last = t.update(sample(ts=ts, uptime=up, oper_status="down" if i % 2 == 0 else "up")) or last
    assert last.flaps_in_window == 9 and last.flapping
