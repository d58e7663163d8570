"""The REST API (FastAPI; OpenAPI at /docs and /openapi.json)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from nms import __version__
from nms.app.api import (
    actions,
    agents,
    audits,
    clock,
    fabric,
    incidents,
    ingest,
    jobs,
    notifications,
    system,
    telemetry,
    ui,
)
from nms.app.api.fabric_view import FabricViews
from nms.app.auth import SessionStore, TokenRegistry
from nms.app.service import Service
from nms.state import StateUnavailable
from nms.store import StoreError, StoreUnavailable


class BodyLimit:
    """Reject request bodies larger than `limit` bytes with 413, whether or not Content-Length is
    given: chunked bodies are counted as they stream, and the route reading past the limit gets an
    HTTPException(413), answered by FastAPI's normal exception handling."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                response = JSONResponse({"detail": self._message}, status_code=413)
                return await response(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, self._message)
            return message

        await self.app(scope, limited_receive, send)

    @property
    def _message(self) -> str:
        return f"request body larger than {self.limit} bytes"


class RequestMetrics:
    """Count requests and latency per route template (pure ASGI: streams bodies untouched)."""

    def __init__(self, app: ASGIApp, metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_and_record(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


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


def reject_unknown_query_params(request: Request) -> None:
    """422 for query parameters a route does not take: a typo such as ?activ_at= must not be
    silently ignored and return unfiltered data."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = {p.alias for p in _all_query_params(dependant)}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise HTTPException(422, [{"loc": ["query", name], "msg": "unknown query parameter", "type": "extra_forbidden"}
                                  for name in unknown])


def _all_query_params(dependant):
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _all_query_params(sub)


def _route_methods(routes) -> Iterator[tuple[str, set[str]]]:
    """(path template, methods) of every route, routers included with include_router flattened
    (FastAPI keeps those as lazily resolved `effective_route_contexts`)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            for context in contexts():
                yield context.path, set(getattr(context.original_route, "methods", None) or ())
        elif getattr(route, "methods", None):
            yield route.path, set(route.methods)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route of the app answers on `path` (the path without the root path)."""
    table = getattr(app.state, "route_methods", None)
    if table is None:  # built on the first 405: every route is in place by then
        table = app.state.route_methods = [(compile_path(template)[0], methods)
                                           for template, methods in _route_methods(app.router.routes)]
    methods: set[str] = set()
    for regex, route_methods in table:
        if regex.match(path):
            methods |= route_methods
    return sorted(methods)


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
        description="Fabric telemetry ingest and query, topology, jobs, incidents, actions, audits and agents. "
                    "Authenticate with `Authorization: Bearer <token>`; scopes: read, ingest, act, admin.",
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query_params)],
    )
    app.state.service = service
    app.state.tokens = TokenRegistry(service.config.api.tokens)
    app.state.sessions = SessionStore(service.config.api.session_ttl)  # the live view's logins (/ui)
    app.state.metrics = service.metrics
    app.state.agents = service.agents
    app.state.fabric_views = FabricViews(service.poller, service.state)  # shared by every /fabric/stream

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # Starlette's 405 names the methods of the first route matching the path only; a path served
        # by several routes (GET /jobs and POST /jobs) must list them all (RFC 9110 15.5.6)
        if exc.status_code == 405:
            path, root = request.scope["path"], request.scope.get("root_path", "")
            path = path[len(root):] if root and path.startswith(root) else path
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(app, path))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable):
        return JSONResponse({"detail": f"telemetry store unavailable: {exc}"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(StateUnavailable)
    async def state_unavailable(request: Request, exc: StateUnavailable):
        # PostgreSQL is down or unreachable (docs/cluster.md): the client retries, nothing of its call was stored
        return JSONResponse({"detail": f"state store unavailable: {exc.reason}; retry later"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError):
        return JSONResponse({"detail": f"telemetry store error: {exc}"}, status_code=502)

    for module in (system, ingest, telemetry, jobs, fabric, agents, clock, notifications, incidents, audits, actions,
                   ui):
        app.include_router(module.router)
    _add_ingest_schemas(app)
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    app.add_middleware(ui.UiHeaders)
    app.add_middleware(BodyLimit, limit=service.config.api.max_body_bytes)
    return app
