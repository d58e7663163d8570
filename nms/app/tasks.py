"""Ending asyncio tasks for sure at shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable


async def end_tasks(tasks: Iterable[asyncio.Task], grace_s: float) -> bool:
    """Cancel the tasks until they ended (True), or `grace_s` passed (False). Cancelling once is not
    enough on Python < 3.12: asyncio.wait_for, which nats-py's requests use, returns the reply and drops
    a cancel that arrives in the same loop iteration as that reply (CPython issue 86296, fixed in 3.12),
    and the task then runs on while its stopper waits for it forever."""
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=min(0.1, grace_s))
        for task in done:  # what a cancelled task raised on its way out is not news at shutdown
            if not task.cancelled():
                task.exception()
    return not pending
