"""/ui: the live fabric view (docs/liveview.md), its login and its browser session.

The page and its ES modules are package data (nms/app/web/): no build step, nothing from a CDN.
The login form posts a token once (`POST /ui/session`, JSON); a token with `read` gets an HttpOnly,
SameSite=Strict cookie (Secure over TLS) holding a random session id that the server maps to the
token's identity (nms.app.auth.SessionStore). The cookie is accepted only by the routes that ask
for it with `require_ui`: the view's page, `GET /ui/session`, `/fabric/stream` and
`/incidents/stream`. The only cookie routes that change state, login and logout, check Origin.
Every /ui response carries a strict Content-Security-Policy: no inline script or style anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from nms.app.auth import AUTH_RESPONSES, SESSION_COOKIE, ErrorDetail, Principal, require_ui

WEB = Path(__file__).resolve().parent.parent / "web"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
ASSETS = {p.name: p for p in WEB.iterdir() if p.suffix in CONTENT_TYPES and p.suffix != ".html"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
UI_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
              (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]

router = APIRouter(prefix="/ui", tags=["ui"])


class UiHeaders:
    """Security headers on every /ui response (pages, assets, errors, redirects)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"] == "/ui" or scope["path"].startswith("/ui/")):
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [h for h in UI_HEADERS if h[0] not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class SessionInfo(BaseModel):
    name: str
    scopes: list[str]
    expires_in_s: float | None = None


def _page(name: str) -> FileResponse:
    return FileResponse(WEB / name, media_type=CONTENT_TYPES[".html"], headers={"Cache-Control": "no-store"})


def _check_origin(request: Request) -> None:
    """CSRF: a state-changing cookie route answers only its own origin (browsers send Origin on
    every POST and DELETE; a cross-site page cannot forge it)."""
    origin, host = request.headers.get("origin"), request.headers.get("host")
    if not origin or not host or origin != f"{request.url.scheme}://{host}":
        request.app.state.metrics.auth_failures.labels("origin").inc()
        raise HTTPException(403, "Origin missing or not this site")


@router.get("", include_in_schema=False)
def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/", include_in_schema=False)
def fabric_page(request: Request) -> Response:
    """The view for a logged-in session; anyone else is sent to the login form."""
    session_id = request.cookies.get(SESSION_COOKIE)
    principal = request.app.state.sessions.lookup(session_id) if session_id else None
    if principal is None or not principal.allows("read"):
        return RedirectResponse("/ui/login", status_code=303, headers={"Cache-Control": "no-store"})
    return _page("fabric.html")


@router.get("/login", include_in_schema=False)
def login_page() -> FileResponse:
    return _page("login.html")


@router.get("/static/{name}", include_in_schema=False)
def asset(name: str) -> FileResponse:
    path = ASSETS.get(name)
    if path is None:
        raise HTTPException(404, "no such asset")
    return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


@router.post("/session", response_model=SessionInfo, summary="Log in the live view: a read token -> a session cookie",
             responses={400: {"model": ErrorDetail, "description": "body is not JSON {\"token\": \"...\"}"},
                        401: {"model": ErrorDetail, "description": "invalid token"},
                        403: {"model": ErrorDetail,
                              "description": "token lacks scope read, or Origin is not this site"}},
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                 "type": "object", "required": ["token"], "additionalProperties": False,
                 "properties": {"token": {"type": "string", "minLength": 1, "maxLength": 4096}}}}}}})
async def login(request: Request) -> JSONResponse:
    _check_origin(request)
    metrics = request.app.state.metrics
    try:  # read by hand: a validation error must not echo the token back
        body = json.loads(await request.body())
        token = body["token"] if isinstance(body, dict) and set(body) == {"token"} else None
    except (ValueError, KeyError):
        token = None
    if not isinstance(token, str) or not 0 < len(token) <= 4096:
        raise HTTPException(400, 'body must be JSON {"token": "..."}')
    principal = request.app.state.tokens.lookup(token)
    if principal is None:
        metrics.auth_failures.labels("invalid").inc()
        raise HTTPException(401, "invalid token")
    if not principal.allows("read"):
        metrics.auth_failures.labels("scope").inc()
        raise HTTPException(403, f"token {principal.name!r} lacks scope 'read'")
    sessions = request.app.state.sessions
    response = JSONResponse(_info(principal, sessions.ttl_s).model_dump(), headers={"Cache-Control": "no-store"})
    old = request.cookies.get(SESSION_COOKIE)
    if old:
        sessions.delete(old)  # a new login replaces the session this browser had
    response.set_cookie(SESSION_COOKIE, sessions.create(principal), max_age=int(sessions.ttl_s), path="/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.get("/session", response_model=SessionInfo, responses=AUTH_RESPONSES,
            summary="Who this session (or bearer token) is")
def whoami(who: Principal = Depends(require_ui("read"))) -> SessionInfo:
    return _info(who, None)


@router.delete("/session", status_code=204, summary="Log out: the session is deleted and its cookie cleared",
               responses={403: {"model": ErrorDetail, "description": "Origin is not this site"}})
def logout(request: Request) -> Response:
    _check_origin(request)
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        request.app.state.sessions.delete(session_id)
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response


def _info(principal: Principal, ttl_s: float | None) -> SessionInfo:
    return SessionInfo(name=principal.name, scopes=sorted(principal.scopes), expires_in_s=ttl_s)
