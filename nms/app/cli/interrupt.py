"""SIGTERM and SIGHUP handled like Ctrl-C, for commands that must tear down what they started.

A supervisor stops a process with SIGTERM and a closed terminal sends SIGHUP; by default either
kills Python at once, skipping every `finally` and `except KeyboardInterrupt`. Inside
`signals_as_ctrl_c()` they raise KeyboardInterrupt in the main thread instead, so the teardown that
Ctrl-C runs runs for them too.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_as_ctrl_c(signals: tuple[signal.Signals, ...] = SIGNALS) -> Iterator[None]:
    """The first of `signals` raises KeyboardInterrupt; later ones are ignored while the teardown runs
    (a second Ctrl-C still interrupts it, SIGKILL still kills). The previous handlers come back on
    leaving. Outside the main thread (where Python cannot set handlers) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, signal.SIG_DFL if old is None else old)
