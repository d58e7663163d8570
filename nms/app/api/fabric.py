"""The fabric as the collectors see it: topology, per-device collector status, ports, link events,
and a live stream of link states and utilization (what the live view, /ui, draws).

These read the service's in-memory recent window (what the last polls found). History of rates
and counters is in the store: `GET /telemetry/latest?measurement=port_rates` or
`POST /telemetry/query` with `port_rates`, `port_counters`, `link_event`, `lldp_neighbor`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi import Query as Param
from pydantic import BaseModel

from nms.app.api.deps import FabricViewsDep, PollerDep, RunningDep
from nms.app.api.fabric_view import LINK_STREAM_DOC, link_stream
from nms.app.api.sse import HEADERS, EventStream
from nms.app.auth import AUTH_RESPONSES, STREAM_AUTH_RESPONSES, ErrorDetail, require, require_ui
from nms.records import DeviceStatus, FabricPath, FabricTopology, LinkEvent, PortRates, PortSample
from nms.topology import ecmp_paths

router = APIRouter(tags=["fabric"], responses=AUTH_RESPONSES)
reads = APIRouter(dependencies=[Depends(require("read"))])  # bearer only; /fabric/stream also takes the view's cookie


class PortView(BaseModel):
    device: str
    port: str
    sample: PortSample
    rates: PortRates | None = None
    flaps_in_window: int = 0
    flapping: bool = False


class PathSet(BaseModel):
    src: str
    dst: str
    paths: list[FabricPath]


@reads.get("/topology", response_model=FabricTopology,
           summary="Nodes and cables from LLDP, reconciled with the inventory (ok/missing/miscabled/...)")
def topology(poller: PollerDep) -> FabricTopology:
    return poller.topology()


@reads.get("/topology/paths", response_model=PathSet, summary="The equal-cost paths between two hosts",
           responses={404: {"model": ErrorDetail, "description": "unknown node"}})
def paths(poller: PollerDep, src: str = Param(min_length=1, max_length=128),
          dst: str = Param(min_length=1, max_length=128),
          include_down: bool = Param(False, description="also use cables that are down")) -> PathSet:
    topo = poller.topology()
    names = {n.name for n in topo.nodes}
    for host in (src, dst):
        if host not in names:
            raise HTTPException(404, f"unknown node {host!r}")
    return PathSet(src=src, dst=dst, paths=ecmp_paths(topo, src, dst, include_down=include_down))


@reads.get("/devices", response_model=list[DeviceStatus], summary="Collector status per device")
def devices(poller: PollerDep) -> list[DeviceStatus]:
    return poller.devices()


@reads.get("/ports", response_model=list[PortView], summary="Latest counters, rates and flap count per port")
def ports(poller: PollerDep,
          device: list[str] = Param([], description="only these devices (repeatable)")) -> list[PortView]:
    recent = poller.recent
    wanted = set(device)
    out = []
    for key, sample in sorted(recent.samples.items()):
        if wanted and key[0] not in wanted:
            continue
        flaps = poller.links.flaps(key[0], key[1], sample.ts)
        out.append(PortView(device=key[0], port=key[1], sample=sample, rates=recent.rates.get(key),
                            flaps_in_window=flaps, flapping=flaps > poller.links.flap_count))
    return out


@reads.get("/links/events", response_model=list[LinkEvent], summary="Recent link state changes (newest last)")
def link_events(poller: PollerDep, device: list[str] = Param([], description="only these devices (repeatable)"),
                limit: int = Param(1000, ge=1, le=10_000)) -> list[LinkEvent]:
    wanted = set(device)
    events = [e for e in poller.recent.events if not wanted or e.device in wanted]
    return events[-limit:]


router.include_router(reads)


@router.get(
    "/fabric/stream",
    response_class=EventStream,
    dependencies=[Depends(require_ui("read"))],
    summary="Live link states and utilization (Server-Sent Events)",
    responses={
        **STREAM_AUTH_RESPONSES,
        200: {
            "description": LINK_STREAM_DOC,
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "description": "one event",
                        "properties": {
                            "event": {"enum": ["topology", "jobs", "links", "link_event"]},
                            "data": {"type": "string", "description": "JSON"},
                            "id": {"type": "string"},
                        },
                    }
                }
            },
        },
    },
)
async def fabric_stream(request: Request, views: FabricViewsDep, running: RunningDep,
                        # int, not int | None: a header has no null (a schema saying so gets "null" sent)
                        last_event_id: Annotated[int, Header(ge=0, le=2**63 - 1,
                                                             description="resume: the link state changes after "
                                                                         "this id (ns) come first")] = None):
    return EventStream(link_stream(request, views, last_event_id, running), headers=HEADERS)
