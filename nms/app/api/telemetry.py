"""Backend-neutral telemetry reads (the same answers from the embedded store and InfluxDB)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query as Param, Request
from pydantic import BaseModel

from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, require
from nms.store import Query, Series, parse_tag_filters

router = APIRouter(prefix="/telemetry", tags=["telemetry"], dependencies=[Depends(require("read"))],
                   responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})


class QueryResult(BaseModel):
    series: list[Series]




@router.post("/query", response_model=QueryResult, summary="Rows or windowed aggregates of one measurement")
def query(q: Query, request: Request) -> QueryResult:
    return QueryResult(series=request.app.state.service.store.query(q))


@router.get("/latest", response_model=QueryResult, summary="Newest row of each matching series")
def latest(request: Request,
           measurement: str = Param(min_length=1, max_length=256),
           tag: list[str] = Param([], description="key=value; repeat for OR within a key, AND across keys"),
           field: list[str] = Param([], description="fields to return (all when absent)")) -> QueryResult:
    try:
        tags = parse_tag_filters(tag)
    except ValueError as e:  # same shape as FastAPI's own validation errors
        raise HTTPException(422, [{"loc": ["query", "tag"], "msg": str(e), "type": "value_error"}]) from None
    return QueryResult(series=request.app.state.service.store.latest(measurement, tags, field or None))
