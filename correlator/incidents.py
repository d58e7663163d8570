"""The incident lifecycle: findings of each correlator window -> incidents (open -> updated ->
resolved after N clean windows), persisted in the state store, with listeners (notifiers) and a
live fan-out for the API's event stream.

One open incident per dedup key (`element_kind:element`: one per element). A finding refreshes
its open incident every window (kind, last seen, evidence, paths, jobs, confidence), but an
`updated` event is emitted only when something an operator cares about changed since the last
opened/updated event: the kind (a link down that turns out to flap), severity, the summary
(numbers in it ignored) or direction, the set of jobs, or the number of affected paths by half
or more. One incident per failure: a finding that explains others (`Finding.explains`: a dead
switch its links) is a parent, the incidents of what it explains its children (adopted when
they came first), which wait for it and resolve with it or are re-raised (docs/correlator.md).
`apply` runs in a worker thread; listeners run after the commit, in event
order, under the manager's lock (they must be quick: a notifier enqueues). Stream subscribers
get events through their asyncio loop (`call_soon_threadsafe`) into a bounded queue; one that
falls `queue_size` events behind is dropped with a log line, never slowing `apply`. With a state store
that several processes share (`share_stream`), subscribers get instead what every process committed,
read back in id order (`follow`, called every FOLLOW_S): an API worker streams the incidents that
correlate members open, and a correlate member the others' too.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from nms.records import Finding, Incident, IncidentEvent, IncidentEventKind, IncidentState
from nms.state import IncidentEventEntry, StateStore

log = logging.getLogger(__name__)
SEVERITY_RANK = {"warning": 0, "minor": 1, "major": 2, "critical": 3}
EXPLAINED_KINDS = frozenset({"link_down", "link_flapping", "nic_down"})  # what a parent's fault can explain
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
FOLLOW_S = 0.5  # how often a shared stream reads the committed events back


class StreamEvent(NamedTuple):
    """An event as a stream subscriber gets it: with its history id (rising, never reused)."""

    id: int
    event: IncidentEvent


def changed(before: Incident, after: Incident) -> list[str]:
    """What an operator would call a change of an open incident (empty: nothing worth an event)."""
    what = []
    if before.kind != after.kind:
        what.append("kind")
    if before.severity != after.severity:
        what.append("severity")
    if _NUMBER.sub("#", before.summary) != _NUMBER.sub("#", after.summary) or before.direction != after.direction:
        what.append("summary")
    if set(before.jobs) != set(after.jobs):
        what.append("jobs")
    old, new = len(before.paths), len(after.paths)
    if old != new and abs(new - old) >= max(1, old / 2):
        what.append("paths")
    return what


def _strongest(findings: list[Finding]) -> dict[str, Finding]:
    """One finding per dedup key: the most severe, then the most confident."""
    best: dict[str, Finding] = {}
    for f in findings:
        held = best.get(f.dedup_key)
        if held is None or (SEVERITY_RANK[f.severity], f.confidence) > (SEVERITY_RANK[held.severity], held.confidence):
            best[f.dedup_key] = f
    return best


def _opened(f: Finding, window_ns: int) -> Incident:
    return Incident(id=0, dedup_key=f.dedup_key, kind=f.kind, element=f.element, element_kind=f.element_kind,
                    direction=f.direction, severity=f.severity, summary=f.summary, confidence=f.confidence,
                    evidence=f.evidence, paths=f.paths, jobs=f.jobs, opened_ns=window_ns, updated_ns=window_ns,
                    last_seen_ns=window_ns)


def _bumped(incident: Incident, window_ns: int) -> Incident:
    return incident.model_copy(update={"updates": incident.updates + 1, "updated_ns": window_ns})


def _refreshed(incident: Incident, f: Finding, window_ns: int) -> Incident:
    # a flapping link that is down at the moment is still the flapping link: its incident keeps saying so
    # (kind, severity, summary), not an `updated` to link_down and back every few seconds while it flaps
    said = incident if (incident.kind, f.kind) == ("link_flapping", "link_down") else f
    return incident.model_copy(update={
        "kind": said.kind, "element_kind": f.element_kind, "direction": f.direction, "severity": said.severity,
        "summary": said.summary, "confidence": f.confidence, "evidence": f.evidence, "paths": f.paths, "jobs": f.jobs,
        "last_seen_ns": window_ns, "clean_windows": 0})


class IncidentManager:
    def __init__(self, state: StateStore, resolve_after: int, queue_size: int = 1000, window_ns: int = 10**9):
        self.state = state
        self.resolve_after = resolve_after
        self.window_ns = window_ns  # a clean window counts once this much time has passed, however often steps run
        self.queue_size = queue_size
        self._lock = threading.RLock()
        self._listeners: list[Callable[[IncidentEvent], None]] = []
        self._subscribers: set[Subscription] = set()
        self._open: dict[str, Incident] = {}  # by dedup key; the same as the state store's open rows
        self._announced: dict[int, Incident] = {}  # by id: as of its last opened/updated event
        self._shared = False  # subscribers follow the shared state's events (share_stream), not `apply`'s
        # other correlators write incidents to the same state (a cluster's sharded correlate members):
        # each window starts from what is stored for the keys at hand (nms.app.service sets it)
        self.follows_others = False
        self._cursor = 0  # the newest event id handed to them then
        for incident in reversed(state.list_incidents(state="open", limit=None)):  # a restart: they continue
            self._open[incident.dedup_key] = incident
            last = state.last_incident_event(incident.id, ("opened", "updated"))
            self._announced[incident.id] = last.incident if last is not None else incident

    # --- the lifecycle ---------------------------------------------------------------------------

    def apply(self, findings: builtins.list[Finding], window_ns: int) -> builtins.list[IncidentEvent]:
        """One correlator window: open, refresh, adopt or resolve incidents; returns the events emitted."""
        best = _strongest(findings)
        with self._lock:
            if not best and not self._open:
                return []
            if self.follows_others:
                self._sync({k for f in best.values() for k in f.explains})
            now_open, announced, emitted = dict(self._open), {}, []
            with self.state.incident_batch() as batch:

                def emit(kind: IncidentEventKind, incident: Incident,
                         absorbed: builtins.list[int] | None = None) -> None:
                    event = IncidentEvent(event=kind, ts=window_ns, incident=incident, absorbed=absorbed or [])
                    emitted.append(StreamEvent(batch.add_event(event), event))

                def keep(incident: Incident, event: IncidentEventKind | None = None,
                         absorbed: builtins.list[int] | None = None) -> None:
                    batch.update(incident)
                    now_open[incident.dedup_key] = incident
                    if event is not None:
                        announced[incident.id] = incident
                        emit(event, incident, absorbed)

                def refreshed(key: str, finding: Finding, parent_id: int | None = None
                              ) -> tuple[Incident, IncidentEventKind | None]:
                    """The key's incident opened (a new one: with `parent_id`) or refreshed, not yet kept."""
                    current = now_open.get(key)
                    if current is None:
                        opened = _opened(finding, window_ns).model_copy(update={"parent_id": parent_id})
                        stored, new = batch.insert(opened)
                        if new:
                            return stored, "opened"
                        # another correlator sharing the state store opened it first: continue that one
                        log.info("incident %d (%s) was opened by another correlator: continued", stored.id, key)
                        current = stored
                    incident = _refreshed(current, finding, window_ns)
                    what = changed(announced.get(current.id) or self._announced.get(current.id, current), incident)
                    if not what:
                        return incident, None
                    log.info("incident %d (%s) updated: %s", incident.id, key, ", ".join(what))
                    return _bumped(incident, window_ns), "updated"

                done = self._parents(best, now_open, window_ns, refreshed, keep)
                for key, finding in best.items():
                    if key not in done:
                        keep(*refreshed(key, finding))
                self._resolve(best, now_open, window_ns, batch, emit, keep)
            # committed: now the memory follows
            self._open = now_open
            self._announced.update(announced)
            for item in emitted:
                if item.event.event == "resolved":
                    self._announced.pop(item.event.incident.id, None)
            self._dispatch(emitted)
        return [item.event for item in emitted]

    def _sync(self, explained: set[str]) -> None:
        """The incidents this manager holds as stored (another member may have adopted one under its
        parent, or resolved it), and the open ones its findings explain that another member opened
        (its children to adopt: one failure, one page, in a sharded cluster too)."""
        stored = self.state.open_incidents_keyed(set(self._open) | explained)
        for key in [k for k in self._open if k not in stored]:
            del self._open[key]
        for key, incident in stored.items():
            if key in self._open or key in explained:
                self._open[key] = incident

    def _parents(self, best: dict[str, Finding], now_open: dict[str, Incident], window_ns: int, refreshed, keep
                 ) -> set[str]:
        """Findings that explain others (a dead switch its links): their incidents, and as children
        the incidents of what they explain: opened silently, or adopted when they came first (then
        the parent's event lists them as `absorbed`). One level: a child's own children move up to
        its new parent. Returns the keys handled here."""
        explained = {k for key, f in best.items() for k in f.explains if k != key}
        done: set[str] = set()
        for key, finding in best.items():
            current = now_open.get(key)
            if not finding.explains or key in explained or (current is not None and current.parent_id is not None):
                continue
            parent, event = refreshed(key, finding)
            by_id = {i.id: i for i in now_open.values()}
            kids, absorbed, child_events = set(parent.children), [], []
            for k in finding.explains:
                own, child = best.get(k), now_open.get(k)
                kind = own.kind if own is not None else child.kind if child is not None else None
                if k == key or k in done or kind not in EXPLAINED_KINDS:
                    continue
                if child is None and own is not None:
                    child, child_event = refreshed(k, own, parent.id)
                elif child is not None and child.parent_id is None:
                    for gid in child.children:  # one level only: grandchildren come along
                        if (grand := by_id.get(gid)) is not None:
                            keep(grand.model_copy(update={"parent_id": parent.id}))
                            kids.add(gid)
                    child = child.model_copy(update={"parent_id": parent.id, "adopted_ns": window_ns, "children": []})
                    child = _bumped(_refreshed(child, own, window_ns) if own is not None else child, window_ns)
                    child_event = "updated"
                    absorbed.append(child.id)
                    log.info("incident %d (%s) adopted by incident %d (%s)", child.id, k, parent.id, key)
                else:
                    continue  # already a child: refreshed like any other
                done.add(k)
                kids.add(child.id)
                child_events.append((child, child_event))
            parent = parent.model_copy(update={"children": sorted(kids), "explains": finding.explains})
            if absorbed and event is None:
                parent, event = _bumped(parent, window_ns), "updated"
            keep(parent, event, sorted(absorbed))
            for child, child_event in child_events:
                keep(child, child_event)
            done.add(key)
        return done

    def _resolve(self, best: dict[str, Finding], now_open: dict[str, Incident], window_ns: int, batch, emit,
                 keep) -> None:
        """Incidents without a finding this window count clean windows and resolve after
        `resolve_after`. A child waits for its parent (the parent's fault explains its silence);
        when the parent resolves, a child whose own finding is in this window is re-raised as a
        top-level incident (its fault outlived the explanation), the others resolve with it."""
        open_ids = {i.id for i in now_open.values()}
        parents = []
        for key, incident in builtins.list(now_open.items()):
            if key in best:
                continue
            # one per step, but never more than the windows since it was last seen: an extra
            # step (path events) or a late one must not change how long "N clean windows" is
            clean = min(incident.clean_windows + 1, round((window_ns - incident.last_seen_ns) / self.window_ns))
            if clean < self.resolve_after or incident.parent_id in open_ids:
                if clean != incident.clean_windows:
                    keep(incident.model_copy(update={"clean_windows": clean}))
                continue
            incident = incident.model_copy(update={"clean_windows": clean, "state": "resolved",
                                                   "resolved_ns": window_ns})
            del now_open[key]
            if incident.children:
                parents.append(incident)
                continue
            batch.update(incident)
            emit("resolved", incident)
        for parent in parents:
            children = [i for i in now_open.values() if i.parent_id == parent.id]
            raised = [c for c in children if c.last_seen_ns == window_ns]
            parent = parent.model_copy(update={"children": [i for i in parent.children
                                                            if i not in {c.id for c in raised}]})
            batch.update(parent)
            emit("resolved", parent)
            for child in children:
                if child in raised:
                    log.info("incident %d (%s) re-raised: its fault outlived its parent %d", child.id,
                             child.dedup_key, parent.id)
                    keep(child.model_copy(update={"parent_id": None}),
                         "updated" if child.adopted_ns is not None else "opened")
                    continue
                child = child.model_copy(update={"state": "resolved", "resolved_ns": window_ns})
                batch.update(child)
                del now_open[child.dedup_key]
                emit("resolved", child)

    def hold(self, keep: Callable[[Incident], bool]) -> tuple[builtins.list[Incident], builtins.list[Incident]]:
        """Sharded correlation (nms/app/correlate_feed.py): continue the open incidents `keep` accepts,
        as the state store has them (opened by another correlator too), and forget the others (another
        correlator continues and resolves them). Returns (taken, given)."""
        with self._lock:
            stored = {i.dedup_key: i for i in reversed(self.state.list_incidents(state="open", limit=None))}
            held = {key: i for key, i in stored.items() if keep(i)}
            taken = [i for key, i in held.items() if key not in self._open]
            given = [i for key, i in self._open.items() if key not in held]
            for incident in given:
                self._announced.pop(incident.id, None)
            for incident in taken:
                last = self.state.last_incident_event(incident.id, ("opened", "updated"))
                self._announced[incident.id] = last.incident if last is not None else incident
            self._open = held
        return taken, given

    def acknowledge(self, incident_id: int, by: str, comment: str | None = None,
                    now_ns: int | None = None) -> IncidentEvent:
        """Record who acknowledged an incident (open or resolved) and when. Only the first ack
        counts: a later one changes nothing, emits nothing, and returns the first as an event.
        A parent's ack acknowledges its children not yet acknowledged (an adopted child's ack goes
        to the sinks: it acknowledges the page it raised). KeyError for an unknown id."""
        with self._lock:
            incident = self.state.get_incident(incident_id)
            if incident is None:
                raise KeyError(incident_id)
            if incident.acknowledged_ns is not None:
                return IncidentEvent(event="acknowledged", ts=incident.acknowledged_ns, incident=incident)
            now = time.time_ns() if now_ns is None else now_ns
            children = [c for c in self.state.incident_children([incident.id]).get(incident.id, [])
                        if c.acknowledged_ns is None]
            items = []
            with self.state.incident_batch() as batch:
                for one, note in [(incident, comment),
                                  *[(c, f"with its parent, incident {incident.id}") for c in children]]:
                    one = one.model_copy(update={"acknowledged_by": by, "acknowledged_ns": now})
                    event = IncidentEvent(event="acknowledged", ts=now, incident=one)
                    batch.update(one)
                    items.append(StreamEvent(batch.add_event(event, note), event))
            for item in items:
                if item.event.incident.state == "open":
                    self._open[item.event.incident.dedup_key] = item.event.incident
            self._dispatch(items)
        return items[0].event

    # --- reading -------------------------------------------------------------------------------

    def get(self, incident_id: int) -> Incident | None:
        return self.state.get_incident(incident_id)

    def events(self, incident_id: int, limit: int = 1000) -> builtins.list[IncidentEventEntry]:
        """One incident's history, oldest first."""
        return self.state.incident_events(incident_id=incident_id, limit=limit)

    def open_incidents(self) -> builtins.list[Incident]:
        with self._lock:
            return sorted(self._open.values(), key=lambda i: i.id)

    def list(self, state: IncidentState | None = None, kind: str | None = None, job: str | None = None,
             element: str | None = None, since_ns: int | None = None, until_ns: int | None = None,
             limit: int = 1000, top_level: bool = False) -> builtins.list[Incident]:
        """Newest first; see StateStore.list_incidents for the filters and `top_level`."""
        return self.state.list_incidents(state=state, kind=kind, job=job, element=element, since_ns=since_ns,
                                         until_ns=until_ns, limit=limit, top_level=top_level)

    def children(self, parent_ids: builtins.list[int]) -> dict[int, builtins.list[Incident]]:
        """The child incidents of these parents, by parent id, oldest first."""
        return self.state.incident_children(parent_ids)

    # --- listeners and the stream ----------------------------------------------------------------

    def add_listener(self, fn: Callable[[IncidentEvent], None]) -> None:
        """`fn(event)` for every event, after its commit, in order (quick: it holds up `apply`)."""
        with self._lock:
            self._listeners.append(fn)

    def share_stream(self) -> None:
        """Subscribers get the events every process committed to the shared state, from now on (`follow`)."""
        with self._lock:
            self._shared, self._cursor = True, self.state.last_incident_event_id()

    def follow(self) -> int:
        """A shared stream's step (any thread; one caller at a time): hand subscribers the events
        committed since the last step, in id order (ids commit in order: nms/state/db.py). How many."""
        entries = self.state.incident_events(after=self._cursor, limit=self.queue_size)
        with self._lock:
            items = [StreamEvent(e.id, IncidentEvent(event=e.event, ts=e.ts, incident=e.incident))
                     for e in entries if e.id > self._cursor]
            if items:
                self._cursor = items[-1].id
            for item in items:
                for sub in builtins.list(self._subscribers):
                    sub.offer(item)
        return len(items)

    def subscribe(self, after: int | None = None) -> Subscription:
        """A live feed of events for the running asyncio loop (call it on that loop). With `after`,
        the events since that id (at most `queue_size`, the newest) come first as `backlog`; the
        incidents open now are in `snapshot`. Both are taken atomically with the subscription:
        nothing falls between them and the live events."""
        loop = asyncio.get_running_loop()
        with self._lock:
            backlog = ([] if after is None else
                       [StreamEvent(e.id, IncidentEvent(event=e.event, ts=e.ts, incident=e.incident))
                        for e in self.state.incident_events(after=after, limit=self.queue_size, newest=True)
                        if not self._shared or e.id <= self._cursor])  # the rest comes from `follow`
            # shared: what the state holds open (other processes' too), not this process's own view
            snapshot = (sorted(self.state.list_incidents(state="open", limit=None), key=lambda i: i.id)
                        if self._shared else self.open_incidents())
            sub = Subscription(self, loop, self.queue_size, backlog, snapshot)
            self._subscribers.add(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(sub)

    def _dispatch(self, items: builtins.list[StreamEvent]) -> None:
        for item in items:
            for fn in self._listeners:
                try:
                    fn(item.event)
                except Exception:
                    log.exception("incident listener %r failed on event %d (%s of incident %d)", fn, item.id,
                                  item.event.event, item.event.incident.id)
            if self._shared:
                continue  # `follow` reads it back from the state, in order with other processes' events
            for sub in builtins.list(self._subscribers):
                sub.offer(item)


_END = object()


class Subscription:
    """Events for one consumer on one asyncio loop, in order: `async for item in sub` (StreamEvent).
    Ends when closed, or when dropped for falling behind (`dropped`)."""

    def __init__(self, manager: IncidentManager, loop: asyncio.AbstractEventLoop, maxsize: int,
                 backlog: list[StreamEvent], snapshot: list[Incident]):
        self.backlog = backlog
        self.snapshot = snapshot
        self.closed = False
        self.dropped = False
        self._manager = manager
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue(maxsize)

    def offer(self, item: StreamEvent) -> None:
        """From any thread; never blocks."""
        try:
            self._loop.call_soon_threadsafe(self._put, item)
        except RuntimeError:  # its loop is closed
            self.closed = True
            self._manager._unsubscribe(self)

    def _put(self, item: object) -> None:  # on the loop
        if self.closed:
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            log.warning("incident stream subscriber dropped: %d events behind", self._queue.maxsize)
            self.dropped = True
            self.close()

    def close(self) -> None:
        """End the subscription (from any thread); a waiting consumer wakes up."""
        if self.closed:
            return
        self.closed = True
        self._manager._unsubscribe(self)
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass

    def _wake(self) -> None:
        if not self._queue.full():
            self._queue.put_nowait(_END)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            raise StopAsyncIteration
        return item
