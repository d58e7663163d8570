"""A small HTTP client of the service API for CLI commands."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import typer
from rich.console import Console

err_console = Console(stderr=True, soft_wrap=True)
UrlOpt: str = typer.Option("http://127.0.0.1:8080", "--url", envvar="NMS_URL", help="service URL")
TokenOpt: str | None = typer.Option(None, "--token", envvar="NMS_TOKEN", help="API token (or env NMS_TOKEN)")


def fmt_time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")


class ApiClient:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0, verify: bool | str = True):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, verify=verify)
        self.url = url

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Do one request and return its JSON; on failure print a clear message and exit non-zero."""
        response = self._request(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def call_text(self, path: str) -> str:
        return self._request("GET", path).text

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            err_console.print(f"[red]error:[/] cannot reach the service at {self.url}: {e}")
            raise typer.Exit(2) from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            hint = {401: " (set --token or NMS_TOKEN)", 403: " (the token lacks the scope this needs)"}
            err_console.print(f"[red]error:[/] {method} {path}: HTTP {response.status_code}: {detail}"
                              f"{hint.get(response.status_code, '')}")
            raise typer.Exit(1)
        return response
