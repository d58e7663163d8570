"""An agent with two service URLs (`service.urls`: two API workers) fails over with nothing lost:
real `nms serve` and `nms-agent` processes on loopback (the beds of test_hostprobe_agent.py). The
first service is killed with SIGKILL while the second is not up yet; the agents cycle between the
two URLs (logging the switch once), keep their windows in the spool, and once the second answers
they register there, announce their paths and deliver every window, the one in progress at the
kill included. The two services do not share a store: what each received is asserted on its own."""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers import wait_until
from tests.test_hostprobe_agent import Bed

AGENTS = ("h1", "h2")


@pytest.fixture
def beds(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Bed(tmp_path / "a"), Bed(tmp_path / "b")
    yield a, b
    a.close()
    b.close()


def test_agents_fail_over_to_the_next_service_url_and_lose_nothing(beds):
    a, b = beds
    a.serve()
    started = time.time_ns()
    for host in AGENTS:
        a.start_agent(host, urls=[a.url, b.url])  # b's port: nothing listens there yet

    def logs() -> str:
        return "\n".join((a.tmp / f"{h}.log").read_text()[-2000:] for h in AGENTS)

    wait_until(lambda: a.rows("probe_window", started, src_host="h2", dst_host="h1"), 20,
               what="h2's windows on the first service", why=logs)
    assert wait_until(lambda: all(a.status(h)["service"] == {"url": a.url, "urls": [a.url, b.url], "switches": 0}
                                  for h in AGENTS), 10, ignore=(OSError, ValueError))

    a.service.send_signal(signal.SIGKILL)
    a.service.wait(10)
    killed = time.time_ns()
    # none answers: every retry moves on to the next URL (round-robin), the switch is logged once
    wait_until(lambda: all(a.status(h)["stats"].get("service_switches", 0) >= 3 for h in AGENTS), 20,
               what="the agents cycling between the two dead URLs", why=logs, ignore=(OSError, ValueError))

    b.serve()
    wait_until(lambda: {x["host"] for x in b.api("GET", "/agents").json()} >= set(AGENTS), 20,
               what="the agents registered with the second service", why=logs)
    wait_until(lambda: all(a.status(h)["service"]["url"] == b.url
                           and a.status(h)["stats"].get("batches_replayed", 0) > 0 for h in AGENTS), 20,
               what="the spooled batches delivered to the second service", why=logs, ignore=(OSError, ValueError))
    arrived = time.time_ns()
    wait_until(lambda: max((w["time"] for w in b.rows("probe_window", started, src_host="h1", dst_host="h2")),
                           default=0) > arrived, 10, what="h1's windows after the failover")

    for src, dst in (("h1", "h2"), ("h2", "h1")):
        starts = sorted(w["time"] for w in b.rows("probe_window", started, src_host=src, dst_host=dst))
        # the window that was open when the first service died, and every one after it: no gap
        assert starts[0] <= killed and starts == list(range(starts[0], starts[-1] + 1, 10**9)), (src, starts)
        assert starts[-1] > arrived
    assert {p["dst_host"] for p in b.rows("probe_path", started, src_host="h1")} >= {"h2"}  # paths announced again
    for host in AGENTS:
        status = a.status(host)
        assert status["service"]["url"] == b.url and status["service"]["switches"] >= 3
        assert status["stats"].get("records_dropped", 0) == 0 and status["stats"]["batches_buffered"] > 0
        log = (a.tmp / f"{host}.log").read_text()
        assert log.count(f"service at {a.url} failed") == 1, log  # once, not per retry
        assert log.count("switching to") == 1 and log.count(f"service at {b.url} answers: using it") == 1, log
        assert "Traceback" not in log
