"""Counter math: rates from two successive samples, safe against wraps, resets and reboots.

Pure functions plus one small stateful helper (`RateTracker`), shared by the switch collectors
and the host agent. The rules (docs/snmp.md explains them with examples):

* Deltas are exact integers. A rate is computed once, as `delta * scale * 1e9 / elapsed_ns` with
  Python's exact int/int division, so a 100G byte counter near 2**64 loses nothing before that
  final, correctly rounded float.
* A counter that went backwards: a 32-bit counter wrapped (once; more wraps cannot be seen, so a
  wrap must give a plausible rate), a 64-bit counter was reset (it would take ~11 years at 400G to
  wrap): the interval is dropped for that port. Widths come from the collector per counter, and
  from the sample itself for its octet and packet counters (`PortSample.counter_bits`: SNMP reads
  32-bit ifTable counters from devices without ifXTable); a port whose width changed between the
  two samples (new firmware added ifXTable) has its interval dropped: the counters are not the same.
* The device restarted (sysUpTime went back, or advanced much less than the wall clock between the
  two polls, so it restarted in between), or the interface's counter discontinuity time changed:
  the interval is dropped. sysUpTime itself is a 32-bit TimeTicks value and wraps after ~497 days:
  a wrap consistent with the wall clock is not a restart.
* A rate above what the interface can carry (its speed x `max_utilization`, or 10 Tbit/s when the
  speed is unknown) is impossible: that counter's rate is dropped rather than stored.
* Devices that refresh their counters less often than they are polled (net-snmp caches IF-MIB for
  a few seconds; many switch agents do the like): a sample whose traffic counters all equal the
  previous one is "not refreshed yet" for up to `unchanged_hold`: no rate, and the previous sample
  stays the base, so the next change is measured over the whole time it took. Otherwise such a
  device gives 0 and then a multiple of the true rate, which the bound above drops. A port idle
  longer than the hold gets its rate of 0 then.
* Egress queues (`QueueSample` -> `QueueRates`, `queue_rates`) follow the same rules. A queue has
  no sysUpTime: a 64-bit counter going back (the queue or qdisc was re-created) drops the interval.
  What a queue transmits is bounded by its port's speed; what it drops is not (many ports can
  send into one: incast), only by the absolute bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nms.records import PortRates, PortSample, QueueRates, QueueSample

U32 = 1 << 32
U64 = 1 << 64
NS = 10**9
TICKS_PER_S = 100
MIN_FRAME_WIRE_BITS = 84 * 8  # 64-byte frame + preamble + inter-frame gap: the most packets a link carries
ABSOLUTE_MAX_BPS = 10 * 10**12  # no single interface carries 10 Tbit/s: cap when the speed is unknown
DEFAULT_MAX_UTILIZATION = 1.5  # samples are timed on our side: allow jitter, not 2x line rate
DEFAULT_UNCHANGED_HOLD_S = 5.0  # longer than agents' counter caches (net-snmp: a few seconds)
FIRST = "first sample"
HELD = "counters unchanged since the previous sample (not refreshed yet): held"
NOT_NEWER = "sample is not newer than the previous one"

# PortSample counter -> (PortRates field, multiplier, kind)
RATE_FIELDS: dict[str, tuple[str, int, str]] = {
    "in_octets": ("in_bps", 8, "bits"),
    "out_octets": ("out_bps", 8, "bits"),
    "in_errors": ("in_errors_ps", 1, "packets"),
    "out_errors": ("out_errors_ps", 1, "packets"),
    "in_discards": ("in_discards_ps", 1, "packets"),
    "out_discards": ("out_discards_ps", 1, "packets"),
}
# counters needed only for plausibility (packets) are checked too, not stored as rates
CHECKED_ONLY = {"in_pkts": "packets", "out_pkts": "packets"}
# QueueSample counter -> (QueueRates field, multiplier, kind, bounded by the port's speed)
QUEUE_RATE_FIELDS: dict[str, tuple[str, int, str, bool]] = {
    "transmit_octets": ("transmit_bps", 8, "bits", True),
    "transmit_pkts": ("transmit_pps", 1, "packets", True),
    "dropped_octets": ("dropped_bps", 8, "bits", False),
    "dropped_pkts": ("dropped_pps", 1, "packets", False),
    "ecn_marked_pkts": ("ecn_marked_pps", 1, "packets", True),
}


def counter_delta(prev: int, cur: int, bits: int) -> int | None:
    """`cur - prev` for a counter `bits` wide. A 32-bit counter that went backwards wrapped once;
    a 64-bit counter that went backwards was reset (None). Values outside the width are rejected."""
    if bits not in (32, 64):
        raise ValueError(f"counter width must be 32 or 64, not {bits}")
    top = 1 << bits
    if not (0 <= prev < top and 0 <= cur < top):
        raise ValueError(f"counter value outside {bits} bits")
    if cur >= prev:
        return cur - prev
    if bits == 32:
        return cur + top - prev
    return None


def uptime_restarted(prev_ticks: int, cur_ticks: int, elapsed_ns: int, slack_s: float = 5.0) -> bool:
    """True when the agent restarted between two polls `elapsed_ns` apart (our clock).

    sysUpTime should advance by the elapsed time. It went back: a restart, unless it is a 32-bit
    wrap that fits the elapsed time. It advanced much less than the elapsed time: the device
    restarted in between and has been up for less time than we waited."""
    advanced = cur_ticks - prev_ticks
    if advanced < 0:
        advanced += U32  # a wrap after ~497 days, if the numbers agree
    elapsed_ticks = elapsed_ns * TICKS_PER_S // NS
    slack = int(slack_s * TICKS_PER_S) + elapsed_ticks // 10
    return abs(advanced - elapsed_ticks) > slack


def max_rate(kind: str, speed_bps: int | None, max_utilization: float) -> float:
    """The highest believable rate of a counter kind ('bits' per s or 'packets' per s)."""
    bps = speed_bps * max_utilization if speed_bps else ABSOLUTE_MAX_BPS
    bps = min(bps, ABSOLUTE_MAX_BPS)
    return bps if kind == "bits" else bps / MIN_FRAME_WIRE_BITS


def per_second(delta: int, elapsed_ns: int, scale: int = 1) -> float:
    """delta * scale per second, exact until the final rounding to float."""
    if elapsed_ns <= 0:
        raise ValueError("elapsed time must be positive")
    return delta * scale * NS / elapsed_ns


@dataclass(frozen=True)
class RateResult:
    rates: PortRates | QueueRates | None
    dropped: str | None = None  # why the whole interval was dropped
    implausible: tuple[str, ...] = ()  # counters whose rate was impossible (left out)


def counter_width(sample: PortSample, counter: str, bits: Mapping[str, int]) -> int:
    """A counter's width: the sample's `counter_bits` for its octet and packet counters, else the
    collector's `bits`, else 64."""
    if sample.counter_bits is not None and counter in PortSample.traffic_counters:
        return sample.counter_bits
    return bits.get(counter, 64)


