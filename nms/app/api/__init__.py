"""The REST API (FastAPI; OpenAPI at /docs and /openapi.json)."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nms import __version__
from nms.app.api import ingest, jobs, system, telemetry
from nms.app.auth import TokenRegistry
from nms.app.service import Service
from nms.store import StoreError, StoreUnavailable


class BodyLimit:
    """Reject request bodies larger than `limit` bytes with 413, whether or not Content-Length is
    given (chunked bodies are counted as they stream)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await self._too_large(send)
        seen = 0
        too_large = False

        async def limited_receive():
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    too_large = True
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.limit} bytes"}, status_code=413)
        await response({"type": "http"}, _empty_receive, send)


class _BodyTooLarge(Exception):
    pass


async def _empty_receive():
    return {"type": "http.request", "body": b"", "more_body": False}


def _add_ingest_schemas(app: FastAPI) -> None:
    """Ingest routes read their raw body (to keep good items of a partly bad batch), so FastAPI does
    not see their body models: add those schemas to the generated OpenAPI document."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for ingestor in ingest.INGESTORS:
                model_schema = ingestor.envelope.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[ingestor.envelope.__name__] = model_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def create_app(service: Service, manage_lifecycle: bool = True) -> FastAPI:
    """Build the API around a service. With manage_lifecycle, app startup/shutdown start and stop
    the service (scheduler, store flush)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    app = FastAPI(
        title="fabric-nms",
        version=__version__,
        description="Fabric telemetry ingest and query, jobs, and (later) topology and incidents. "
                    "Authenticate with `Authorization: Bearer <token>`; scopes: read, ingest, act, admin.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.tokens = TokenRegistry(service.config.api.tokens)
    app.state.metrics = service.metrics

    @app.middleware("http")
    async def record_metrics(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service.metrics.requests.labels(request.method, path, str(response.status_code)).inc()
        service.metrics.latency.labels(path).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable):
        return JSONResponse({"detail": f"telemetry store unavailable: {exc}"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError):
        return JSONResponse({"detail": f"telemetry store error: {exc}"}, status_code=502)

    for module in (system, ingest, telemetry, jobs):
        app.include_router(module.router)
    _add_ingest_schemas(app)
    app.add_middleware(BodyLimit, limit=service.config.api.max_body_bytes)
    return app
