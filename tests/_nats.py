"""A real nats-server with JetStream (Debian's nats-server 2.9.x) for tests, plus a pytest fixture.

`NatsServer` runs on a free loopback port with its JetStream store in its own temporary
directory; restart() keeps the port and the streams.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from _daemon import LocalDaemon
from _influx import free_port

NATS_SERVER = shutil.which("nats-server") or "/usr/bin/nats-server"
SKIP_REASON = "nats-server not installed: apt-get install nats-server (CI installs it: scripts/test.sh)"


def have_nats_server() -> bool:
    return Path(NATS_SERVER).exists()


class NatsServer(LocalDaemon):
    name = "nats"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nms-nats-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        def ready(seen: int) -> bool:  # a restart appends to the log: only what this start logs counts
            if "Server is ready" not in self.log_since(seen):
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return True
            except OSError:
                return False
        self.spawn([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir / "js"),
                    "-n", f"nms-test-{self.port}"], ready, timeout, "not ready")


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
