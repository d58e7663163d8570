"""A real nats-server with JetStream (Debian's nats-server 2.9.x) for tests, plus a pytest fixture.

`NatsServer` runs on a free loopback port with its JetStream store in its own temporary
directory; restart() keeps the port and the streams.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from _influx import free_port

NATS_SERVER = shutil.which("nats-server") or "/usr/bin/nats-server"
SKIP_REASON = "nats-server not installed: apt-get install nats-server (CI installs it: scripts/test.sh)"


def have_nats_server() -> bool:
    return Path(NATS_SERVER).exists()


class NatsServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nms-nats-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None, "already running"
        log = open(self.dir / "nats.log", "ab")
        seen = log.tell()  # a restart appends: only what this start logs counts
        self.proc = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir / "js"),
             "-n", f"nms-test-{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"nats-server exited at start; log:\n{self.log_tail()}")
            if "Server is ready" in self._log_since(seen):
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server not ready within {timeout}s; log:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _log_since(self, offset: int) -> str:
        with open(self.dir / "nats.log", "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return (self.dir / "nats.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture
def nats_server():
    """A fresh nats-server with JetStream per test (streams and consumers start empty)."""
    if not have_nats_server():
        pytest.skip(SKIP_REASON)
    server = NatsServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
