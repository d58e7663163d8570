"""Sharded polling (nms/app/poll_shard.py) of a fabric manager and of command-line switches: real `poll`
members (tests/test_cluster_poll.py's Member: Poller + PollShard, each on its own NATS connection) against
a real nats-server with JetStream (tests/_nats.py), polling

* `ufm-1`, an NVIDIA UFM Enterprise stand-in (tests/_ufm.py: a real HTTP server answering the REST
  routes and JSON shapes of NVIDIA's UFM REST API guide and the public code it cites): one polled device
  reporting four InfiniBand switches;
* `cli-1` and `cli-2`, one real OpenSSH sshd in a network namespace (tests/_sshd.py, as
  tests/test_cli_collector.py), logged into over SSH by the CLI collector (collectors/cli/).

poll-b starts alone and polls all three; poll-a joins and takes ufm-1 and cli-1 (rendezvous hashing,
nms/rendezvous.py); poll-a is then killed (stops without leaving, as kill -9) and poll-b takes them
back: the case where the member taking a device knew it before, and what it knew is stale. And, without
a bus, a device given away while its poll runs: forgotten once that poll ended."""

from __future__ import annotations

import asyncio
import time

import pytest
from _sshd import PORT, SshBox, skip_reason
from _ufm import SWITCH_NAMES, UfmStandIn, port_name
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry
from test_cluster_poll import Member, _Store, bounded, cluster_config, handovers, until

from collectors.ufm.collector import UfmCollector
from nms.app.polling import Poller
from nms.records import LinkEvent, PortRates, PortSample
from nms.rendezvous import assign

HEARTBEAT = 2.0
INTERVAL = 1.0  # every device's polling interval
UFM, CLI = "ufm-1", ["cli-1", "cli-2"]
DEVICES = [UFM, *CLI]
SKIP = skip_reason()
# the UFM port whose receive counter grows at a known pace, and the one that goes down while poll-a polls
FED, FED_PORT = ("spine-2", "1/1/1"), port_name("spine-2", "1/1/1")
DROPPED = ("leaf-2", "1/3/1")
WORDS_PER_TICK, TICK_S = 25_000_000, 0.1  # Infiniband_MBIn counts 4-octet words: 8 Gb/s
FED_BPS = WORDS_PER_TICK * 4 * 8 / TICK_S


@pytest.fixture(scope="module")
def box():
    if SKIP is not None:
        pytest.skip(f"the CLI device needs a real sshd: {SKIP}")
    box = SshBox().start()
    yield box
    box.stop()


@pytest.fixture
def ufm():
    server = UfmStandIn().start()
    yield server
    server.stop()


def polled_device(record) -> str:
    """The configured device whose poll gave the record: UFM's switches (and UFM itself) are ufm-1's."""
    return UFM if record.device in SWITCH_NAMES | {UFM} else record.device


def collector_switches(box: SshBox, ufm: UfmStandIn) -> list[dict]:
    cli = {"username": "root", "key_file": str(box.client_key), "known_hosts": str(box.known_hosts), "port": PORT,
           "timeout": 3, "lldp": False, "config": False, "interval": INTERVAL, "deadline": 0.95 * INTERVAL}
    ufm_settings = {"url": ufm.url, "username": "admin", "password": "ufm-stand-in-password", "backoff": 0.05,
                    "events": False, "alarms": False, "interval": INTERVAL, "deadline": 0.95 * INTERVAL}
    return ([{"name": UFM, "mgmt_address": "127.0.0.1", "collectors": {"ufm": ufm_settings}}]
            + [{"name": name, "mgmt_address": box.address, "collectors": {"cli": cli}} for name in CLI])


async def start(config, name: str, seen: dict[str, list]) -> Member:
    """A member whose every record (with the derived rates and link events) lands in seen[name]."""
    m = await Member(config, name).start()
    seen[name] = []
    m.poller.on_records = seen[name].extend
    return m


