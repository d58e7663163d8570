"""UFM events and alarms -> switch evidence (docs/ufm.md, "Events and alarms").

Events are read incrementally (ids above the last poll's). Each new event is stored as a `ufm_event`
point; each active alarm as a `ufm_alarm` point per poll. Link-state events become the record the
correlator already reads for a link's state and flaps, LinkEvent (correlator/evidence.py):

* a link went down: event id 329 ("Link went down"; UFM's event policy table, IBM/CAST
  csmd/src/ras/ufm/ufm_csm_ras_type_data.csv), whose object is the link, named
  `<guid>_<port> : <guid>_<port>` (type "Link"; Mellanox/ufm_sdk_3.0 ufm_log_analyzer_plugin
  event_log_regex.py); id 328 ("Link is up") is no down. Without an id, words in the name or
  description ("went down", "link down", ...) decide;
* a port's Link Downed counter moved ("Link Downed", counter Infiniband_LinkDowned, the reason's
  "calculated delta is N": N downs; or UFM Telemetry's LinkDownedCounterExtended grew by N);
* UFM itself calls the port flapping.

The event id is `event_type` (UFM 6.x guides: `type` is then the object type) or a numeric `type`
(older guides). An event on a link counts for both ends; one on a host's port counts for the switch
port at the other end of its link. The service
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

from collectors.ufm.model import Fabric, PortRef, Problems, guid_of, parse_time
from nms.records import GenericPoint, LinkEvent, PortSample

LINK_DOWNED = "Infiniband_LinkDowned"
LINK_DOWN_ID, LINK_UP_ID = "329", "328"
_DELTA = re.compile(r"calculated delta is (\d+)", re.IGNORECASE)
_DOWN = re.compile(r"\b(went|is|link|port) down\b")
_FLAP = re.compile(r"\bflap")
_LINK = re.compile(r"^\s*((?:0x)?[0-9a-fA-F]+_\d+)\s*:\s*((?:0x)?[0-9a-fA-F]+_\d+)\s*$")

End = tuple[str, str]  # (device, port)


def event_id(item: dict) -> str | None:
    """UFM's event id (329 "Link went down", ...): `event_type`, or a numeric `type` (older UFMs)."""
    for key in ("event_type", "type"):
        value = item.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value.strip().isdigit():
            return value.strip()
    return None


def link_ends(object_name: str) -> tuple[str, str] | None:
    """'<guid>_<port> : <guid>_<port>' (a link event's object) -> both UFM port names."""
    match = _LINK.match(object_name)
    return (guid_of(match.group(1)), guid_of(match.group(2))) if match else None


def classify(item: dict) -> tuple[str, int] | None:
    """("down", how many) or ("flap", 1) for a link-state event; None for anything else."""
    number = event_id(item)
    if number == LINK_DOWN_ID:
        return "down", 1
    if number == LINK_UP_ID:
        return None
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
                    samples: dict[End, PortSample], now_ns: int, zone: ZoneInfo,
                    counter_downs: dict[str, int] | None = None) -> list[LinkEvent]:
        """LinkEvents from new events and from `counter_downs` (UFM port name -> downs its Link
        Downed counter counted since the last poll)."""
        self.peers.update(peers)
        peers = self.peers
        downs: dict[frozenset, dict[str, int]] = {}  # link -> reporting port -> downs
        flapped: set[frozenset] = set()
        when: dict[frozenset, int] = {}
        ends_of: dict[frozenset, list[End]] = {}
        found = [(classify(e), str(e.get("object_name") or ""), min(parse_time(e.get("timestamp"), zone) or now_ns,
                                                                      now_ns)) for e in events]
        found += [(("down", n), name, now_ns) for name, n in (counter_downs or {}).items() if n > 0]
        for kind, object_name, ts in found:
            refs = self._refs(object_name, fabric, peers)
            if kind is None or not refs or ts < now_ns - self.window_ns:
                continue
            ends = [p for p in refs if p.switch]
            link = frozenset(p.name for p in refs)
            if not ends:
                continue
            ends_of[link] = [(p.device, p.port) for p in ends]
            when[link] = max(when.get(link, 0), ts)
            if kind[0] == "flap":
                flapped.add(link)
            else:  # a link's own events add up; its ends' counters may count the same downs twice
                side = downs.setdefault(link, {})
                reporter = "link" if link_ends(object_name) else refs[0].name
                side[reporter] = side.get(reporter, 0) + kind[1]
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

    @staticmethod
    def _refs(object_name: str, fabric: Fabric, peers: dict[str, PortRef]) -> list[PortRef]:
        """The known ports of an event's link: both ends named by a link object, else the port and
        its last known peer."""
        names = link_ends(object_name)
        if names is not None:
            return [r for r in (fabric.ports.get(n) or peers.get(names[1 - i]) for i, n in enumerate(names))
                    if r is not None]
        ref = fabric.ports.get(guid_of(object_name))
        return [] if ref is None else [p for p in (ref, peers.get(ref.name)) if p is not None]

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
    ends = link_ends(name)
    if ends is not None:  # a link: tagged by its switch end (the first one), the other end as the peer
        refs = sorted((r for r in map(fabric.ports.get, ends) if r is not None), key=lambda r: not r.switch)
        if refs:
            peer = {"peer": f"{refs[1].device}:{refs[1].port}"} if len(refs) > 1 else {}
            return {"device": refs[0].device, "port": refs[0].port, **peer}
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
