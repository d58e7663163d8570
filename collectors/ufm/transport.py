"""HTTP for the UFM collector: authentication, timeouts, retries with backoff, paging, and clear
CollectorError kinds (docs/ufm.md).

UFM Enterprise REST API Guide v6.22.1, "REST API Complementary Information": basic authentication
uses the `/ufmRest` prefix with the username and password; token authentication uses `/ufmRestV3`
with the header `Authorization: Basic <token>` (the access token as is, not base64 of anything).
Client-certificate authentication ("Client Authentication REST API": UFM maps the certificate's SAN
to a user) presents `cert_file`/`key_file` in the TLS handshake and uses `/ufmRest` with no
Authorization header, as NVIDIA's own client does (NVIDIA/bare-metal-manager-core,
crates/api/src/ib/ufmclient/{mod,rest}.rs).

UFM Telemetry's endpoint (`telemetry_url`, plain text) is read through a second session that
carries no UFM credential.

A request that times out, cannot connect, or gets 429 / 5xx is tried again (`retries` times, after
backoff, backoff x 2, ...); 401 and 403 are auth errors at once; other answers are bad responses
naming the route. Messages name the device, the base URL and the route, never a credential.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl
from typing import Any

import httpx

from collectors.base import (
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorTimeout,
    CollectorUnreachable,
)
from collectors.ufm.settings import UfmSettings

log = logging.getLogger(__name__)

RETRY_STATUS = {429, 500, 502, 503, 504}
MAX_BACKOFF_S = 10.0
MAX_PAGES = 10_000


def base_url(address: str, settings: UfmSettings) -> str:
    """`settings.url`, else https://<management address> (IPv6 in brackets)."""
    if settings.url:
        return settings.url
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"https://{host}"


