"""The service side of the agents: peer plan, /agents routes (register, peers, commands long-poll),
the probe records through /ingest."""

from __future__ import annotations

import threading
import time

import pytest

from nms.app.agent_registry import plan_peers
from tests.helpers import api_client, auth, make_config

T0 = 1_800_000_000 * 10**9


def fabric(leaves: int, per_leaf: int) -> dict:
    hosts = [
        {"name": f"h{leaf}-{i}", "nics": [{"name": "eth0", "address": f"10.{leaf}.0.{i}", "switch": f"leaf{leaf}"}]}
        for leaf in range(1, leaves + 1)
        for i in range(1, per_leaf + 1)
    ]
    return {"switches": [{"name": f"leaf{leaf}", "mgmt_address": f"192.0.2.{leaf}", "role": "leaf"}
                         for leaf in range(1, leaves + 1)], "hosts": hosts}


@pytest.fixture
def client(tmp_path):
    with api_client(make_config(tmp_path, fabric=fabric(3, 2), agents={"peers_random": 2, "command_wait_max": 2})) as c:
        yield c


def _connected(plan: dict[str, list[str]]) -> bool:
    seen, todo = set(), [next(iter(plan))]
    while todo:
        h = todo.pop()
        if h not in seen:
            seen.add(h)
            todo += plan[h] + [o for o, ps in plan.items() if h in ps]
    return seen == set(plan)


def test_peer_plan_same_leaf_plus_k_random_stable_and_connected():
    hosts = {f"h{leaf}-{i}": {f"leaf{leaf}"} for leaf in range(20) for i in range(8)}
    plan = plan_peers(hosts, 12, "seed")
    for h, peers in plan.items():
        leaf = hosts[h]
        same = {o for o in hosts if o != h and hosts[o] == leaf}
        assert same <= set(peers) and h not in peers
        assert len(set(peers) - same) >= 12  # K random others (connecting edges may add one or two)
    assert plan == plan_peers(hosts, 12, "seed") and plan != plan_peers(hosts, 12, "other")
    assert _connected(plan)
    # K = 0: only same-leaf peers, and one edge per pair of leaves is added to keep the graph connected
    sparse = plan_peers(hosts, 0, "seed")
    assert _connected(sparse) and sum(map(len, sparse.values())) < sum(map(len, plan.values()))


def test_register_and_peers(client):
    body = {
        "session": "00ab",
        "version": "0.1.0",
        "probe_port": 33434,
        "nics": [{"name": "eth0", "address": "10.1.0.1"}],
    }
    r = client.post("/agents/h1-1/register", json=body, headers=auth("ingest"))
    assert r.status_code == 200, r.text
    got = r.json()
    names = {p["host"] for p in got["peers"]}
    assert "h1-2" in names and "h1-1" not in names and len(names) >= 3
    assert all(p["same_leaf"] == (p["host"] == "h1-2") for p in got["peers"])
    assert got["instance"] and got["command_wait_max"] == 2
    again = client.get("/agents/h1-1/peers", headers=auth("ingest")).json()
    assert again["peers"] == got["peers"] and again["generation"] == got["generation"]
    listed = client.get("/agents", headers=auth("read")).json()
    assert [a["host"] for a in listed] == ["h1-1"] and listed[0]["token"] == "t-ingest"
    assert client.post("/agents/nope/register", json=body, headers=auth("ingest")).status_code == 404
    assert client.post("/agents/h1-1/register", json=body, headers=auth("read")).status_code == 403
    assert client.post("/agents/h1-1/register", json={**body, "extra": 1}, headers=auth("ingest")).status_code == 422


def test_commands_long_poll(client):
    body = {"session": "01", "probe_port": 33434}
    client.post("/agents/h2-1/register", json=body, headers=auth("ingest"))
    t = time.monotonic()
    r = client.get("/agents/h2-1/commands?after=0&wait=0.6", headers=auth("ingest"))
    assert r.json()["commands"] == [] and 0.5 < time.monotonic() - t < 2.0  # held, then empty
    got = {}

    def poll():
        got["r"] = client.get("/agents/h2-1/commands?after=0&wait=5", headers=auth("ingest")).json()
        got["t"] = time.monotonic()

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.3)
    sent = time.monotonic()
    cmd = client.post("/agents/h2-1/commands", json={"kind": "set_rate", "args": {"rate": 50}}, headers=auth("act"))
    assert cmd.status_code == 200, cmd.text
    waiter.join(5)
    assert got["r"]["commands"][0]["kind"] == "set_rate" and got["r"]["commands"][0]["args"] == {"rate": 50}
    assert got["t"] - sent < 1.0  # woken at once, not at the end of the wait
    first = got["r"]["commands"][0]["id"]
    assert client.get(f"/agents/h2-1/commands?after={first}", headers=auth("ingest")).json()["commands"] == []
    # the wait is capped by agents.command_wait_max (2 s here)
    t = time.monotonic()
    client.get(f"/agents/h2-1/commands?after={first}&wait=3600", headers=auth("ingest"))
    assert time.monotonic() - t < 3.5
    # operators need `act`; bad commands are refused
    assert (
        client.post("/agents/h2-1/commands", json={"kind": "reprobe_paths"}, headers=auth("ingest")).status_code == 403
    )
    bad = client.post("/agents/h2-1/commands", json={"kind": "set_rate", "args": {"rate": -1}}, headers=auth("act"))
    assert bad.status_code == 422
    assert client.post("/agents/h2-1/commands", json={"kind": "reboot"}, headers=auth("act")).status_code == 422
    many = client.post("/agents/commands", json={"kind": "reprobe_paths"}, headers=auth("act")).json()
    assert [c["kind"] for c in many] == ["reprobe_paths"]  # every registered agent: just h2-1


