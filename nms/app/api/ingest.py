"""POST /ingest/<kind>: batches of records. Bad items are rejected with reasons, good ones kept."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from nms.app.api.deps import ConfigDep, MetricsDep, OnIngestDep, PublisherDep, StoreDep
from nms.app.auth import AUTH_RESPONSES, ErrorDetail, Principal, require
from nms.app.binding import own_records
from nms.app.metrics import ServiceMetrics
from nms.app.telemetry_bus import TelemetryPublisher
from nms.bus import BusError
from nms.config import NmsConfig
from nms.records import INGEST_KINDS
from nms.store import TimeSeriesStore, validate_point

router = APIRouter(prefix="/ingest", tags=["ingest"], responses=AUTH_RESPONSES)


class ItemError(BaseModel):
    index: int
    errors: list[str]


class IngestResult(BaseModel):
    accepted: int
    rejected: list[ItemError] = Field(default_factory=list)


def _error_text(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def decode_body(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding gzip, bounded so that a small 'zip bomb' cannot exhaust memory."""
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise HTTPException(415, f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    inflater = zlib.decompressobj(wbits=31)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as e:
        raise HTTPException(400, f"bad gzip body: {e}") from None
    if len(body) > limit or inflater.unconsumed_tail:
        raise HTTPException(413, f"decompressed body larger than {limit} bytes")
    return body


class Ingestor:
    """Validation and storage of one record kind."""

    def __init__(self, kind: str, model: type[BaseModel]):
        self.kind = kind
        self.model = model
        self.item = TypeAdapter(model)
        # {"items": [...]} validated straight from JSON bytes by pydantic-core: the fast path.
        self.envelope = create_model(f"{model.__name__}Batch", __config__=ConfigDict(extra="forbid"),
                                     items=(list[model], ...))

    def validate(self, body: bytes, max_items: int) -> tuple[list[tuple[int, Any]], list[ItemError]]:
        try:
            records = self.envelope.model_validate_json(body).items
        except ValidationError:
            return self._validate_each(body, max_items)
        if len(records) > max_items:
            raise HTTPException(413, f"batch of {len(records)} items exceeds the limit of {max_items}")
        return list(enumerate(records)), []

    def _validate_each(self, body: bytes, max_items: int) -> tuple[list[tuple[int, Any]], list[ItemError]]:
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise HTTPException(400, f"body is not valid JSON: {e}") from None
        if not isinstance(envelope, dict) or set(envelope) != {"items"} or not isinstance(envelope["items"], list):
            raise HTTPException(400, 'body must be an object {"items": [...]} with no other keys')
        items = envelope["items"]
        if len(items) > max_items:
            raise HTTPException(413, f"batch of {len(items)} items exceeds the limit of {max_items}")
        good, bad = [], []
        for i, item in enumerate(items):
            try:
                # validate_json like the fast path, so both paths apply the same (JSON-mode) rules
                good.append((i, self.item.validate_json(json.dumps(item))))
            except ValidationError as e:
                bad.append(ItemError(index=i, errors=[_error_text(err) for err in e.errors(include_input=False)]))
        return good, bad

    def prepare(self, body: bytes, host: str | None, *, max_items: int, on_ingest: Callable[[str, list], list]
                ) -> tuple[list[tuple[int, Any]], list[ItemError]]:
        """Validate, keep a host-bound token's own records, let the service see them (`on_ingest`):
        the (index, record) items to keep and the rejected ones."""
        good, bad = self.validate(body, max_items)
        if host is not None:  # a host-bound token: only its host's records (nms.app.binding)
            good, refused = own_records(good, host)
            bad = sorted(bad + [ItemError(index=i, errors=[reason]) for i, reason in refused], key=lambda e: e.index)
        if good:
            # the service sees the validated records first (clock sync: edges in, windows corrected)
            records = on_ingest(self.kind, [record for _, record in good])
            good = [(index, record) for (index, _), record in zip(good, records, strict=True)]
        return good, bad

    def ingest(self, body: bytes, host: str | None, *, max_items: int, on_ingest: Callable[[str, list], list],
               store: TimeSeriesStore, metrics: ServiceMetrics) -> IngestResult:
        """Validate, let the service see the records (`on_ingest`), store them, count them."""
        good, bad = self.prepare(body, host, max_items=max_items, on_ingest=on_ingest)
        accepted = 0
        if good:
            result = store.write([record.to_point() for _, record in good])
            accepted = result.accepted
            for point_index, reason in result.rejected:
                bad.append(ItemError(index=good[point_index][0], errors=[reason]))
            bad.sort(key=lambda e: e.index)
        return _counted(self.kind, IngestResult(accepted=accepted, rejected=bad), metrics)

    def checked(self, body: bytes, host: str | None, *, max_items: int, on_ingest: Callable[[str, list], list]
                ) -> tuple[list[Any], list[ItemError]]:
        """prepare(), then the store's own point checks (nms.store.validate_point): what a cluster's
        API publishes on the bus, and what it rejects as the single process would."""
        good, bad = self.prepare(body, host, max_items=max_items, on_ingest=on_ingest)
        records = []
        for index, record in good:
            reason = validate_point(record.to_point())
            if reason is None:
                records.append(record)
            else:
                bad.append(ItemError(index=index, errors=[reason]))
        bad.sort(key=lambda e: e.index)
        return records, bad


def _counted(kind: str, result: IngestResult, metrics: ServiceMetrics) -> IngestResult:
    metrics.ingest_items.labels(kind, "accepted").inc(result.accepted)
    metrics.ingest_items.labels(kind, "rejected").inc(len(result.rejected))
    return result


def _route(ingestor: Ingestor):
    async def ingest(request: Request, config: ConfigDep, store: StoreDep, metrics: MetricsDep, on_ingest: OnIngestDep,
                     publisher: PublisherDep, who: Principal = Depends(require("ingest"))) -> JSONResponse:
        body = decode_body(await request.body(), request.headers.get("content-encoding", "").lower(),
                           config.api.max_body_bytes)
        if publisher is not None:  # a cluster: on the bus, answered once JetStream acknowledged it
            return await _publish(ingestor, body, who.host, config, on_ingest, publisher, metrics)
        result = await run_in_threadpool(ingestor.ingest, body, who.host, max_items=config.api.max_items_per_batch,
                                         on_ingest=on_ingest, store=store, metrics=metrics)
        # 422 only when a non-empty batch had nothing worth keeping.
        status = 422 if result.accepted == 0 and result.rejected else 200
        return JSONResponse(result.model_dump(), status_code=status)

    return ingest


async def _publish(ingestor: Ingestor, body: bytes, host: str | None, config: NmsConfig,
                   on_ingest: Callable[[str, list], list], publisher: TelemetryPublisher,
                   metrics: ServiceMetrics) -> JSONResponse:
    records, bad = await run_in_threadpool(ingestor.checked, body, host, max_items=config.api.max_items_per_batch,
                                           on_ingest=on_ingest)
    if records:
        try:
            await publisher.publish(ingestor.kind, records)
        except BusError as e:  # nothing acknowledged for sure: the sender keeps the batch and retries
            raise HTTPException(503, f"telemetry bus: {e}; retry later") from None
    result = _counted(ingestor.kind, IngestResult(accepted=len(records), rejected=bad), metrics)
    return JSONResponse(result.model_dump(), status_code=422 if not records and bad else 202)


INGESTORS = [Ingestor(kind, model) for kind, model in INGEST_KINDS.items()]
for _ingestor in INGESTORS:
    _kind, _model = _ingestor.kind, _ingestor.model
    router.add_api_route(
        f"/{_kind}", _route(_ingestor), methods=["POST"], response_model=IngestResult,
        summary=f"Ingest a batch of {_model.__name__} records",
        description=(f"Body: `{{\"items\": [{_model.__name__}, ...]}}`, optionally gzip-encoded. Items that fail "
                     "validation are returned in `rejected` with reasons; the others are stored. 422 when none "
                     "is stored. A host-bound token's items about another host are rejected likewise. In a cluster "
                     "(cluster.bus) the kept items go on the telemetry bus and the answer is 202 once it "
                     "acknowledged them (docs/cluster.md)."),
        responses={202: {"model": IngestResult, "description": "cluster: the kept items are on the bus"},
                   422: {"model": IngestResult, "description": "no item of the batch was valid"},
                   400: {"model": ErrorDetail, "description": "body is not gzip, JSON, or {\"items\": [...]}"},
                   413: {"model": ErrorDetail, "description": "body or batch too large"},
                   415: {"model": ErrorDetail, "description": "unsupported Content-Encoding"},
                   503: {"model": ErrorDetail, "description": "telemetry store or bus unavailable; retry later"}},
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{_ingestor.envelope.__name__}"}}}}},
    )
