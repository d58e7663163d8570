"""Plugin -> agent socket -> real `nms serve` -> store: a real `nms-agent` process (host-bound
token) receives what the C driver drives through the plugin, and every record is queryable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from nms.app.local_daemons import free_port
from tests.helpers import wait_until
from tests.nccl.harness import build_driver, run_driver

ADMIN = "nccl-test-admin-token-0123456789"
AGENT = "nccl-test-agent-token-0123456789"
MEASUREMENTS = {"nccl_collective": 2 * 40 * 2, "nccl_proxy_op": 2 * 40 * 2, "nccl_comm": 2}
STEPS = 2 * 40 * 4  # 2 ranks x 40 groups: a collective and a p2p each, an op per task, 2 steps per op


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nccl-agent")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp / "nms.yaml").write_text(yaml.safe_dump({
        "data_dir": str(tmp / "data"),
        "fabric": {"hosts": [{"name": h, "nics": [{"name": "lo", "address": a}]}
                             for h, a in (("h1", "127.0.0.2"), ("h2", "127.0.0.3"))]},
        "api": {"port": port, "tokens": [{"name": "admin", "scopes": ["admin"], "token": ADMIN},
                                         {"name": "agent-h1", "scopes": ["ingest"], "token": AGENT, "host": "h1"}]}}))
    (tmp / "h1.yaml").write_text(yaml.safe_dump({
        "host": "h1", "service": {"url": url, "token": AGENT}, "nics": [{"name": "lo", "address": "127.0.0.2"}],
        "probe": {"key": "nccl-test-probe-key-0123456789", "port": free_port(), "sports": 1},
        "report": {"buffer_dir": str(tmp / "h1"), "interval": "0.2s", "stats_interval": "0.5s"}}))
    procs = []
    try:
        for name, args in (("serve", ["-m", "nms", "serve", "--config", str(tmp / "nms.yaml")]),
                           ("agent", ["-m", "hostprobe.agent", "--config", str(tmp / "h1.yaml")])):
            procs.append(subprocess.Popen([sys.executable, *args], stdout=open(tmp / f"{name}.log", "ab"),
                                          stderr=subprocess.STDOUT))
            if name == "serve":
                _wait(lambda: httpx.get(f"{url}/health", timeout=0.5).status_code == 200, tmp / "serve.log")
        socket_path = tmp / "h1" / "nccl.sock"
        _wait(socket_path.exists, tmp / "agent.log")
        yield {"tmp": tmp, "url": url, "socket": socket_path, "agent": procs[1]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def _wait(check, log, timeout: float = 30.0):
    wait_until(check, timeout, 0.1, what="the agent and service", why=lambda: log.read_text()[-3000:],
               ignore=(OSError, httpx.HTTPError))


def _rows(url: str, measurement: str, start: int) -> list[dict]:
    r = httpx.post(f"{url}/telemetry/query", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30,
                   json={"measurement": measurement, "start": start, "end": time.time_ns() + 10**10,
                         "limit": 100_000, "tags": {"host": ["h1"]}})
    r.raise_for_status()
    return [{**s["tags"], **dict(zip(s["columns"], v))} for s in r.json()["series"] for v in s["values"]]


def test_plugin_records_reach_the_store_through_the_agent(bed, tmp_path):
    t0 = time.time_ns()
    out = run_driver(build_driver(tmp_path), 6, "run", 2, 40, NMS_NCCL_SOCKET=str(bed["socket"]),
                     SLURM_JOB_ID="job-9")
    assert int(out["sent"]) == int(out["expected"]) == sum(MEASUREMENTS.values()) + STEPS
    rows: dict[str, list[dict]] = {}

    def complete() -> bool:  # the steps come folded, once their second is over (+1 s of grace)
        start = t0 - t0 % 10**9  # step stats are stamped with their second's start
        rows.update({m: _rows(bed["url"], m, start) for m in (*MEASUREMENTS, "nccl_step_stats", "nccl_proxy_step")})
        return (all(len(rows[m]) == n for m, n in MEASUREMENTS.items())
                and sum(r["steps"] for r in rows["nccl_step_stats"]) == STEPS)

    _wait(complete, bed["tmp"] / "agent.log")
    assert {(r["job_id"], r["host"]) for m in MEASUREMENTS for r in rows[m]} == {("job-9", "h1")}
    colls = [r for r in rows["nccl_collective"] if r["kind"] == "coll"]
    assert len(colls) == 80 and {r["op"] for r in colls} == {"AllReduce"}
    assert all(r["bytes"] == 4 * r["count"] for r in colls)
    tasks = {(r["pid"], r["event_id"]) for r in rows["nccl_collective"]}
    assert all((r["pid"], r["parent_id"]) in tasks for r in rows["nccl_proxy_op"])
    assert rows["nccl_proxy_step"] == []  # raw steps only when asked (nccl.raw_steps_per_s)
    stats = rows["nccl_step_stats"]
    # per rank: the collectives' steps on channels 0-3 over its QP, the p2ps' on channel 0 over its socket
    assert {(r["rank"], r["channel"], r["direction"], r["connection"], r["net"]) for r in stats} == {
        (str(rank), str(ch), "send", str(1000 + rank), "ib") for rank in (0, 1) for ch in range(4)} | {
        (str(rank), "0", "send", str(50 + rank), "socket") for rank in (0, 1)}
    assert sum(r["bytes"] for r in stats) == STEPS * 4096 and all(r["send_wait_max_ns"] > 0 for r in stats)
    assert {r["peer"] for r in stats} == {"0", "1"} and all(r["stop_ns"] == r["time"] + 10**9 for r in stats)
    assert {r["comm_name"] for r in rows["nccl_comm"]} == {"driver-comm"}

    status = bed["tmp"] / "h1" / "status.json"
    want = sum(MEASUREMENTS.values()) + len(stats)
    _wait(lambda: json.loads(status.read_text())["stats"].get("nccl_records") == want, status)
    assert json.loads(status.read_text())["stats"]["nccl_steps"] == STEPS


def test_the_agent_token_may_post_nccl_records_of_its_own_host_only(bed):
    item = {"host": "h1", "comm_id": "00000000000000aa", "rank": "0", "start_ns": time.time_ns(), "pid": 1,
            "event_id": 1, "kind": "p2p", "op": "Send", "count": 1, "datatype": "ncclInt8"}
    item["stop_ns"] = item["start_ns"] + 5
    r = httpx.post(f"{bed['url']}/ingest/nccl_collectives", headers={"Authorization": f"Bearer {AGENT}"},
                   json={"items": [item, {**item, "host": "h2"}]}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == 1 and [x["index"] for x in body["rejected"]] == [1]
    assert any("'h2' is not 'h1'" in e for e in body["rejected"][0]["errors"])


def test_a_second_agent_does_not_take_over_a_live_socket(bed):
    from hostprobe.nccl import NcclListener

    with pytest.raises(OSError, match="in use"):
        NcclListener(bed["socket"], 0o666, "h1", lambda kind, record: None, {})
    assert bed["socket"].exists() and bed["agent"].poll() is None


def test_intake_counts_bad_batches_and_the_plugins_drops():
    from hostprobe.nccl import NcclIntake
    from tests.test_nccl_decode import coll, header

    got, stats = [], {}
    intake = NcclIntake("h1", lambda kind, record: got.append((kind, record.event_id)), stats)
    assert intake.handle(header(2) + coll(1) + coll(2, kind=9)) == 1  # the bad record is dropped, the good kept
    assert intake.handle(b"garbage") == 0
    assert intake.handle(header(1, pid=7, d_ring=10, d_slots=0, d_send=5) + coll(3)) == 1
    assert intake.handle(header(1, pid=7, d_ring=12, d_slots=0, d_send=5) + coll(4)) == 1  # cumulative: latest wins
    assert got == [("nccl_collectives", 1), ("nccl_collectives", 3), ("nccl_collectives", 4)]
    assert stats == {"nccl_batches": 4, "nccl_bad_batches": 1, "nccl_records": 3, "nccl_bad_records": 1,
                     "nccl_plugin_dropped": 6 + 17,  # pid 4242: 1+2+3; pid 7: 12+0+5
                     "nccl_steps": 0, "nccl_step_stats": 0, "nccl_steps_late": 0, "nccl_raw_steps": 0,
                     "nccl_raw_steps_refused": 0}
