"""The UFM collector's replay transport: httpx's transport under the UfmClient, answering from a
recording of the server's HTTP answers.

responses.json: `"METHOD /path?sorted=query"` -> {"status": 200, "date": its Date header, "json": BODY}
("text": BODY for an answer that is not JSON, and for an error's body; "request": the JSON body a
POST sent, kept for the reader). The replay swaps the transport of the client's httpx session
(httpx.MockTransport), so UfmClient's own authentication headers, retries, status handling, paging
and JSON decoding, and the collector's parsing, run on what UFM answered, at the time UFM answered
it (the latest `Date` header recorded: which events fall in the flap window depends on it). A
request not recorded gets 404 with a body saying so (as UFM answers a route it does not have): the
collector notes it, or fails the poll for a required route.

`RecordingTransport` wraps httpx's real transport and writes this file (tests/collector_cases/record.py).
"""

from __future__ import annotations

import json
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch
from urllib.parse import urlencode

import httpx

from collectors.base import PollResult
from collectors.ufm import collector as ufm_collector
from collectors.ufm.collector import UfmCollector
from nms.config.models import SwitchConfig

NOT_RECORDED = "not in this recording"


def key(request: httpx.Request) -> str:
    query = urlencode(sorted(request.url.params.multi_items()))
    return f"{request.method} {request.url.path}" + (f"?{query}" if query else "")


def answer(recorded: dict[str, Any]) -> httpx.Response:
    if "json" in recorded:
        return httpx.Response(recorded["status"], json=recorded["json"])
    return httpx.Response(recorded["status"], text=recorded.get("text", ""))


def replay_transport(recording: dict[str, dict]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        recorded = recording.get(key(request))
        if recorded is None:
            return httpx.Response(404, text=f"{key(request)}: {NOT_RECORDED}")
        return answer(recorded)

    return httpx.MockTransport(handle)


class RecordingTransport(httpx.AsyncBaseTransport):
    """The real transport's answers, recorded in `recording` by request."""

    def __init__(self, real: httpx.AsyncBaseTransport):
        self.real, self.recording = real, {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.real.handle_async_request(request)
        body = await response.aread()
        entry: dict[str, Any] = {"status": response.status_code, "date": response.headers.get("date")}
        try:  # an error's body as it came (the collector quotes it)
            entry["json" if response.is_success else "text"] = json.loads(body) if response.is_success else \
                body.decode("utf-8", "replace")
        except ValueError:
            entry["text"] = body.decode("utf-8", "replace")
        if request.method in ("POST", "PUT") and request.content:
            entry["request"] = json.loads(request.content)
        self.recording[key(request)] = entry
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.real.aclose()


def recorded_at_ns(recording: dict[str, dict]) -> int:
    """When the recording was made: the latest `Date` header of its answers (to the second), plus 1 s."""
    dates = [parsedate_to_datetime(entry["date"]) for entry in recording.values() if entry.get("date")]
    assert dates, "the recording has no Date header: record it again with tests/collector_cases/record.py"
    return int(max(dates).timestamp() + 1) * 10**9


async def replay_ufm(device: SwitchConfig, responses: Path) -> PollResult:
    recording = json.loads(responses.read_text())
    collector = UfmCollector()
    client = await collector._client(device)
    client._http._transport = replay_transport(recording)
    client._http._mounts = {}  # no proxy from the environment in between
    # the poll runs at the recording's time: events and alarms carry the server's time, and which fall in
    # the flap window depends on it
    at = recorded_at_ns(recording)
    try:
        with patch.object(ufm_collector, "time", SimpleNamespace(time_ns=lambda: at)):
            return await collector.collect(device)
    finally:
        await collector.close()
