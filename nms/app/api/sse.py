"""Server-Sent Events plumbing shared by the live streams (/incidents/stream, /fabric/stream)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

KEEPALIVE_S = 15.0  # a comment line this often keeps proxies and clients from timing out an idle stream
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


def sse(event: str, data: str, event_id: int | None = None) -> str:
    return f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "") + f"data: {data}\n\n"


async def should_end(request: Request, running: Callable[[], bool]) -> bool:
    """A stream follows the service: it ends when the client goes, the server is stopping, or the
    service is not running (`running()` false: nothing live can come then; deps.RunningDep)."""
    server = getattr(request.app.state, "server", None)  # set by `nms serve`
    return bool(getattr(server, "should_exit", False)) or not running() or await request.is_disconnected()
