"""A real influxd (Debian's influxdb 1.6.x) for tests, plus pytest fixtures.

`InfluxServer` runs influxd on free loopback ports with everything (config, meta, data, WAL,
log) in its own temporary directory; restart() keeps the port and the data.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest
from _daemon import LocalDaemon

INFLUXD = Path("/usr/bin/influxd")
SKIP_REASON = "influxd not installed: apt-get install influxdb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InfluxServer(LocalDaemon):
    name = "influxd"

    def __init__(self, auth: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nms-influxd-"))
        self.port = free_port()
        self.rpc_port = free_port()
        self.auth = auth
        self.proc: subprocess.Popen | None = None
        self.config = self.dir / "influxdb.conf"
        self.config.write_text(self._config_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config_text(self) -> str:
        d = self.dir
        return f"""\
reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"

[meta]
  dir = "{d}/meta"
  logging-enabled = false

[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
  query-log-enabled = false
  trace-logging-enabled = false

[monitor]
  store-enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{self.port}"
  auth-enabled = {"true" if self.auth else "false"}
  log-enabled = false

[logging]
  level = "warn"

[continuous_queries]
  enabled = false
"""

    def start(self, timeout: float = 30.0) -> None:
        def answers(_: int) -> bool:
            try:
                return httpx.get(f"{self.url}/ping", timeout=1.0).status_code == 204
            except httpx.HTTPError:
                return False
        self.spawn([str(INFLUXD), "-config", str(self.config)], answers, timeout, "did not answer /ping")

    def restart(self) -> None:
        self.stop()
        self.start()

    def query(self, q: str, db: str | None = None, auth: tuple[str, str] | None = None,
              method: str = "POST") -> dict:
        """Run InfluxQL directly (bypassing the store), for setup and independent checks."""
        params = {"q": q, "epoch": "ns"}
        if db:
            params["db"] = db
        r = httpx.request(method, f"{self.url}/query", params=params, auth=auth, timeout=10.0)
        return r.json()


def _have_influxd() -> bool:
    return INFLUXD.exists() and os.access(INFLUXD, os.X_OK)


@pytest.fixture(scope="session")
def influxd():
    if not _have_influxd():
        pytest.skip(SKIP_REASON)
    server = InfluxServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def influx_store(influxd, tmp_path):
    from nms.config.models import InfluxStoreConfig
    from nms.store.influx import InfluxStore

    cfg = InfluxStoreConfig(url=influxd.url, database=f"t_{uuid.uuid4().hex[:12]}",
                            flush_interval=0.05, timeout=1.0)
    store = InfluxStore(cfg, tmp_path)
    try:
        yield store
    finally:
        store.close()
