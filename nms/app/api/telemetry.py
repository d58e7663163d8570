"""Backend-neutral telemetry reads (the same answers from the embedded store and InfluxDB)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException
from fastapi import Query as Param
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from nms.app.api.deps import StoreDep
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, require
from nms.store import Query, Series, parse_tag_filters
from nms.store.base import INT64_MAX

router = APIRouter(prefix="/telemetry", tags=["telemetry"], dependencies=[Depends(require("read"))],
                   responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})


class QueryResult(BaseModel):
    series: list[Series]


class TelemetryQuery(Query):
    """A store Query whose schema states its rules: window_ns and agg go together, an aggregation
    names its fields, a tag filter lists at least one value. Not expressible in the schema: end
    must be after start."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"properties": {"window_ns": {"type": "null"}, "agg": {"type": "null"}}},
        {"required": ["window_ns", "agg", "fields"],
         "properties": {"window_ns": {"type": "integer"}, "agg": {"type": "string"},
                        "fields": {"type": "array", "minItems": 1}}}]})

    start: int = Field(ge=0, le=INT64_MAX)
    end: int = Field(gt=0, le=INT64_MAX, description="after start")
    tags: dict[str, Annotated[list[str], Field(min_length=1)]] = Field(
        default_factory=dict, description="tag key -> accepted values (OR)")
    window_ns: int | None = Field(None, gt=0, le=INT64_MAX,
                                  description="aggregation window; buckets align to the epoch; with agg")
    fields: list[str] | None = Field(None, description="fields to return; all when absent; required with agg")


@router.post("/query", response_model=QueryResult, summary="Rows or windowed aggregates of one measurement")
def query(q: TelemetryQuery, store: StoreDep) -> QueryResult:
    return QueryResult(series=store.query(q))


@router.get("/latest", response_model=QueryResult, summary="Newest row of each matching series")
def latest(store: StoreDep,
           measurement: str = Param(min_length=1, max_length=256),
           tag: list[Annotated[str, StringConstraints(pattern=r"^[^=]+=")]] = Param(
               [], description="key=value; repeat for OR within a key, AND across keys"),
           field: list[str] = Param([], description="fields to return (all when absent)")) -> QueryResult:
    try:
        tags = parse_tag_filters(tag)
    except ValueError as e:  # same shape as FastAPI's own validation errors
        raise HTTPException(422, [{"loc": ["query", "tag"], "msg": str(e), "type": "value_error"}]) from None
    return QueryResult(series=store.latest(measurement, tags, field or None))
