"""/incidents: list, read and acknowledge incidents, their history, and a live Server-Sent Events
stream of incident events (correlator.incidents keeps the lifecycle)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from correlator.incidents import IncidentManager, StreamEvent, Subscription
from nms.app.api.deps import IncidentsDep, RunningDep
from nms.app.api.sse import HEADERS, KEEPALIVE_S, EventStream, should_end
from nms.app.api.sse import sse as _sse
from nms.app.auth import (
    AUTH_RESPONSES,
    BAD_BODY_RESPONSE,
    STREAM_AUTH_RESPONSES,
    ErrorDetail,
    Principal,
    require,
    require_ui,
)
from nms.app.binding import require_unbound
from nms.records import FaultKind, Incident, IncidentState, TimestampNs
from nms.state import IncidentEventEntry

router = APIRouter(prefix="/incidents", tags=["incidents"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})
IncidentId = Annotated[int, Path(ge=1, le=2**63 - 1)]
NOT_FOUND = {404: {"model": ErrorDetail, "description": "no such incident"}}
TICK_S = 1.0  # how often an idle stream checks for a gone client or a stopping server


class AckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(None, max_length=1024, description="kept with the acknowledged event")


class IncidentWithChildren(Incident):
    """An incident with the incidents it explains (docs/correlator.md, "One incident per failure")."""

    child_incidents: list[Incident] = Field(default_factory=list,
                                            description="the incidents whose parent_id is this one, in full, oldest "
                                                        "first (a child's own is empty)")


def _nested(incidents: IncidentManager, parents: list[Incident]) -> list[IncidentWithChildren]:
    kids = incidents.children([i.id for i in parents if i.children])
    return [IncidentWithChildren(**dict(i), child_incidents=kids.get(i.id, [])) for i in parents]


def _incident(incidents: IncidentManager, incident_id: int) -> Incident:
    incident = incidents.get(incident_id)
    if incident is None:
        raise HTTPException(404, f"no incident {incident_id}")
    return incident


def _item(item: StreamEvent) -> str:
    return _sse(item.event.event, item.event.model_dump_json(), item.id)


async def _stream(request: Request, sub: Subscription, snapshot: bool,
                  running: Callable[[], bool]) -> AsyncIterator[str]:
    """The stream follows the service: it ends when the client goes, the server is stopping, or the
    service is not running (then at once, after the snapshot and backlog: nothing live can come)."""
    try:
        yield ": incident events\n\n"
        for incident in sub.snapshot if snapshot else ():
            yield _sse("snapshot", incident.model_dump_json())
        for item in sub.backlog:
            yield _item(item)
        written = time.monotonic()
        while not await should_end(request, running):
            try:
                item = await asyncio.wait_for(anext(sub), TICK_S)
            except TimeoutError:
                if time.monotonic() - written >= KEEPALIVE_S:
                    written = time.monotonic()
                    yield ": keep-alive\n\n"
                continue
            except StopAsyncIteration:
                if sub.dropped:
                    yield ": dropped: this client fell too far behind; reconnect with Last-Event-ID\n\n"
                return
            written = time.monotonic()
            yield _item(item)
    finally:
        sub.close()


@router.get("/stream", response_class=EventStream, dependencies=[Depends(require_ui("read"))],
            summary="Live incident events (Server-Sent Events)",
            responses={**STREAM_AUTH_RESPONSES,
                       200: {"description": "`text/event-stream`: `event: opened|updated|resolved|acknowledged`, "
                                            "`id:` the event's rising id, `data:` the IncidentEvent as JSON; with "
                                            "?state=open first `event: snapshot` lines, `data:` an open Incident; "
                                            f"a comment line every {KEEPALIVE_S:g} s when idle. It ends when the "
                                            "service stops (at once when it is not running). Also accepts the "
                                            "live view's session cookie (/ui)",
                             "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
async def stream(
    request: Request,
    incidents: IncidentsDep,
    running: RunningDep,
    state: Literal["open"] | None = Query(None, description="open: first the incidents open now"),
    # int, not int | None: a header has no null (a schema saying so gets "null" sent)
    last_event_id: Annotated[
        int, Header(ge=0, le=2**63 - 1, description="resume: the events after this id come first")
    ] = None,
):
    sub = incidents.subscribe(after=last_event_id)
    return EventStream(_stream(request, sub, snapshot=state == "open", running=running), headers=HEADERS)


@router.get("", response_model=list[IncidentWithChildren], dependencies=[Depends(require("read"))],
            summary="Incidents, newest first: top-level ones with their children nested (or every one with flat)")
def list_incidents(incidents: IncidentsDep, state: IncidentState | None = None, kind: FaultKind | None = None,
                   job: str | None = Query(None, max_length=128, description="only incidents that affect this job"),
                   element: str | None = Query(None, max_length=512, description="an element, a link end (dev:port) "
                                                                                 "or a device: what touches it"),
                   since: TimestampNs | None = Query(None, description="active at or after (ns or RFC 3339)"),
                   until: TimestampNs | None = Query(None, description="active at or before (ns or RFC 3339)"),
                   flat: bool = Query(False, description="every incident as its own item, children too (with "
                                                         "child_incidents empty); without it, the top-level incidents "
                                                         "that match or have a child that matches (state: the "
                                                         "top-level one's), each with its children"),
                   limit: int = Query(1000, ge=1, le=100_000)) -> list[Incident]:
    if since is not None and until is not None and until < since:
        raise HTTPException(422, [{"loc": ["query", "until"], "msg": "until is before since", "type": "value_error"}])
    found = incidents.list(state=state, kind=kind, job=job, element=element, since_ns=since, until_ns=until,
                           limit=limit, top_level=not flat)
    return found if flat else list(_nested(incidents, found))


@router.get("/{incident_id}", response_model=IncidentWithChildren, dependencies=[Depends(require_ui("read"))],
            responses=NOT_FOUND, summary="One incident, with its children (parent_id names a child's parent); "
                                         "also accepts the live view's session cookie (its details panel re-reads "
                                         "the incidents it shows)")
def get_incident(incident_id: IncidentId, incidents: IncidentsDep) -> IncidentWithChildren:
    return _nested(incidents, [_incident(incidents, incident_id)])[0]


@router.get("/{incident_id}/events", response_model=list[IncidentEventEntry], dependencies=[Depends(require("read"))],
            responses=NOT_FOUND, summary="An incident's history, oldest first")
def incident_events(incident_id: IncidentId, incidents: IncidentsDep,
                    limit: int = Query(1000, ge=1, le=100_000)) -> list[IncidentEventEntry]:
    _incident(incidents, incident_id)
    return incidents.events(incident_id, limit=limit)


@router.post("/{incident_id}/ack", response_model=Incident, summary="Acknowledge an incident (the first ack counts)",
             responses={**NOT_FOUND, 403: {"model": ErrorDetail,
                                           "description": "token lacks scope act, or is bound to a host"}})
def acknowledge(incident_id: IncidentId, incidents: IncidentsDep, body: AckBody | None = None,
                who: Principal = Depends(require_unbound("act"))) -> Incident:
    try:
        event = incidents.acknowledge(incident_id, who.name, body.comment if body else None)
    except KeyError:
        raise HTTPException(404, f"no incident {incident_id}") from None
    return event.incident
