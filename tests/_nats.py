"""A real nats-server with JetStream (Debian's nats-server 2.9.x) for tests, plus a pytest fixture.

`NatsServer` (nms/app/local_daemons.py, also `nms cluster`'s) runs on a free loopback port with its
JetStream store in its own temporary directory.
"""

from __future__ import annotations

import pytest

from nms.app.local_daemons import NatsServer, which

__all__ = ["NatsServer", "have_nats_server"]
SKIP_REASON = "nats-server not installed: apt-get install nats-server (CI installs it: scripts/test.sh)"


def have_nats_server() -> bool:
    return which("nats-server") is not None


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
