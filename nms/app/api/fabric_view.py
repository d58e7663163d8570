"""What the live view (/ui) draws, and the /fabric/stream that carries it: the topology in tiers,
each link's state and utilization from the poller's recent window, the jobs running now, and the
link state changes as they come.

The views are computed on the event loop (the poller changes its recent window there), at most
once per REFRESH_S however many browsers follow the stream; the jobs, read from the state
database, at most once per JOBS_REFRESH_S in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import Request
from pydantic import BaseModel, Field

from nms.app.api.sse import KEEPALIVE_S, should_end, sse
from nms.records import FabricTopology, Job, LinkCheck, LinkEvent, LinkState, PortRates
from nms.topology import parse_end

if TYPE_CHECKING:
    from nms.app.polling import Poller
    from nms.state import StateStore

TICK_S = 1.0  # a `links` event at least this often
CHECK_S = 0.25  # how often the stream looks for changes: a link state change goes out within this
REFRESH_S = 0.25  # a view is recomputed at most this often (shared by all streams)
JOBS_REFRESH_S = 2.0
RETRY_MS = 1000  # the browser's EventSource reconnects after this long
MAX_EVENTS_PER_CHECK = 1000
TIERS = {"superspine": 0, "spine": 1, "leaf": 2, "other": 2, "host": 3}  # drawn top to bottom

LINK_STREAM_DOC = (
    f"`text/event-stream`; first `retry: {RETRY_MS}`. With Last-Event-ID, first `event: link_event` per link "
    "state change after that id (ns) still in the recent window. Then `event: topology` (data: TopologyView; "
    "again whenever nodes or cables change), `event: jobs` (data: JobsView, the jobs running now; again when "
    f"they change) and `event: links` (data: LinksUpdate, `id:` its time in ns, rising) at once and at least "
    f"every {TICK_S:g} s, within {CHECK_S:g} s of a link's state or check changing; `event: link_event` "
    "(data: LinkEvent) as the poller sees each change. Ends when the service stops."
)


class NodeView(BaseModel):
    name: str
    kind: str
    role: str | None = None
    tier: int = Field(description="0 superspine, 1 spine, 2 leaf (and other switches), 3 host")
    configured: bool
    reachable: bool | None = None


class LinkView(BaseModel):
    id: str = Field(description="`a--b`: the element name incidents use for this link")
    a: str
    b: str


class TopologyView(BaseModel):
    ts: int
    nodes: list[NodeView]
    links: list[LinkView]


class LinkStatus(BaseModel):
    check: LinkCheck
    state: LinkState
    flapping: bool = False
    expected: str | None = None
    utilization: float | None = Field(None, description="the busiest direction of either end, 0..1")
    bps_ab: float | None = Field(None, description="bits/s from a to b (a's out, else b's in)")
    bps_ba: float | None = None


class LinksUpdate(BaseModel):
    ts: int
    links: dict[str, LinkStatus]


class JobsView(BaseModel):
    ts: int
    jobs: list[Job]


def _tier(kind: str, role: str | None) -> int:
    return TIERS["host"] if kind == "host" else TIERS.get(role or "other", TIERS["other"])


def _utilization(*rates: PortRates | None) -> float | None:
    values = [v for r in rates if r is not None for v in (r.in_utilization, r.out_utilization) if v is not None]
    return max(values) if values else None


def views_of(topo: FabricTopology, rates: dict[tuple[str, str], PortRates]) -> tuple[TopologyView, LinksUpdate]:
    nodes = [NodeView(name=n.name, kind=n.kind, role=n.role, tier=_tier(n.kind, n.role), configured=n.configured,
                      reachable=n.reachable) for n in topo.nodes]
    links, status = [], {}
    for link in topo.links:
        link_id = f"{link.a}--{link.b}"
        ra, rb = rates.get(parse_end(link.a)), rates.get(parse_end(link.b))
        links.append(LinkView(id=link_id, a=link.a, b=link.b))
        status[link_id] = LinkStatus(
            check=link.check, state=link.state, flapping=link.flapping, expected=link.expected,
            utilization=_utilization(ra, rb),
            bps_ab=ra.out_bps if ra is not None else rb.in_bps if rb is not None else None,
            bps_ba=ra.in_bps if ra is not None else rb.out_bps if rb is not None else None)
    return (TopologyView(ts=topo.generated_ns, nodes=nodes, links=links),
            LinksUpdate(ts=topo.generated_ns, links=status))


class FabricViews:
    """The current views, shared by every stream of one app: from the poller's recent window and
    topology, and the jobs in the state database."""

    def __init__(self, poller: Poller, state: StateStore):
        self.poller = poller
        self.state = state
        self._views: tuple[TopologyView, LinksUpdate] | None = None
        self._views_at = -1e9
        self._jobs: JobsView | None = None
        self._jobs_at = -1e9

    def current(self) -> tuple[TopologyView, LinksUpdate]:
        if self._views is None or time.monotonic() - self._views_at >= REFRESH_S:
            poller = self.poller
            self._views = views_of(poller.topology(), poller.recent.rates)
            self._views_at = time.monotonic()
        return self._views

    async def jobs(self) -> JobsView:
        if self._jobs is None or time.monotonic() - self._jobs_at >= JOBS_REFRESH_S:
            now = time.time_ns()
            jobs = await asyncio.to_thread(self.state.list_jobs, active_at=now, limit=1000)
            self._jobs, self._jobs_at = JobsView(ts=now, jobs=jobs), time.monotonic()
        return self._jobs

    def events_after(self, ts_ns: int) -> list[LinkEvent]:
        return [e for e in self.poller.recent.events if e.ts > ts_ns][-MAX_EVENTS_PER_CHECK:]

    def new_events(self, last: LinkEvent | None) -> tuple[list[LinkEvent], LinkEvent | None]:
        """The link events that arrived after `last` (arrival order; `last` None: all), and the new
        cursor. Events leave the recent window oldest first, so when `last` is gone every event
        still there came after it."""
        events = self.poller.recent.events
        out = []
        for event in reversed(events):
            if event is last:
                break
            out.append(event)
        out.reverse()
        return out[-MAX_EVENTS_PER_CHECK:], (events[-1] if events else last)


def _signature(update: LinksUpdate) -> dict[str, tuple]:
    return {k: (s.state, s.check, s.flapping) for k, s in update.links.items()}


async def link_stream(request: Request, views: FabricViews, last_event_id: int | None,
                      running: Callable[[], bool]) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n: fabric links\n\n"
    topo, links = views.current()
    _, cursor = views.new_events(None)
    if last_event_id is not None:
        for event in views.events_after(last_event_id):
            yield sse("link_event", event.model_dump_json())
    jobs = await views.jobs()
    yield sse("topology", topo.model_dump_json())
    yield sse("jobs", jobs.model_dump_json())
    yield sse("links", links.model_dump_json(), links.ts)
    sent_id, sent_at, signature = links.ts, time.monotonic(), _signature(links)
    while not await should_end(request, running):
        await asyncio.sleep(CHECK_S)
        new_topo, links = views.current()
        if (new_topo.nodes, new_topo.links) != (topo.nodes, topo.links):
            topo = new_topo
            yield sse("topology", topo.model_dump_json())
        events, cursor = views.new_events(cursor)
        for event in events:
            yield sse("link_event", event.model_dump_json())
        new_jobs = await views.jobs()
        if new_jobs.jobs != jobs.jobs:
            jobs = new_jobs
            yield sse("jobs", jobs.model_dump_json())
        changed = _signature(links) != signature
        if links.ts > sent_id and (changed or time.monotonic() - sent_at >= TICK_S):
            yield sse("links", links.model_dump_json(), links.ts)
            sent_id, sent_at, signature = links.ts, time.monotonic(), _signature(links)
        elif time.monotonic() - sent_at >= KEEPALIVE_S:  # links.ts stuck: never silent for long
            sent_at = time.monotonic()
            yield ": keep-alive\n\n"
