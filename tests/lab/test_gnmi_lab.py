"""The lab's gNMI targets (`nms lab up --southbound snmp,gnmi`): reached from the root namespace over
the management network with TLS and the lab's credentials, exactly as the generated config says;
counters that follow the kernel's under iperf3 load; oper-status changes streamed within a second
of a link-down fault and its heal.

Builds its own 2x2x2 lab (prefix nmsn-, 198.18.248.0/24), so a user's lab or the other lab test
modules' labs can stay up meanwhile. Root only."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from lab_helpers import build_lab, new_lab_dir, skip_reason
from pygnmi.spec.v080 import gnmi_pb2 as g
from pygnmi.spec.v080 import gnmi_pb2_grpc

from lab import lab as lab_mod
from lab import traffic as traffic_mod
from nms.config import load_config

PREFIX = "nmsn-"
MGMT = "198.18.248.0/24"
NO_PROXY = [("grpc.enable_http_proxy", 0)]  # lab traffic never goes to a proxy from the environment

pytestmark = [pytest.mark.root, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.fixture(scope="module")
def lab():
    handle = build_lab(new_lab_dir(), PREFIX, MGMT)  # the default southbound: snmp and gnmi
    yield handle
    lab_mod.down(handle.dir, PREFIX)


class Gnmi:
    """A client of one switch's target, configured from the lab's generated NMS config."""

    def __init__(self, lab, switch: str):
        config = load_config(lab.dir.config)
        device = next(s for s in config.fabric.switches if s.name == switch)
        s = device.collectors.gnmi
        credentials = grpc.ssl_channel_credentials(s.ca_file.read_bytes())  # verifies SAN = mgmt address
        self.channel = grpc.aio.secure_channel(f"{device.mgmt_address}:{s.port}", credentials, options=NO_PROXY)
        self.stub = gnmi_pb2_grpc.gNMIStub(self.channel)
        self.metadata = (("username", s.username), ("password", s.password.get_secret_value()))

    def subscribe(self, *subs: g.Subscription):
        async def requests():
            yield g.SubscribeRequest(subscribe=g.SubscriptionList(subscription=list(subs), encoding=g.PROTO))
            await asyncio.sleep(3600)
        return self.stub.Subscribe(requests(), metadata=self.metadata)


def path(*elems: str, port: str | None = None) -> g.Path:
    head = [g.PathElem(name="interfaces"), g.PathElem(name="interface", key={"name": port} if port else {})]
    return g.Path(elem=head + [g.PathElem(name=e) for e in elems])


def leaves(n: g.Notification) -> dict:
    return {"/".join(e.name for e in u.path.elem): getattr(u.val, u.val.WhichOneof("value")) for u in n.update}


async def until_sync(call) -> dict[str, dict]:
    """The values before the sync_response: interface -> leaves."""
    first: dict[str, dict] = {}
    while (r := await call.read()) is not grpc.aio.EOF:
        if r.sync_response:
            return first
        first.setdefault(r.update.prefix.elem[1].key["name"], {}).update(leaves(r.update))
    raise AssertionError("the stream ended before its sync_response")


async def sysfs(lab, node: str, port: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of the port, read by `cat` inside its namespace."""
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", lab.topo.netns(node), "cat", f"/sys/class/net/{port}/statistics/rx_bytes",
        f"/sys/class/net/{port}/statistics/tx_bytes", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    rx, tx = out.split()
    return int(rx), int(tx)


