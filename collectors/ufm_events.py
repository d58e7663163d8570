"""UFM events and alarms -> switch evidence (docs/ufm.md, "Events and alarms").

Events are read incrementally (ids above the last poll's). Each new event is stored as a `ufm_event`
point; each active alarm as a `ufm_alarm` point per poll. Link-state events become the record the
correlator already reads for a link's state and flaps, LinkEvent (correlator/evidence.py):

* a port's link went down (UFM: "Link went down", "Link is down", ...), or its Link Downed counter
  moved ("Link Downed", counter Infiniband_LinkDowned, the reason's "calculated delta is N": N downs);
* UFM itself calls the port flapping.

An event on a host's port counts for the switch port at the other end of its link. The service
derives LinkEvents from successive port samples itself (nms/linkstate.py), so a down that the
samples show (the port was up at the last poll, is down now) is not reported twice: only downs the
samples cannot see (down and back between two polls, several downs in one interval) give a
LinkEvent, whose state is the port's state now, `transitions` the changes it went through, and
`flaps_in_window` every down of that port in the flap window (samples' and events').
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any
from zoneinfo import ZoneInfo

from collectors.ufm_model import Fabric, PortRef, Problems, guid_of, parse_time
from nms.records import GenericPoint, LinkEvent, PortSample

LINK_DOWNED = "Infiniband_LinkDowned"
_DELTA = re.compile(r"calculated delta is (\d+)", re.IGNORECASE)
_DOWN = re.compile(r"\b(went|is|link|port) down\b")
_FLAP = re.compile(r"\bflap")

End = tuple[str, str]  # (device, port)


def classify(item: dict) -> tuple[str, int] | None:
    """("down", how many) or ("flap", 1) for a link-state event; None for anything else."""
    words = " ".join(str(item.get(k) or "") for k in ("name", "description")).lower()
    if item.get("counter") == LINK_DOWNED or "link downed" in words:
        match = _DELTA.search(str(item.get("reason") or item.get("description") or ""))
        return "down", max(1, int(match.group(1))) if match else 1
    if _FLAP.search(words):
        return "flap", 1
    if _DOWN.search(words):
        return "down", 1
    return None


class LinkEvidence:
    """Per UFM server: the last event id seen, each switch port's state at the last poll, and the
    times of its downs within the flap window."""

    def __init__(self, flap_count: int, flap_window_s: float):
        self.flap_count, self.window_ns = flap_count, int(flap_window_s * 1e9)
        self.last_id: int | None = None
        self.previous: dict[End, str] = {}
        self.downs: dict[End, deque[int]] = {}
        self.peers: dict[str, PortRef] = {}  # the last known far end of each port (a down link leaves /links)

    def new_events(self, items: list, route: str, problems: Problems) -> list[dict]:
        problems.totals[route] = len(items)
        good = []
        for i, item in enumerate(items):
            if isinstance(item, dict) and isinstance(item.get("id"), int) and not isinstance(item.get("id"), bool):
                good.append(item)
            else:
                problems.note(route, i, item, "no integer 'id'" if isinstance(item, dict) else "not an object")
        newest = max((e["id"] for e in good), default=None)
        if self.last_id is not None and newest is not None and newest < self.last_id:
            self.last_id = None  # ids went back: UFM's event log was reset
        fresh = [e for e in good if self.last_id is None or e["id"] > self.last_id]
        if newest is not None:
            self.last_id = max(newest, self.last_id or 0)
        return sorted(fresh, key=lambda e: e["id"])

    def link_events(self, events: list[dict], fabric: Fabric, peers: dict[str, PortRef],
                    samples: dict[End, PortSample], now_ns: int, zone: ZoneInfo) -> list[LinkEvent]:
        self.peers.update(peers)
        peers = self.peers
        downs: dict[frozenset, dict[str, int]] = {}  # link -> reporting port -> downs
        flapped: set[frozenset] = set()
        when: dict[frozenset, int] = {}
        ends_of: dict[frozenset, list[End]] = {}
        for event in events:
            kind = classify(event)
            ref = fabric.ports.get(guid_of(str(event.get("object_name") or "")))
            ts = min(parse_time(event.get("timestamp"), zone) or now_ns, now_ns)
            if kind is None or ref is None or ts < now_ns - self.window_ns:
                continue
            ends = [p for p in (ref, peers.get(ref.name)) if p is not None and p.switch]
            link = frozenset(p.name for p in (ref, peers.get(ref.name)) if p is not None)
            if not ends:
                continue
            ends_of[link] = [(p.device, p.port) for p in ends]
            when[link] = max(when.get(link, 0), ts)
            if kind[0] == "flap":
                flapped.add(link)
            else:
                side = downs.setdefault(link, {})
                side[ref.name] = side.get(ref.name, 0) + kind[1]
        out = []
        for link, ends in ends_of.items():
            n = max(downs.get(link, {}).values(), default=0)  # both ends may report the same downs
            for end in ends:
                if end in samples:
                    out += self._end(end, samples[end].oper_status or "unknown", n, link in flapped, when[link])
        for end, sample in samples.items():
            self._prune(end, now_ns)
            self.previous[end] = sample.oper_status or "unknown"
        return out

    def _end(self, end: End, now: str, n: int, flapped: bool, ts: int) -> list[LinkEvent]:
        before = self.previous.get(end)
        seen_by_samples = 1 if before == "up" and now != "up" and n else 0
        hidden = n - seen_by_samples
        window = self.downs.setdefault(end, deque())
        window.extend([ts] * n)
        count = len(window)
        if hidden <= 0 and not flapped:
            return []
        if hidden <= 0:  # UFM's verdict alone
            return [LinkEvent(device=end[0], port=end[1], ts=ts, state=now, flaps_in_window=count, flapping=True)]
        return [LinkEvent(device=end[0], port=end[1], ts=ts, state=now, previous="down" if now == "up" else "up",
                          transitions=2 * hidden - (0 if now == "up" else 1) or 1, flaps_in_window=count,
                          flapping=flapped or count > self.flap_count)]

    def _prune(self, end: End, now_ns: int) -> None:
        window = self.downs.get(end)
        while window and window[0] <= now_ns - self.window_ns:
            window.popleft()


def _subject(item: dict, fabric: Fabric) -> dict[str, str]:
    """Tags naming what an event or alarm is about: a port's switch/host and port, a system, or
    UFM's own object name."""
    name = str(item.get("object_name") or "")
    ref = fabric.ports.get(guid_of(name))
    if ref is not None:
        return {"device": ref.device, "port": ref.port}
    system = fabric.system_names.get(guid_of(name))
    return {"device": system or name} if system or name else {}


