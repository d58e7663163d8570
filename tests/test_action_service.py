"""The action loop end to end: a real service (uvicorn in this process, so that the planner's view
can be the 4-spine test fabric) and real `nms-agent` processes on loopback addresses receiving
signed commands: the key pinned at registration, signed commands accepted, a host_reroute action's
`steer` commands verified and dispatched on every target, and an agent pinned to another key
refusing the service's commands."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import yaml
from _act_fabric import addresses, topology, uplink

from nms.app.api import create_app
from nms.app.local_daemons import free_port
from nms.app.service import Service
from nms.signing import CommandSigner
from tests.helpers import TOKENS, auth, make_config, serve_in_thread

HOSTS = {"h1": "127.0.0.2", "h2": "127.0.0.3", "h3": "127.0.0.4", "h4": "127.0.0.5"}
KEY = "action-test-probe-key-0123456789"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("actions")
    hosts = [{"name": h, "nics": [{"name": "lo", "address": a}]} for h, a in HOSTS.items()]
    config = make_config(tmp / "data", fabric={"hosts": hosts}, polling={"enabled": False},
                         correlator={"enabled": False}, agents={"command_wait_max": 2, "command_ttl": "60s"},
                         actions={"enabled": True})
    service = Service(config)
    service.actions.context = lambda: (topology(4), addresses(4))
    service.actions.port_loads = lambda: {("spine2", "leaf1"): 0.5, ("spine3", "leaf1"): 0.1}  # the poller's
    app = create_app(service)
    url, server, thread = serve_in_thread(app)
    probe_port = free_port()
    agents = {}

    def start(host: str, signing: dict | None = None) -> None:
        conf = {
            "host": host,
            "service": {"url": url, "token": TOKENS["ingest"]},
            "nics": [{"name": "lo", "address": HOSTS[host]}],
            "probe": {"key": KEY, "port": probe_port, "sports": 2},
            "report": {"buffer_dir": str(tmp / host)},
            "clock_sync": {"enabled": False},
            "nccl": {"enabled": False},
        }
        if signing:
            conf["signing"] = signing
        (tmp / f"{host}.yaml").write_text(yaml.safe_dump(conf))
        agents[host] = subprocess.Popen(
            [sys.executable, "-m", "hostprobe.agent", "--config", str(tmp / f"{host}.yaml")],
            stdout=open(tmp / f"{host}.log", "ab"),
            stderr=subprocess.STDOUT,
        )

    for host in HOSTS:
        start(host)
    api = httpx.Client(base_url=url, timeout=90)
    deadline = time.monotonic() + 30
    while {a["host"] for a in api.get("/agents", headers=auth("read")).json()} != set(HOSTS):
        assert time.monotonic() < deadline, "agents did not register"
        time.sleep(0.2)
    try:
        yield type("Bed", (), {"tmp": tmp, "service": service, "api": api, "start": staticmethod(start),
                               "agents": agents})
    finally:
        for p in agents.values():
            p.terminate()
        for p in agents.values():
            p.wait(10)
        server.should_exit = True
        thread.join(20)


def _wait_done(bed, host: str, command_id: int) -> dict:
    deadline = time.monotonic() + 20
    while True:
        cmd = bed.api.get(f"/agents/{host}/commands/{command_id}", headers=auth("read")).json()
        if cmd["status"] in ("done", "failed", "expired") or time.monotonic() > deadline:
            return cmd
        time.sleep(0.1)


def test_agents_pin_the_service_key_at_registration(bed):
    key = bed.service.agents.signer.public_key
    for host in HOSTS:
        deadline = time.monotonic() + 10
        pin = bed.tmp / host / "service_key.pub"
        while not pin.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pin.read_text().strip() == key


def test_a_signed_command_is_accepted(bed):
    r = bed.api.post("/agents/h1/commands", json={"kind": "reprobe_paths"}, headers=auth("act"))
    cmd = _wait_done(bed, "h1", r.json()["id"])
    assert cmd["status"] == "done" and cmd["message"] == "tracing every path again"


def test_a_host_reroute_action_reaches_every_target_agent_signed(bed):
    r = bed.api.post("/actions", json={"element": uplink("leaf1", 1), "kind": "host_reroute"}, headers=auth("act"))
    assert r.status_code == 200, r.text
    (action,) = r.json()
    assert action["targets"] == sorted(HOSTS) and action["state"] in ("applied", "failed")
    steers = [c for c in bed.api.get("/agents/commands", params={"limit": 100}, headers=auth("read")).json()
              if c["kind"] == "steer"]
    assert sorted(c["host"] for c in steers) == sorted(HOSTS)
    for c in steers:  # verified, then dispatched: the agent's steer answered (or it does not know steer yet)
        assert c["status"] in ("done", "failed") and not c["message"].startswith("refused"), c
        assert c["args"]["action_id"] == action["id"] and c["args"]["avoid_hops"] == ["10.1.1.0", "10.1.1.1"]
        assert c["args"]["expires_ns"] == action["expires_ns"]
        assert c["args"]["hop_loads"] == action["params"]["hop_loads"]  # the agent places its ports by them
        # its own slots of one stripe with the movers behind its switch: its place among them, their number
        assert [c["args"]["rank"], c["args"]["movers"]] == action["params"]["stripe"][c["host"]]
        # the service's placement of every mover's flows, this host's part of it
        assert c["args"]["routes"] == action["params"]["routes"][c["host"]] and c["args"]["routes"]
    events = bed.api.get(f"/actions/{action['id']}/events", headers=auth("read")).json()
    assert [e["by"] for e in events[:2]] == ["t-act", "t-act"]
    if action["state"] == "failed":  # until hostprobe/steer.py lands, each host's reason is in the result
        assert all(h in action["result"] for h in HOSTS)


def test_an_agent_pinned_to_another_key_refuses_the_services_commands(bed):
    bed.agents["h4"].terminate()
    bed.agents["h4"].wait(10)
    other = CommandSigner(bed.tmp / "other-service")
    bed.start("h4", {"public_key": other.public_key})
    time.sleep(1.0)  # registers again
    r = bed.api.post("/agents/h4/commands", json={"kind": "reprobe_paths"}, headers=auth("act"))
    cmd = _wait_done(bed, "h4", r.json()["id"])
    assert cmd["status"] == "failed" and cmd["message"].startswith("refused: bad signature"), cmd
    assert "refused" in (bed.tmp / "h4.log").read_text()