def test_ufm_and_cli_devices_are_split_and_a_killed_members_devices_are_polled_afresh_within_two_heartbeats(
        nats_server, box, ufm, tmp_path):
    config = cluster_config(tmp_path, nats_server.url, collector_switches(box, ufm))
    shares = assign(DEVICES, ["poll-a", "poll-b"])
    assert shares == {"poll-a": {UFM, "cli-1"}, "poll-b": {"cli-2"}}  # the names are chosen for this split
    seen: dict[str, list] = {}

    async def feed():
        fed, started = 0, time.monotonic()
        while True:  # the fed port receives 8 Gb/s as UFM's counters would show it, by the clock (loop stalls aside)
            due = int((time.monotonic() - started) / TICK_S * WORDS_PER_TICK)
            ufm.advance(FED_PORT, "Infiniband_MBIn", due - fed)
            fed = due
            await asyncio.sleep(TICK_S)

    async def run():
        feeding = asyncio.create_task(feed())
        b = await start(config, "poll-b", seen)
        members = [b]
        try:
            # poll-b alone: it polls everything, and has rates of ufm-1's and cli-1's ports
            def rated(records, device: str) -> bool:
                return any(isinstance(r, PortRates) and polled_device(r) == device for r in records)
            await until(lambda: all(rated(seen["poll-b"], d) for d in DEVICES), 15, "poll-b's rates of every device")

            a = await start(config, "poll-a", seen)
            members = [a, b]
            await until(lambda: all(m.scheduled() == shares[m.name] for m in members), 10, "the shares scheduled")
            assert [m.shard.owned for m in members] == [shares["poll-a"], shares["poll-b"]]
            # what poll-b gave away it forgot (once a poll under way ended): no SSH session to cli-1 left open,
            # no UFM client
            await until(lambda: b.poller.collectors["cli"]._sessions.kept("cli-1") is None, 2 * INTERVAL,
                        "poll-b to log out of cli-1")
            await until(lambda: b.poller.collectors["ufm"]._clients.kept(UFM) is None, 2 * INTERVAL,
                        "poll-b to close its UFM client")

            # steady state: every device polled again, each by its owner only, in a window without a handover
            # (on a starved machine an event loop may stall past the renewal margin: such a window is not counted)
            for _ in range(3):
                await until(lambda: all(m.scheduled() == shares[m.name] for m in members), 10, "the shares scheduled")
                before, moved = [m.polls() for m in members], [handovers(m) for m in members]
                marks = {m.name: len(seen[m.name]) for m in members}
                await until(lambda before=before: all(m.polls()[d] >= n[d] + 2 for m, n in zip(
                    members, before, strict=True) for d in m.shard.owned), 15, "two more polls of every device")
                if [handovers(m) for m in members] == moved:
                    break
                print("the membership changed during the steady-state window (an event loop stalled); again")
            else:
                raise AssertionError("no steady-state window without a membership change in three")
            for m, n in zip(members, before, strict=True):
                others = set(DEVICES) - shares[m.name]
                assert {d: m.polls()[d] for d in others} == {d: n[d] for d in others}, m.name  # not polled twice
                assert {polled_device(r) for r in seen[m.name][marks[m.name]:]} == shares[m.name], m.name
            assert any(isinstance(r, PortRates) and (r.device, r.port) == FED for r in seen["poll-a"])

            # while poll-a polls ufm-1, one of its switch ports goes down: poll-a reports it
            port = next(p for p in ufm.data["ports"] if (p["system_name"], p["dname"]) == DROPPED)
            port["logical_state"], port["physical_state"] = "Down", "Polling"
            await until(lambda: any(isinstance(r, LinkEvent) and (r.device, r.port) == DROPPED and r.state == "down"
                                    for r in seen["poll-a"]), 10, "poll-a to report the port down")

            # poll-a dies right after renewing its entry (the worst case)
            renewed = a.shard._next_beat
            await until(lambda: a.shard._next_beat != renewed, 5, "poll-a to renew its entry")
            mark = len(seen["poll-b"])
            await a.kill()
            killed_ns, killed = time.time_ns(), time.monotonic()

            def polled_by_b() -> bool:
                return all((b.poller.status[(c, d)].last_success_ns or 0) > killed_ns
                           for c, d in (("ufm", UFM), ("cli", "cli-1")))
            await until(lambda: b.shard.owned == set(DEVICES), 10, "poll-b to take poll-a's devices")
            taken = time.monotonic() - killed
            await until(polled_by_b, 10, "poll-a's devices polled by poll-b")
            took = time.monotonic() - killed
            assert took <= 2 * HEARTBEAT, f"took {took:.2f} s, more than 2 heartbeats ({2 * HEARTBEAT} s)"
            assert b.shard.owned == set(DEVICES) and b.scheduled() == set(DEVICES)
            # its status (on the bus for the other members' views) names the switches ufm-1's poll reported
            assert b.poller.status[("ufm", UFM)].snapshot().covers == sorted(SWITCH_NAMES)

            # records keep flowing from poll-b, with rates over its own samples only
            def after(kind, key) -> list:
                return [r for r in seen["poll-b"][mark:] if isinstance(r, kind) and (r.device, r.port) == key]
            await until(lambda: len(after(PortRates, FED)) >= 3 and after(PortRates, ("cli-1", "mgmt0")), 10,
                        "poll-b's rates of the taken devices")
            fed, ssh = after(PortRates, FED), after(PortRates, ("cli-1", "mgmt0"))
            first = min(after(PortSample, FED), key=lambda s: s.ts)
            # none spans back before the kill, to a sample poll-b took before it gave the device away: its
            # first sample after the move starts the rates afresh (1 ms: the float interval's rounding)
            for r, since in [(r, first.ts) for r in fed] + [(r, killed_ns) for r in ssh]:
                assert r.ts - r.interval_s * 1e9 >= since - 1e6 and r.interval_s <= 3 * INTERVAL, r
            for r in fed:  # the fed port's rate, near what it was fed; no negative or huge rates
                assert 0.5 * FED_BPS <= r.in_bps <= 1.5 * FED_BPS and r.out_bps == 0, r
                assert r.in_utilization <= 1, r
            for r in ssh:  # the SSH sessions' own traffic on cli-1's management port (a veth: 10 Gb/s)
                assert 0 <= r.in_bps < 1e8 and 0 <= r.out_bps < 1e8, r
            # the port that went down under poll-a is not reported down again by poll-b (it knew it up)
            assert not [e for e in after(LinkEvent, DROPPED)], after(LinkEvent, DROPPED)
            assert [s.oper_status for s in after(PortSample, DROPPED)][:1] == ["down"]
            return taken, took
        finally:
            feeding.cancel()
            for m in members:
                await m.stop()

    taken, took = bounded(run(), timeout=120)
    print(f"poll-a's UFM and CLI devices taken by poll-b {taken:.2f} s and polled {took:.2f} s after the kill")


