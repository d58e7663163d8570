"""The lab's sshd on every switch (`nms lab up --southbound cli`), read by the CLI collector exactly
as the generated config says: an unprivileged login with the lab's key, host keys checked against
the lab's known_hosts. Each switch's hostname, ports, LLDP neighbours and addresses are the lab's
plan; a failover link-down shows as the port going down and as the switch's routes changing in the
configuration diff; a switch whose host key changed is refused, the others still polled.

Builds its own 2x2x2 lab (prefix nmsk-, 198.18.244.0/24) with the CLI as the only southbound, so a
user's lab or the other lab test modules' labs can stay up meanwhile. Root only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest
import yaml
from lab_helpers import build_lab, new_lab_dir, skip_reason

from collectors.cli.collector import CliCollector
from lab import inventory
from lab import lab as lab_mod
from nms.app.polling import Poller
from nms.config.loader import parse_config
from nms.store.embedded import EmbeddedStore

PREFIX = "nmsk-"
MGMT = "198.18.244.0/24"

pytestmark = [pytest.mark.root, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.fixture(scope="module")
def lab():
    handle = build_lab(new_lab_dir(), PREFIX, MGMT, southbound="cli")
    yield handle
    lab_mod.down(handle.dir, PREFIX)


def config(lab, **cli):
    """The lab's generated config (secrets resolved), with CLI settings overridden."""
    raw = yaml.safe_load(lab.dir.config.read_text())
    for switch in raw["fabric"]["switches"]:
        assert set(switch["collectors"]) == {"cli"}  # the only southbound of this lab
        switch["collectors"]["cli"].update(cli)
    return parse_config(yaml.safe_dump(raw), source=str(lab.dir.config))


def poller_of(lab, seen: list, **cli) -> Poller:
    cfg = config(lab, **cli)
    store = EmbeddedStore(cfg.data_dir / f"cli-lab-{time.monotonic_ns()}.duckdb")
    return Poller(cfg, store, registry=None, collectors={"cli": CliCollector.from_config(cfg)},
                  on_records=seen.extend)


def ip_json(lab, node: str, *args: str):
    out = subprocess.run(["ip", "-n", lab.topo.netns(node), "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_every_switch_reads_as_the_lab_is_planned(lab):
    seen: list = []
    poller = poller_of(lab, seen)

    async def run():
        try:
            deadline = time.monotonic() + 15  # lldpd sends every 5 s; a lab just built may not have heard all
            while True:
                statuses = await poller.poll_all()
                topology = poller.topology()
                if all(link.check == "ok" for link in topology.links) or time.monotonic() > deadline:
                    return statuses, topology
                await asyncio.sleep(0.5)
        finally:
            await poller.close()

    statuses, topology = asyncio.run(run())
    assert {s.device: s.state for s in statuses} == {n.name: "ok" for n in lab.topo.switches}, \
        [s.last_error for s in statuses]
    for node in lab.topo.switches:
        facts = poller.recent.facts[node.name]
        assert facts.sys_name == node.name  # the switch's own hostname (sshd's UTS namespace)
        ports = {port for (device, port) in poller.recent.samples if device == node.name}
        assert ports == {p.name for p in node.ports} | {"lo", "mgmt0"}
        for p in node.ports:
            assert poller.recent.samples[(node.name, p.name)].oper_status == "up"
            assert poller.recent.samples[(node.name, p.name)].mtu == lab.topo.spec.mtu
        addresses = {(a.port, a.address) for a in poller.recent.addresses[node.name]}
        assert {(p.name, p.address.split("/")[0]) for p in node.ports} <= addresses
        assert (("mgmt0", node.mgmt_address) in addresses)
        # counters are the kernel's: read just after the poll, never below what the poll saw
        kernel = {i["ifname"]: i["stats64"]["rx"]["bytes"] for i in ip_json(lab, node.name, "-s", "link", "show")}
        for p in node.ports:
            polled = poller.recent.samples[(node.name, p.name)].in_octets
            assert 0 < polled <= kernel[p.name]
    # LLDP over the CLI (lldpctl as the unprivileged login user) gives the lab's cabling
    assert sorted((link.check, link.state) for link in topology.links) == [("ok", "up")] * len(lab.topo.links)
    assert any(r.__class__.__name__ == "DeviceFacts" for r in seen)


def test_a_failover_link_down_shows_as_a_port_down_and_a_route_change(lab):
    seen: list = []
    poller = poller_of(lab, seen, config_interval="10ms")
    link = next(link for link in lab.topo.links if link.kind == "fabric")
    leaf = link.a.node if link.a.node.startswith("leaf") else link.b.node
    port = link.a.name if link.a.node == leaf else link.b.name

    async def poll():
        failed = [s.last_error for s in await poller.poll_all() if s.state != "ok"]
        assert not failed

    async def run():
        try:
            await poll()  # the first snapshot
            fault = lab.fault("link-down", link.name, "--mode", "failover")
            try:
                t0 = time.monotonic()
                while poller.recent.samples[(leaf, port)].oper_status == "up" and time.monotonic() - t0 < 10:
                    await asyncio.sleep(0.2)
                    await poll()
            finally:
                lab.heal(fault["id"])
        finally:
            await poller.close()

    asyncio.run(run())
    events = [e for e in poller.recent.events if (e.device, e.port) == (leaf, port)]
    assert [e.state for e in events] == ["down"]
    changes = [r for r in seen if getattr(r, "measurement", "") == "device_config_change" and r.tags["device"] == leaf]
    assert changes, "the withdrawn link's routes changed the leaf's configuration"
    diff = "\n".join(c.fields["diff"] for c in changes)
    # failover: ignore_routes_with_linkdown drops the dead nexthop from the leaf's ECMP routes
    # the leaf's ECMP route to the other leaf loses its nexthop over the link; the connected route's
    # "dead" flag is link state, not configuration, and is not in the diff
    removed = [line for line in diff.splitlines() if line.startswith("-")]
    assert any("nexthop via" in line and f"dev {port} " in line for line in removed), diff
    assert " dead" not in diff


def test_a_switch_with_a_changed_host_key_is_refused_and_the_others_still_polled(lab, tmp_path):
    victim = lab.topo.switches[0]
    known = inventory.cli_known_hosts(lab.dir).read_text().splitlines()
    forged = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    assert forged.returncode == 0
    kind, key = (tmp_path / "k.pub").read_text().split()[:2]
    lines = [f"{victim.mgmt_address} {kind} {key}" if line.startswith(f"{victim.mgmt_address} ") else line
             for line in known]
    (tmp_path / "known_hosts").write_text("\n".join(lines) + "\n")
    poller = poller_of(lab, [], known_hosts=str(tmp_path / "known_hosts"))

    async def run():
        try:
            return {s.device: s for s in await poller.poll_all()}
        finally:
            await poller.close()

    statuses = asyncio.run(run())
    assert statuses[victim.name].state == "error" and statuses[victim.name].last_error_kind == "auth"
    assert "host key" in statuses[victim.name].last_error and "SHA256:" in statuses[victim.name].last_error
    assert all(s.state == "ok" for name, s in statuses.items() if name != victim.name)