def port_rates(prev: PortSample, cur: PortSample, bits: Mapping[str, int],
               max_utilization: float = DEFAULT_MAX_UTILIZATION, min_interval_ns: int = NS // 10) -> RateResult:
    """Rates of one port between two samples, or why there are none.

    `bits` gives each counter's width (e.g. SNMP: HC octets 64, ifInErrors 32); a counter not named
    is taken as 64 bits, unless the samples' `counter_bits` says otherwise (see counter_width)."""
    if (prev.device, prev.port) != (cur.device, cur.port):
        raise ValueError("samples of different ports")
    elapsed = cur.ts - prev.ts
    if elapsed < min_interval_ns:
        return RateResult(None, f"interval {elapsed} ns is too short or negative")
    if prev.uptime_ticks is not None and cur.uptime_ticks is not None:
        if uptime_restarted(prev.uptime_ticks, cur.uptime_ticks, elapsed):
            return RateResult(None, "device restarted (sysUpTime does not match the elapsed time)")
    if prev.discontinuity_ticks != cur.discontinuity_ticks:
        return RateResult(None, "counter discontinuity (ifCounterDiscontinuityTime changed)")
    if any(counter_width(prev, c, bits) != counter_width(cur, c, bits) for c in PortSample.traffic_counters):
        return RateResult(None, "counter width changed (e.g. 32-bit ifTable to 64-bit ifXTable): other counters")
    speed = cur.speed_bps if cur.speed_bps else None
    values: dict[str, float] = {}
    implausible: list[str] = []
    for counter, kind in [*((c, k) for c, (_, _, k) in RATE_FIELDS.items()), *CHECKED_ONLY.items()]:
        a, b = getattr(prev, counter), getattr(cur, counter)
        if a is None or b is None:
            continue
        width = counter_width(cur, counter, bits)
        delta = counter_delta(a, b, width)
        if delta is None:
            return RateResult(None, f"{counter} went backwards on a 64-bit counter (counters were reset)")
        scale = RATE_FIELDS[counter][1] if counter in RATE_FIELDS else 1
        rate = per_second(delta, elapsed, scale)
        if rate > max_rate(kind, speed, max_utilization):
            if width == 32 and b < a:
                # a wrap that gives an impossible rate was a reset (or several wraps): unknowable
                return RateResult(None, f"{counter} went backwards and no single wrap explains it")
            implausible.append(counter)
            continue
        if counter in RATE_FIELDS:
            values[RATE_FIELDS[counter][0]] = rate
    if speed:
        for direction in ("in", "out"):
            if (bps := values.get(f"{direction}_bps")) is not None:
                values[f"{direction}_utilization"] = bps / speed
    rates = PortRates(device=cur.device, port=cur.port, ts=cur.ts, interval_s=elapsed / NS, **values)
    return RateResult(rates, None, tuple(implausible))


def not_refreshed(prev: PortSample, cur: PortSample) -> bool:
    """All traffic counters present and equal in both samples, with the same uptime base: the device
    has not refreshed them yet (or the port is idle: told apart by how long it lasts)."""
    counters = [(getattr(prev, c), getattr(cur, c)) for c in PortSample.traffic_counters]
    return (all(a is not None and a == b for a, b in counters)
            and prev.discontinuity_ticks == cur.discontinuity_ticks and prev.counter_bits == cur.counter_bits)


def queue_rates(prev: QueueSample, cur: QueueSample, bits: Mapping[str, int], speed_bps: int | None = None,
                max_utilization: float = DEFAULT_MAX_UTILIZATION, min_interval_ns: int = NS // 10) -> RateResult:
    """Rates of one egress queue between two samples, or why there are none. `bits` gives counter
    widths by QueueSample attribute (Linux qdisc drops are 32-bit); `speed_bps` is the port's, when
    known (bounds what the queue can transmit)."""
    if (prev.device, prev.port, prev.queue) != (cur.device, cur.port, cur.queue):
        raise ValueError("samples of different queues")
    elapsed = cur.ts - prev.ts
    if elapsed < min_interval_ns:
        return RateResult(None, f"interval {elapsed} ns is too short or negative")
    deltas: dict[str, tuple[int, int]] = {}  # counter -> (delta, width)
    for counter in QUEUE_RATE_FIELDS:
        a, b = getattr(prev, counter), getattr(cur, counter)
        if a is None or b is None:
            continue
        width = bits.get(counter, 64)
        delta = counter_delta(a, b, width)
        if delta is None:
            return RateResult(None, f"{counter} went backwards on a 64-bit counter (the queue was reset)")
        deltas[counter] = (delta, width)
    values: dict[str, float] = {}
    implausible: list[str] = []
    for counter, (delta, width) in deltas.items():
        field, scale, kind, by_port = QUEUE_RATE_FIELDS[counter]
        rate = per_second(delta, elapsed, scale)
        if rate > max_rate(kind, speed_bps if by_port else None, max_utilization):
            if width == 32 and getattr(cur, counter) < getattr(prev, counter):
                return RateResult(None, f"{counter} went backwards and no single wrap explains it")
            implausible.append(counter)
            continue
        values[field] = rate
    rates = QueueRates(device=cur.device, port=cur.port, queue=cur.queue, ts=cur.ts, interval_s=elapsed / NS,
                       **values)
    return RateResult(rates, None, tuple(implausible))


class RateTracker:
    """Keeps the previous sample per (device, port) (per (device, port, queue) for queues) and turns
    each new sample into rates."""

    def __init__(self, bits: Mapping[str, int] | None = None, max_utilization: float = DEFAULT_MAX_UTILIZATION,
                 unchanged_hold_s: float = DEFAULT_UNCHANGED_HOLD_S):
        self.bits = dict(bits or {})
        self.max_utilization = max_utilization
        self.unchanged_hold_ns = int(unchanged_hold_s * NS)
        self._last_port: dict[tuple[str, str], PortSample] = {}
        self._last_queue: dict[tuple[str, str, str], QueueSample] = {}
        self.dropped = 0

    def update(self, sample: PortSample | QueueSample, bits: Mapping[str, int] | None = None,
               speed_bps: int | None = None) -> RateResult:
        """`speed_bps`: the port's speed, for a QueueSample (a PortSample carries its own)."""
        widths = bits if bits is not None else self.bits
        if isinstance(sample, QueueSample):
            queue_key = (sample.device, sample.port, sample.queue)
            prev_queue = self._last_queue.get(queue_key)
            if prev_queue is not None and sample.ts <= prev_queue.ts:
                return RateResult(None, NOT_NEWER)
            self._last_queue[queue_key] = sample
            if prev_queue is None:
                return RateResult(None, FIRST)
            result = queue_rates(prev_queue, sample, widths, speed_bps, self.max_utilization)
        else:
            key = (sample.device, sample.port)
            prev = self._last_port.get(key)
            if prev is not None and sample.ts <= prev.ts:
                return RateResult(None, NOT_NEWER)
            if prev is not None and sample.ts - prev.ts < self.unchanged_hold_ns and not_refreshed(prev, sample):
                return RateResult(None, HELD)
            self._last_port[key] = sample
            if prev is None:
                return RateResult(None, FIRST)
            result = port_rates(prev, sample, widths, self.max_utilization)
        if result.rates is None:
            self.dropped += 1
        return result

    def forget(self, *names: str) -> None:
        """The devices' previous samples dropped (their next sample is a first one): one pass over the ports."""
        devices = set(names)
        for key in [k for k in self._last_port if k[0] in devices]:
            del self._last_port[key]
        for queue_key in [k for k in self._last_queue if k[0] in devices]:
            del self._last_queue[queue_key]
