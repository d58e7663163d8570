"""Bearer-token authentication with scopes (read, ingest, act, admin; admin implies all).

A token may also be bound to one host (an agent's token); what that allows is in nms.app.binding.

Tokens are kept only as SHA-256 hashes: API tokens are long random strings, so a fast hash is
enough (no password-style stretching needed) and lookups stay O(1) per request.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from nms.config.models import TokenConfig

SCOPES = ("read", "ingest", "act", "admin")


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "nms_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]
    host: str | None = None  # a host-bound token (an agent's): see nms.app.binding

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


class TokenRegistry:
    def __init__(self, tokens: list[TokenConfig]):
        self._by_hash: dict[str, Principal] = {}
        for t in tokens:
            digest = t.hash if t.hash is not None else hash_token(t.token.get_secret_value())
            self._by_hash[digest] = Principal(t.name, frozenset(t.scopes), t.host)

    def __len__(self) -> int:
        return len(self._by_hash)

    def lookup(self, token: str) -> Principal | None:
        # A dict lookup by digest, not a scan: with a token per agent there may be thousands. Its
        # timing can tell at most something about a SHA-256 digest, which does not help find a token.
        return self._by_hash.get(hash_token(token))


class ErrorDetail(BaseModel):
    detail: str


# Documented on every route that needs a token.
AUTH_RESPONSES = {401: {"model": ErrorDetail, "description": "missing or invalid token"},
                  403: {"model": ErrorDetail, "description": "token lacks the required scope"}}
# The same for a route whose own answer is not JSON (an event stream): its errors are JSON all the same.
_JSON_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}}
STREAM_AUTH_RESPONSES = {status: {"description": answer["description"], "content": _JSON_ERROR}
                         for status, answer in AUTH_RESPONSES.items()}
BAD_BODY_RESPONSE = {400: {"model": ErrorDetail, "description": "body is not valid JSON"}}

_bearer = HTTPBearer(auto_error=False, description="API token (see `nms token create`)")


def require(scope: str):
    """FastAPI dependency: 401 without a valid token, 403 when the token lacks `scope`."""
    assert scope in SCOPES

    def check(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        registry: TokenRegistry = request.app.state.tokens
        metrics = request.app.state.metrics
        if creds is None or creds.scheme.lower() != "bearer":
            metrics.auth_failures.labels("missing").inc()
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        principal = registry.lookup(creds.credentials)
        if principal is None:
            metrics.auth_failures.labels("invalid").inc()
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
        if not principal.allows(scope):
            metrics.auth_failures.labels("scope").inc()
            raise HTTPException(403, f"token {principal.name!r} lacks scope {scope!r}")
        return principal

    return check


# --- browser sessions (the live fabric view, nms/app/api/ui.py) ---------------------------------
# EventSource cannot send an Authorization header and a token in a URL ends up in logs, so the
# page's login form posts the token once and gets a cookie holding a random session id. The
# cookie is accepted only where a route asks for it (`require_ui`): the UI's pages and the two
# read-only streams it follows, never ingest or act.

SESSION_COOKIE = "nms_session"


@dataclass
class _Session:
    principal: Principal
    expires: float  # time.monotonic()


class SessionStore:
    """Server-side sessions: the hash of a random id -> the token's identity and scopes, until
    `ttl_s` after login or logout. In memory: a restart logs everyone out. At most `limit` live
    sessions; the oldest goes first."""

    def __init__(self, ttl_s: float, limit: int = 10_000):
        self.ttl_s = ttl_s
        self.limit = limit
        self._by_hash: dict[str, _Session] = {}  # insertion order = login order

    def __len__(self) -> int:
        self._expire()
        return len(self._by_hash)

    def create(self, principal: Principal) -> str:
        self._expire()
        while len(self._by_hash) >= self.limit:
            self._by_hash.pop(next(iter(self._by_hash)))
        session_id = secrets.token_urlsafe(32)
        self._by_hash[hash_token(session_id)] = _Session(principal, time.monotonic() + self.ttl_s)
        return session_id

    def lookup(self, session_id: str) -> Principal | None:
        session = self._by_hash.get(hash_token(session_id))
        if session is None or session.expires <= time.monotonic():
            return None
        return session.principal

    def delete(self, session_id: str) -> bool:
        return self._by_hash.pop(hash_token(session_id), None) is not None

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._by_hash.items() if s.expires <= now]:
            del self._by_hash[key]


def require_ui(scope: str):
    """FastAPI dependency for the routes the browser view uses: a bearer token as `require`, or
    else a session cookie (401 without either, 403 when its token lacked `scope`)."""
    by_token = require(scope)

    def check(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        session_id = request.cookies.get(SESSION_COOKIE)
        if creds is not None or not session_id:
            return by_token(request, creds)
        principal = request.app.state.sessions.lookup(session_id)
        if principal is None:
            request.app.state.metrics.auth_failures.labels("session").inc()
            raise HTTPException(401, "no valid session; log in again", headers={"WWW-Authenticate": "Bearer"})
        if not principal.allows(scope):
            request.app.state.metrics.auth_failures.labels("scope").inc()
            raise HTTPException(403, f"token {principal.name!r} lacks scope {scope!r}")
        return principal

    return check