def test_a_device_given_away_during_its_poll_is_forgotten_once_that_poll_ended(ufm, tmp_path):
    """The poll under way finishes with its session (its records count) and only then is the device
    forgotten: its ports' previous samples (that poll's included) and the collector's client."""
    class Gated(UfmCollector):
        gate: asyncio.Event

        async def collect(self, device):
            await self.gate.wait()
            return await super().collect(device)

    config = cluster_config(tmp_path, "nats://127.0.0.1:1", [{"name": UFM, "mgmt_address": "127.0.0.1", "collectors": {
        "ufm": {"url": ufm.url, "username": "admin", "password": "ufm-stand-in-password", "interval": 60}}}])
    collector = Gated()
    poller = Poller(config, _Store(), CollectorRegistry(), collectors={"ufm": collector})
    seen: list = []
    poller.on_records = seen.extend

    async def run():
        collector.gate = asyncio.Event()
        collector.gate.set()
        poller.owned = {UFM}
        poller.schedule(AsyncIOScheduler(timezone="UTC"))  # not started: the test polls
        try:
            await poller.poll("ufm", UFM)
            collector.gate.clear()
            ufm.advance(FED_PORT, "Infiniband_MBIn", WORDS_PER_TICK)
            polling = asyncio.create_task(poller.poll("ufm", UFM))
            await until(lambda: ("ufm", UFM) in poller._polling, 5, "the second poll to begin")
            await poller.set_owned(set())
            await asyncio.sleep(0.1)
            assert collector._clients.kept(UFM) is not None  # not while its poll runs
            collector.gate.set()
            await polling
            await until(lambda: collector._clients.kept(UFM) is None, 5, "the client closed")
        finally:
            await poller.close()

    bounded(run(), timeout=60)
    assert any(isinstance(r, PortRates) and (r.device, r.port) == FED for r in seen)  # the second poll counted
    assert not poller.rates["ufm"]._last_port and poller.status[("ufm", UFM)].state == "pending"