def test_the_config_reaches_every_target_with_tls_and_the_lab_user(lab):
    state = lab.status()
    assert state["lab"]["spec"]["southbound"] == ["snmp", "gnmi"]
    for node in state["nodes"].values():
        assert node["services"].get("gnmi") is (True if node["role"] != "host" else None), node
    config_text = lab.dir.config.read_text()
    assert state["gnmi"]["password"] not in config_text  # only ${file:...}
    for key in (lab.dir.root / "tls").glob("*.key"):
        assert key.stat().st_mode & 0o077 == 0
    assert (lab.dir.run_dir / "gnmi-password").stat().st_mode & 0o077 == 0

    async def caps_and_speed(switch: str):
        client = Gnmi(lab, switch)
        async with client.channel:
            caps = await client.stub.Capabilities(g.CapabilityRequest(), metadata=client.metadata, timeout=5)
            got = await client.stub.Get(g.GetRequest(path=[path()], encoding=g.JSON_IETF), metadata=client.metadata,
                                        timeout=5)
        doc = json.loads(got.notification[0].update[0].val.json_ietf_val)["openconfig-interfaces:interface"]
        return caps, {i["name"]: i["openconfig-if-ethernet:ethernet"]["state"]["port-speed"] for i in doc}

    for switch in lab.topo.switches:
        caps, speeds = asyncio.run(caps_and_speed(switch.name))
        assert "openconfig-interfaces" in {m.name for m in caps.supported_models}
        assert speeds == {p.name: "openconfig-if-ethernet:SPEED_100MB" for p in switch.ports}  # its ports only


def test_sampled_counters_follow_the_kernel_under_iperf3_load(lab):
    port = lab.topo.link("leaf1-host1").a.name  # leaf1's port facing host1: host1's traffic comes in there
    duration = 3.0

    async def run():
        client = Gnmi(lab, "leaf1")
        async with client.channel:
            call = client.subscribe(g.Subscription(path=path("state", "counters", port=port), mode=g.SAMPLE,
                                                   sample_interval=250_000_000))
            await until_sync(call)

            async def bracket():  # kernel read, the first sample taken after it, kernel read again
                before = await sysfs(lab, "leaf1", port)
                after_read = time.time_ns()
                while (r := await call.read()).update.timestamp <= after_read:
                    pass
                after = await sysfs(lab, "leaf1", port)
                v = leaves(r.update)
                return before, (v["state/counters/in-octets"], v["state/counters/out-octets"]), after

            brackets = [await bracket()]  # before the load
            load = asyncio.create_task(asyncio.to_thread(
                traffic_mod.run, lab.dir, "pairs", pairs=["host1:host3"], proto="udp", rate="20M", duration=duration))
            while not load.done():
                brackets.append(await bracket())
            brackets.append(await bracket())  # after it
            call.cancel()
            return brackets, await load

    brackets, record = asyncio.run(run())
    [flow] = record["flows"]
    assert flow["error"] is None and flow["sent_bps"] > 15e6, flow
    for before, got, after in brackets:  # the target's values are the kernel's, read in between
        assert before[0] <= got[0] <= after[0] and before[1] <= got[1] <= after[1], (before, got, after)
    rx = [got[0] for _, got, _ in brackets]
    assert len(brackets) >= 8 and rx == sorted(rx)
    assert rx[-1] - rx[0] >= 0.95 * flow["sent_bps"] * duration / 8  # every payload byte passed (plus headers)


def test_oper_status_streams_within_a_second_of_link_down_and_heal(lab):
    port = lab.topo.link("leaf1-spine1").a.name

    async def run():
        client = Gnmi(lab, "leaf1")
        async with client.channel:
            call = client.subscribe(g.Subscription(path=path("state", "oper-status", port=port), mode=g.ON_CHANGE),
                                    g.Subscription(path=path("state", "admin-status", port=port), mode=g.ON_CHANGE))
            first = (await until_sync(call))[port]
            seen: list[tuple[int, int, dict]] = []  # (received ns, notification ts, leaves)

            async def reader():
                while (r := await call.read()) is not grpc.aio.EOF:
                    seen.append((time.time_ns(), r.update.timestamp, leaves(r.update)))

            task = asyncio.create_task(reader())
            fault = await asyncio.to_thread(lab.fault, "link-down", "leaf1-spine1")
            await asyncio.sleep(1.5)
            heal_called = time.time_ns()
            await asyncio.to_thread(lab.heal, fault["id"])
            await asyncio.sleep(1.5)
            task.cancel()
            call.cancel()
            healed = next(f for f in lab.state()["faults"] if f["id"] == fault["id"])
            return first, seen, fault["start_ns"], heal_called, healed["end_ns"]

    first, seen, down_ns, heal_called, up_ns = asyncio.run(run())
    assert first == {"state/oper-status": "UP", "state/admin-status": "UP"}
    changes = [(rx, ts, v["state/oper-status"]) for rx, ts, v in seen if "state/oper-status" in v]
    assert [c[2] for c in changes] == ["DOWN", "UP"], seen
    (rx_down, ts_down, _), (rx_up, ts_up, _) = changes
    print(f"oper-status DOWN received {(rx_down - down_ns) / 1e6:.1f} ms after the fault's start, "
          f"UP {(rx_up - heal_called) / 1e6:.1f} ms after `heal` was called "
          f"({(rx_up - up_ns) / 1e6:.1f} ms from its end)")
    assert down_ns <= ts_down and rx_down - down_ns < 1e9, (rx_down - down_ns) / 1e6
    # `heal` records its end after carrier is back, so the UP may come before end_ns, never after + 1 s
    assert heal_called <= ts_up and rx_up - up_ns < 1e9, (rx_up - up_ns) / 1e6
    assert not any("state/admin-status" in v for _, _, v in seen)  # carrier loss: nobody set the port down