def _s(value: Any) -> str:
    """A text field or tag: UFM's "N/A" and null are absent."""
    return "" if value is None or value == "N/A" or isinstance(value, (dict, list)) else str(value)


def _point(measurement: str, ufm: str, item: dict, fabric: Fabric, ts: int, tags: dict[str, str],
           fields: dict[str, int | str]) -> GenericPoint:
    """One point per event / alarm. Field types are fixed per key (id and event_count integers, the
    rest text), whatever UFM sends, so that a store keeps one type per field."""
    tags = {"ufm": ufm, **_subject(item, fabric), **tags}
    return GenericPoint(measurement=measurement, ts=ts, tags={k: v[:256] for k, v in tags.items() if v},
                        fields={k: v[:1024] if isinstance(v, str) else v for k, v in fields.items() if v != ""})


def _count(value: Any) -> int | str:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else ""


def event_points(ufm: str, events: list[dict], fabric: Fabric, now_ns: int, zone: ZoneInfo) -> list[GenericPoint]:
    return [_point("ufm_event", ufm, e, fabric, min(parse_time(e.get("timestamp"), zone) or now_ns, now_ns),
                   {"event": _s(e.get("name")), "severity": _s(e.get("severity")), "category": _s(e.get("category"))},
                   {"id": e["id"], "description": _s(e.get("description")), "event_type": _s(e.get("event_type")),
                    "counter": _s(e.get("counter"))})
            for e in events]


def alarm_points(ufm: str, alarms: list, route: str, problems: Problems, fabric: Fabric,
                 now_ns: int) -> list[GenericPoint]:
    problems.totals[route] = len(alarms)
    out = []
    for i, a in enumerate(alarms):
        if not isinstance(a, dict) or not isinstance(a.get("id"), int) or not a.get("name"):
            problems.note(route, i, a, "not an object with an integer 'id' and a 'name'" if isinstance(a, dict)
                          else "not an object")
            continue
        tags = {"alarm": _s(a["name"]), "severity": _s(a.get("severity"))}
        out.append(_point("ufm_alarm", ufm, a, fabric, now_ns, tags,
                          {"id": a["id"], "event_count": _count(a.get("event_count")),
                           "description": _s(a.get("description")), "reason": _s(a.get("reason")),
                           "event_type": _s(a.get("event_type")), "counter": _s(a.get("counter"))}))
    return out
