"""Notification deliveries and sinks: what was sent where, what is pending, what failed."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query

from nms.app.api.deps import NotifierDep
from nms.app.auth import AUTH_RESPONSES, require
from nms.app.notify import SinkInfo
from nms.records import NotificationDelivery

router = APIRouter(prefix="/notifications", tags=["notifications"], responses=AUTH_RESPONSES)


@router.get("/deliveries", response_model=list[NotificationDelivery], dependencies=[Depends(require("read"))])
def list_deliveries(notifier: NotifierDep,
                    incident: int | None = Query(None, ge=0, le=(1 << 63) - 1,
                                                 description="only deliveries of this incident id"),
                    state: Literal["pending", "delivered", "failed"] | None = Query(None),
                    sink: str | None = Query(None, max_length=128, description="only this sink (its name)"),
                    limit: int = Query(100, ge=1, le=10_000)) -> list[NotificationDelivery]:
    """Deliveries, newest first; failed ones keep the HTTP status and a short, secret-free reason."""
    return notifier.deliveries(incident_id=incident, state=state, sink=sink, limit=limit)


@router.get("/sinks", response_model=list[SinkInfo], dependencies=[Depends(require("read"))])
def list_sinks(notifier: NotifierDep) -> list[SinkInfo]:
    """The configured sinks (URLs without credentials or query) and their delivery counts."""
    return notifier.sinks()
