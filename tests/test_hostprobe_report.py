"""The agent's report buffer with no service listening: batches go to the bounded on-disk spool, the
oldest are dropped when it is full, and what is left survives a restart of the reporter. With several
service URLs, a timeout and a 503 move the reports to the next (real HTTP servers on loopback)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import SecretStr

from hostprobe.client import ServiceClient
from hostprobe.config import ServiceSettings
from hostprobe.report import Reporter
from nms.app.local_daemons import free_port


def _reporter(tmp_path, max_bytes: int, stats) -> Reporter:
    settings = ServiceSettings(url=f"http://127.0.0.1:{free_port()}", token=SecretStr("t" * 20), timeout=1.0)
    return Reporter(ServiceClient(settings, "h1"), tmp_path, max_bytes, 1.0, stats)


def _window(i: int) -> dict:
    return {"src_host": "h1", "src_nic": "eth0", "dst_host": "h2", "dst_nic": "eth0", "path_id": f"p{i}",
            "window_start": 1_800_000_000 * 10**9 + i * 10**9, "sent": 10, "received": 10}


def test_unreachable_service_spools_then_drops_oldest_and_keeps_the_rest(tmp_path):
    stats = defaultdict(int)
    rep = _reporter(tmp_path, 4096, stats)
    for batch in range(30):
        for i in range(20):
            rep.put("probe_windows", _window(batch * 100 + i))
        rep.flush()
    assert stats["records_delivered"] == 0 and stats["batches_buffered"] == 30
    assert 0 < rep.buffered_bytes <= 4096
    assert stats["records_dropped"] > 0 and stats["records_dropped"] % 20 == 0  # whole batches, oldest first
    kept = len(rep.spool)
    newest = rep.spool.head(1000, 1 << 30)[-1].read()
    rep.stop()
    kind, _, body = newest.partition(b"\n")
    items = json.loads(gzip.decompress(body))["items"]
    assert kind == b"probe_windows" and items[-1]["path_id"] == "p2919"  # the last batch is kept
    again = _reporter(tmp_path, 4096, defaultdict(int))
    try:
        assert len(again.spool) == kept  # picked up after a restart
    finally:
        again.stop()


class _Service(ThreadingHTTPServer):
    """A loopback HTTP service answering every POST with `status` and recording the paths."""

    def __init__(self, status: int):
        self.status, self.paths = status, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.paths.append(self.path)
                body = b'{"accepted": 1, "rejected": []}' if outer.status == 202 else b'{"detail": "bus down"}'
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_a_503_and_a_timeout_move_the_reports_to_the_next_url_round_robin(tmp_path, caplog):
    degraded, good = _Service(503), _Service(202)
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers: a timeout
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    urls = [f"http://127.0.0.1:{silent.getsockname()[1]}", degraded.url, good.url]
    settings = ServiceSettings(urls=urls, token=SecretStr("t" * 20), timeout=0.3)
    stats: defaultdict[str, int] = defaultdict(int)
    client = ServiceClient(settings, "h1")
    rep = Reporter(client, tmp_path, 1 << 20, 1.0, stats)
    try:
        for turn in range(3):  # the silent one times out, the degraded one answers 503: both batches wait
            rep.put("probe_windows", _window(turn))
            rep.flush()
        assert degraded.paths == ["/ingest/probe_windows"] and client.url == good.url and client.switches == 2
        assert good.paths == ["/ingest/probe_windows"] * 3  # the two spooled ones in order, then the third
        assert stats["records_delivered"] == 3 and stats["batches_buffered"] == 2 and len(rep.spool) == 0
        assert stats["records_dropped"] == 0
        switched = [r.getMessage() for r in caplog.records if "switching to" in r.getMessage()]
        assert switched == [f"service at {urls[0]} failed (ReadTimeout): switching to {urls[1]}"]  # once per episode
        assert any(f"service at {good.url} answers: using it (2 switches so far)" in r.getMessage()
                   for r in caplog.records)
    finally:
        rep.stop()
        degraded.shutdown()
        good.shutdown()
        silent.close()
