"""Link state from successive port samples: transitions become LinkEvents, flaps are counted.

A flap is a port leaving `up`. Transitions are seen two ways:

* the oper status differs from the previous poll (one transition; a flap if it left `up`);
* the status is the same but ifLastChange moved (the link went away and came back between two
  polls, two transitions, one flap) - the only way a poller sees flaps faster than its interval.

A port is flapping while more than `flap_count` flaps fall within the last `flap_window` seconds
(defaults from the config's thresholds: more than 8 in an hour).
"""

from __future__ import annotations

from collections import deque

from nms.counters import NS, uptime_restarted
from nms.records import LinkEvent, PortSample


class LinkStateTracker:
    def __init__(self, flap_count: int = 8, flap_window_s: float = 3600.0):
        self.flap_count = flap_count
        self.flap_window_ns = int(flap_window_s * NS)
        self._last: dict[tuple[str, str], PortSample] = {}
        self._flaps: dict[tuple[str, str], deque[int]] = {}

    def update(self, sample: PortSample) -> LinkEvent | None:
        key = (sample.device, sample.port)
        prev = self._last.get(key)
        if sample.oper_status is None or (prev is not None and sample.ts <= prev.ts):
            return None
        self._last[key] = sample
        if prev is None or prev.oper_status is None:
            return None
        transitions, flaps = 0, 0
        if prev.oper_status != sample.oper_status:
            transitions = 1
            flaps = 1 if prev.oper_status == "up" else 0
        elif self._hidden_change(prev, sample):
            transitions, flaps = 2, 1
        if not transitions:
            return None
        window = self._flaps.setdefault(key, deque())
        window.extend([sample.ts] * flaps)
        count = self._count(key, sample.ts)
        return LinkEvent(device=sample.device, port=sample.port, ts=sample.ts, state=sample.oper_status,
                         previous=prev.oper_status, transitions=transitions, flaps_in_window=count,
                         flapping=count > self.flap_count)

    def forget(self, *names: str) -> None:
        """The devices' last samples dropped (their next sample is a first one); their flaps are kept."""
        devices = set(names)
        for key in [k for k in self._last if k[0] in devices]:
            del self._last[key]

    def record(self, event: LinkEvent) -> None:
        """An event another process derived (a cluster member's view of a switch it does not poll):
        its flap counts here as in update()."""
        if event.previous == "up" or event.transitions == 2:
            self._flaps.setdefault((event.device, event.port), deque()).append(event.ts)

    @staticmethod
    def _hidden_change(prev: PortSample, cur: PortSample) -> bool:
        a, b = prev.last_change_ticks, cur.last_change_ticks
        if not a or not b or a == b:  # net-snmp on Linux reports 0: nothing to learn
            return False
        if prev.uptime_ticks is not None and cur.uptime_ticks is not None and \
                uptime_restarted(prev.uptime_ticks, cur.uptime_ticks, cur.ts - prev.ts):
            return False  # a restarted agent re-bases ifLastChange
        return True

    def _count(self, key: tuple[str, str], now_ns: int) -> int:
        window = self._flaps.get(key)
        if not window:
            return 0
        while window and window[0] <= now_ns - self.flap_window_ns:
            window.popleft()
        return len(window)

    def flaps(self, device: str, port: str, now_ns: int) -> int:
        return self._count((device, port), now_ns)

    def flapping(self, device: str, port: str, now_ns: int) -> bool:
        return self.flaps(device, port, now_ns) > self.flap_count

    def status(self, device: str, port: str) -> str | None:
        sample = self._last.get((device, port))
        return sample.oper_status if sample else None