def test_unregistered_agent_gets_an_empty_answer_at_once(client):
    t = time.monotonic()
    r = client.get("/agents/h3-1/commands?after=0&wait=10", headers=auth("ingest"))
    assert r.status_code == 200 and r.json()["commands"] == [] and time.monotonic() - t < 1.0


def test_probe_records_through_ingest(client):
    window = {"src_host": "h1-1", "src_nic": "eth0", "dst_host": "h2-1", "dst_nic": "eth0", "path_id": "abc",
              "window_start": T0, "sent": 10, "received": 9, "owd_fwd_p50_ns": -2500, "rtt_p50_ns": 9000,
              "pairs": 5, "pure_pairs": 4, "sport": 40001}
    path = {"src_host": "h1-1", "src_nic": "eth0", "dst_host": "h2-1", "dst_nic": "eth0", "path_id": "abc",
            "ts": T0, "src_addr": "10.1.0.1", "dst_addr": "10.2.0.1", "dport": 33434, "sports": "40001,40007",
            "probed_sport": 40001, "fwd_hops": "10.1.0.254,10.9.0.1,*", "rev_hops": "", "fwd_complete": True,
            "rev_complete": False}
    event = {"src_host": "h1-1", "src_nic": "eth0", "dst_host": "h2-1", "dst_nic": "eth0", "path_id": "abc",
             "ts": T0, "state": "down", "reason": "no reply for 1.00 s", "sport": 40001, "since_ns": T0 - 10**9}
    for kind, item in (("probe_windows", window), ("probe_paths", path), ("path_events", event)):
        r = client.post(f"/ingest/{kind}", json={"items": [item]}, headers=auth("ingest"))
        assert r.json() == {"accepted": 1, "rejected": []}, (kind, r.text)
    bad = client.post("/ingest/probe_windows", json={"items": [{**window, "pure_pairs": 6}]}, headers=auth("ingest"))
    assert bad.status_code == 422 and "pure_pairs" in bad.text
    q = client.post("/telemetry/query", json={"measurement": "probe_path", "start": 0, "end": T0 + 1},
                    headers=auth("read")).json()
    row = dict(zip(q["series"][0]["columns"], q["series"][0]["values"][0]))
    assert row["sports"] == "40001,40007" and row["fwd_hops"] == "10.1.0.254,10.9.0.1,*"


def test_the_peer_list_hands_each_agent_its_joined_qps_to_trace(client):
    """The two hosts' QP lists (tests/fixtures/rdma, recorded `rdma -j` shapes) posted as the agents
    post them: each host's peer list then carries its QPs with the peer end's address and the QP's
    RoCE v2 source port (hostprobe/qp_trace.py traces them)."""
    from tests.test_qp_paths import records, vectors

    for host, pid, rank, addr in (("h1-1", 4100, 0, "10.1.0.1"), ("h2-1", 5200, 1, "10.2.0.1")):
        recs = records({"h1-1": "host1", "h2-1": "host3"}[host], pid, rank, addr, time.time_ns())
        items = [r.model_copy(update={"host": host}).model_dump(mode="json") for r in recs]
        r = client.post("/ingest/nccl_rdma_qps", json={"items": items}, headers=auth("ingest"))
        assert r.status_code == 200 and r.json()["accepted"] == 2, r.text
    got = client.get("/agents/h1-1/peers", headers=auth("ingest")).json()
    assert [(q["lqpn"], q["src_addr"], q["dst_addr"], q["peer_host"]) for q in got["qps"]] == [
        (0x11d2, "10.1.0.1", "10.2.0.1", "h2-1"), (0x11d3, "10.1.0.1", "10.2.0.1", "h2-1")]
    kernel = {(lq, rq): sp for fl, lq, rq, sp in vectors() if fl == 0}  # the C copy of the kernel's formula
    assert [q["sport"] for q in got["qps"]] == [kernel[(0x11d2, 0x2c8)], kernel[(0x11d3, 0x2c9)]]
    assert client.get("/agents/h1-2/peers", headers=auth("ingest")).json()["qps"] == []  # no QPs there
