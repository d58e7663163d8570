"""A daemon a test starts in its own temporary directory and session: start until ready, stop with
SIGTERM (SIGKILL after a grace), remove, read its log. The base of the influxd and nats-server
helpers."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class LocalDaemon:
    name = "daemon"  # what the errors call it; the log is `<name>.log` in `dir`
    stop_signal = signal.SIGTERM  # the daemon's own "shut down now"
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    def spawn(self, argv: list[str], ready: Callable[[int], bool], timeout: float, what: str) -> None:
        """Run argv, logging to log_path (appended: a restart keeps the earlier log), until
        ready(offset of this start in the log) holds; `what` says what was awaited if it never does."""
        assert self.proc is None, "already running"
        log = open(self.log_path, "ab")
        seen = log.tell()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"{self.name} exited at start; log:\n{self.log_tail()}")
            if ready(seen):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} {what} within {timeout}s; log:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(self.stop_signal)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""
