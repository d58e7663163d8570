"""Liveness, version, the telemetry store's state (and its quarantine), the cluster's members and the
service's own Prometheus metrics."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from nms import __version__
from nms.app.api.deps import MetricsDep, PublisherDep, StartedAtDep, StoreDep
from nms.app.auth import AUTH_RESPONSES, require

router = APIRouter(tags=["system"])


class Health(BaseModel):
    status: str
    store_ok: bool
    bus_ok: bool | None = Field(None, description="a cluster's API: connected to the telemetry bus (absent "
                                                  "without one)")


class Version(BaseModel):
    version: str
    python: str
    store_backend: str
    uptime_s: float


@router.get("/health", response_model=Health, response_model_exclude_none=True,
            summary="Liveness, store and (in a cluster) bus health (no token needed)")
def health(store: StoreDep, publisher: PublisherDep, response: Response) -> Health:
    store_ok = bool(store.health().get("ok"))
    bus_ok = bool(publisher.bus.health().get("ok")) if publisher is not None else None
    ok = store_ok and bus_ok is not False  # a cluster's API without its bus cannot take ingest: 503
    if not ok:
        response.status_code = 503
    return Health(status="ok" if ok else "degraded", store_ok=store_ok, bus_ok=bus_ok)


@router.get("/version", response_model=Version, dependencies=[Depends(require("read"))], responses=AUTH_RESPONSES)
def version(store: StoreDep, started_at: StartedAtDep) -> Version:
    return Version(version=__version__, python=platform.python_version(), store_backend=store.name,
                   uptime_s=round(time.time() - started_at, 3))


class QuarantinedPoint(BaseModel):
    ts: int = Field(description="when it was quarantined, ns since the epoch")
    reason: str
    line: str


class StoreState(BaseModel):
    backend: str
    health: dict[str, Any]
    stats: dict[str, float]
    quarantined: list[QuarantinedPoint]


class Replayed(BaseModel):
    replayed: int


@router.get("/store", response_model=StoreState, dependencies=[Depends(require("read"))],
            responses=AUTH_RESPONSES, summary="The telemetry store's health, counters and newest quarantined points")
def store_state(store: StoreDep, limit: int = Query(20, ge=0, le=1000, description="quarantined points shown")):
    return StoreState(backend=store.name, health=store.health(), stats=store.stats(),
                      quarantined=store.quarantined(limit) if limit else [])


@router.post("/store/quarantine/replay", response_model=Replayed, dependencies=[Depends(require("admin"))],
             responses=AUTH_RESPONSES, summary="Send the quarantined points again (after fixing their cause)")
def replay_quarantine(store: StoreDep) -> Replayed:
    return Replayed(replayed=store.replay_quarantine())


class ClusterMember(BaseModel):
    member: str
    roles: list[str]
    host: str
    pid: int
    since: float = Field(description="when the member started, epoch seconds")
    health: dict[str, Any] = Field(description="ok, store_ok, bus_ok, state_ok (and state_error), and its share: "
                                               "switches polled, partitions correlated")


@router.get("/cluster/members", response_model=list[ClusterMember], dependencies=[Depends(require("read"))],
            responses=AUTH_RESPONSES, summary="Every live cluster member's roles and health, as it put them in the bus")
async def cluster_members(request: Request) -> list[dict[str, Any]]:
    """From the bus's member entries (renewed every 5 s, gone 12.5 s after a member's last renewal);
    a process without a bus lists itself."""
    service = request.app.state.service
    if service.member_health is not None:
        return service.member_health.entries()
    health = await asyncio.to_thread(service.health)
    return [{"member": service.member_name, "roles": sorted(service.roles), "host": socket.gethostname(),
             "pid": os.getpid(), "since": service.started_at, "health": health}]


@router.get("/metrics", dependencies=[Depends(require("read"))], response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                       **AUTH_RESPONSES})
def metrics(service_metrics: MetricsDep) -> Response:
    return Response(generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST)