def test_nms_serve_streams_every_switch_and_shows_a_link_down_within_seconds(lab, tmp_path):
    """The whole path: `nms serve` with the lab's generated config (gNMI only) keeps a TLS stream per
    switch open through the gNMI collector; /ports get rates; a link-down fault shows in /topology
    as the streamed oper-status change, not at the next sample, and the heal likewise."""
    import socket
    import subprocess
    import sys

    import httpx
    import yaml

    config = yaml.safe_load(lab.dir.config.read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config["api"] = {**config["api"], "port": port, "listen": []}
    config["data_dir"] = str(tmp_path / "data")
    for switch in config["fabric"]["switches"]:
        switch["collectors"].pop("snmp")
        switch["collectors"]["gnmi"]["interval"] = "10s"  # the link change must not wait for a sample
    (tmp_path / "nms.yaml").write_text(yaml.safe_dump(config))
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {lab.dir.token.read_text().strip()}"}
    service = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(tmp_path / "nms.yaml")],
                               stdout=open(tmp_path / "service.log", "wb"), stderr=subprocess.STDOUT)

    def get(route: str):
        return httpx.get(url + route, headers=headers, timeout=5).json()

    def link_state(name: str) -> str | None:
        ends = {str(lab.topo.link(name).a), str(lab.topo.link(name).b)}
        return next((x["state"] for x in get("/topology")["links"] if {x["a"], x["b"]} == ends), None)

    def until(predicate, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        return False

    try:
        switches = {s.name for s in lab.topo.switches}
        assert until(lambda: {d["device"] for d in get("/devices") if d["collector"] == "gnmi"
                              and d["state"] == "ok"} == switches, 20), (tmp_path / "service.log").read_text()[-3000:]
        assert until(lambda: link_state("leaf1-spine1") == "up", 10)
        fault = lab.fault("link-down", "leaf1-spine1")
        assert until(lambda: link_state("leaf1-spine1") == "down", 3), get("/topology")
        seen_down = time.time_ns()
        lab.heal(fault["id"])
        healed = time.time_ns()
        assert until(lambda: link_state("leaf1-spine1") == "up", 3)
        seen_up = time.time_ns()
        print(f"/topology: down {(seen_down - fault['start_ns']) / 1e6:.0f} ms after the fault, "
              f"up {(seen_up - healed) / 1e6:.0f} ms after the heal (SAMPLE interval 10 s)")
        assert (seen_down - fault["start_ns"]) / 1e9 < 3 and (seen_up - healed) / 1e9 < 3
        ports = {(p["device"], p["port"]) for p in get("/ports")}
        assert {(s.name, p.name) for s in lab.topo.switches for p in s.ports} <= ports
        assert all(d["state"] == "ok" for d in get("/devices") if d["collector"] == "gnmi")
    finally:
        service.terminate()
        service.wait(20)