class UfmClient:
    """One UFM server's HTTP session (connection reuse across polls)."""

    def __init__(self, device: str, address: str, settings: UfmSettings):
        self.device, self.settings = device, settings
        self.base = base_url(address, settings)
        self.prefix = "/ufmRestV3" if settings.token is not None else "/ufmRest"
        headers = {"Accept": "application/json"}
        auth = None
        if settings.token is not None:
            headers["Authorization"] = f"Basic {settings.token.get_secret_value()}"
        elif settings.password is not None:
            auth = httpx.BasicAuth(settings.username or "", settings.password.get_secret_value())
        verify = _tls(device, settings)
        self._http = httpx.AsyncClient(base_url=self.base, headers=headers, auth=auth, verify=verify,
                                       timeout=settings.timeout, follow_redirects=False)
        self._plain: httpx.AsyncClient | None = None  # UFM Telemetry: no UFM credential
        self.requests = 0  # answered requests (for PollResult.values)

    async def close(self) -> None:
        await self._http.aclose()
        if self._plain is not None:
            await self._plain.aclose()

    async def scrape(self, url: str) -> str:
        """GET a text endpoint outside the REST API (UFM Telemetry), with the same retries and errors."""
        if self._plain is None:
            self._plain = httpx.AsyncClient(timeout=self.settings.timeout, follow_redirects=False,
                                            verify=_tls(self.device, self.settings, client_cert=False))
        return await self._request("GET", url, http=self._plain, text=True)

    def route(self, path: str) -> str:
        return f"{self.prefix}{path}"

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return await self._request("GET", path, params=params)

    async def post(self, path: str, body: Any) -> Any:
        return await self._request("POST", path, body=body)

    async def put(self, path: str, body: Any) -> Any:
        return await self._request("PUT", path, body=body)

    async def get_list(self, path: str, params: dict[str, Any] | None = None, paged: bool = False) -> list[Any]:
        """A collection. `paged` (and settings.page_size > 0): asked page by page with `page_number`
        (from 1) and `rpp`; a page answer is {"data": [...]}, and a short page is the last. A plain
        list answer (a server that does not page) is the whole collection."""
        size = self.settings.page_size if paged else 0
        if not size:
            answer = await self.get(path, params)
            if isinstance(answer, list):
                return answer
            raise self._bad(f"GET {self.route(path)}", f"expected a JSON list, got {_kind(answer)}")
        items: list[Any] = []
        for number in range(1, MAX_PAGES + 1):
            answer = await self.get(path, {**(params or {}), "page_number": number, "rpp": size})
            if isinstance(answer, list):  # not paged after all: this is everything
                return answer
            if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
                raise self._bad(f"GET {self.route(path)}", "a page is not an object with a \"data\" list "
                                                           f"(got {_kind(answer)})")
            items += answer["data"]
            if len(answer["data"]) < size:
                return items
        raise self._bad(f"GET {self.route(path)}", f"more than {MAX_PAGES} pages of {size}")

    async def _request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
                       http: httpx.AsyncClient | None = None, text: bool = False) -> Any:
        target = path if http is not None else self.route(path)
        what = f"{method} {target}"
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = await (http or self._http).request(method, target, params=params,
                                                              json=body if method in ("POST", "PUT") else None)
            except httpx.TimeoutException:
                if last:
                    raise CollectorTimeout(self.device, f"{self.base}: {what} timed out after "
                                                        f"{self.settings.timeout:g} s ({attempts} attempts)") from None
            # refused, reset, DNS, TLS (certificate, handshake); with TLS 1.3 a server that refuses the
            # client certificate says so after the handshake, as an ssl.SSLError httpx passes through
            except (httpx.TransportError, ssl.SSLError) as e:
                if last:
                    raise CollectorUnreachable(self.device, f"{self.base}: {what}: {_reason(e)} "
                                                            f"({attempts} attempts)") from None
            else:
                status = response.status_code
                if status in (401, 403):
                    kind = ("token" if self.settings.token is not None else "username/password"
                            if self.settings.password is not None else "client certificate")
                    raise CollectorAuthError(self.device, f"{self.base}: {what}: HTTP {status}: UFM refused the "
                                                          f"{kind}")
                if status not in RETRY_STATUS or last:
                    self.requests += 1
                    if text and 200 <= status < 300:
                        return response.text
                    return self._decode(what, response)
                log.debug("%s: %s: HTTP %d, trying again", self.device, what, status)
            await asyncio.sleep(min(self.settings.backoff * 2 ** attempt, MAX_BACKOFF_S))
        raise AssertionError("unreachable")  # pragma: no cover

    def _decode(self, what: str, response: httpx.Response) -> Any:
        if not 200 <= response.status_code < 300:
            raise self._bad(what, f"HTTP {response.status_code}{_snippet(response.text)}")
        if what.startswith("PUT ") and not response.content:
            return None  # UFM answers some PUTs with 200 and no body
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise self._bad(what, f"not JSON ({e.__class__.__name__}: {e}){_snippet(response.text)}") from None

    def _bad(self, what: str, problem: str) -> CollectorBadResponse:
        return CollectorBadResponse(self.device, f"{self.base}: {what}: {problem}")


def _tls(device: str, settings: UfmSettings, client_cert: bool = True) -> Any:
    """httpx `verify`: False, True (the system's CAs), or a context with `ca_file` and the client
    certificate. Errors name the file, never its content."""
    if not settings.verify_tls and not (client_cert and settings.cert_file):
        return False
    what = "ca_file"
    try:
        if settings.verify_tls:
            context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
        else:  # the client certificate is still presented
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if client_cert and settings.cert_file is not None and settings.key_file is not None:
            what = "cert_file/key_file"
            context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    except (OSError, ssl.SSLError) as e:
        files = settings.ca_file if what == "ca_file" else f"{settings.cert_file}, {settings.key_file}"
        raise CollectorConfigError(device, f"{what} {files}: {e.strerror or e}") from None
    return context if settings.ca_file or (client_cert and settings.cert_file) or not settings.verify_tls else True


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _snippet(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return f": {text[:limit]}{'...' if len(text) > limit else ''}" if text else ""


def _reason(error: httpx.TransportError | ssl.SSLError) -> str:
    text = str(error) or error.__class__.__name__
    return text[:300]
