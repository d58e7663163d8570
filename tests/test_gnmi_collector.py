"""The gNMI collector against the lab's real gNMI target (lab/gnmi_target.py) on loopback,
serving the kernel's counters of `lo` (and, as root, of a veth pair made for the test): one-shot
ONCE polls, the service's STREAM through the poller (rates from moving counters, status changes at
once), a stale stream, a restarted target, wrong credentials, TLS."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from _gnmi import PASSWORD, USER, Target

from collectors.base import CollectorAuthError, CollectorTimeout, CollectorUnreachable
from collectors.gnmi.collector import GnmiCollector
from nms.app.polling import Poller
from nms.config import parse_config
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, LinkEvent, PortRates, PortSample


@pytest.fixture
def target(tmp_path):
    t = Target(tmp_path, "--insecure", "--interfaces", "lo", "--hostname", "leaf9").start()
    yield t
    t.stop()


def device(target: Target, **settings) -> SwitchConfig:
    gnmi = {"port": target.port, "insecure": True, "username": USER, "password": PASSWORD, "interval": 0.2,
            **settings}
    return SwitchConfig(name="gnmi-sw", mgmt_address="127.0.0.1", collectors={"gnmi": gnmi})


def kernel(interface: str, counter: str) -> int:
    return int(Path(f"/sys/class/net/{interface}/statistics/{counter}").read_text())


def blast(octets: int, size: int = 1200) -> int:
    """UDP on loopback to a bound socket (no ICMP errors back); returns the bytes lo counts: payload
    + 28 octets of IP/UDP headers per packet (lo counts after taking off its Ethernet header).
    Packets the full receive buffer drops were still counted by lo."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, socket.socket(socket.AF_INET,
                                                                                 socket.SOCK_DGRAM) as s:
        sink.bind(("127.0.0.1", 0))
        n = octets // size
        for _ in range(n):
            s.sendto(b"x" * size, sink.getsockname())
    return n * (size + 28)


def collect_once(dev: SwitchConfig):
    collector = GnmiCollector()

    async def run():
        try:
            return await collector.collect_with_deadline(dev, 10)
        finally:
            await collector.close()

    return asyncio.run(run())


class _Store:
    def __init__(self):
        self.points = []

    def write(self, points):
        from nms.store import WriteResult

        self.points += points
        return WriteResult(accepted=len(points))


class _NoScheduler:
    def add_job(self, *args, **kwargs):
        raise AssertionError("a streaming device must not be scheduled as polls")


def poller_for(dev: SwitchConfig, tmp_path, records: list) -> Poller:
    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        dev.model_dump(mode="json", exclude_none=True) | {"collectors": {"gnmi": {
            **dev.collectors.gnmi.model_dump(mode="json", exclude_none=True),
            "password": dev.collectors.gnmi.password.get_secret_value()}}}]}}))
    return Poller(cfg, _Store(), registry=None, on_records=records.extend)


async def until(condition, timeout: float, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(step)
    return False


# --- one-shot polls ---------------------------------------------------------------------------


def test_once_reads_the_kernel_counters_of_the_interface(target):
    before = kernel("lo", "rx_bytes")
    result = collect_once(device(target))
    after = kernel("lo", "rx_bytes")
    samples = [r for r in result.records if isinstance(r, PortSample)]
    assert [s.port for s in samples] == ["lo"]
    s = samples[0]
    # lo: what it receives it sent; gRPC's own traffic also runs over it, so a window, not a value
    assert before <= s.in_octets <= after and before <= s.out_octets
    assert s.in_pkts > 0 and s.in_errors == 0 and s.mtu == int(Path("/sys/class/net/lo/mtu").read_text())
    assert s.oper_status in ("up", "unknown")
    [facts] = [r for r in result.records if isinstance(r, DeviceFacts)]
    # inventory from Get /system/state: the target's hostname and version, the machine's uptime
    uptime_ticks = float(Path("/proc/uptime").read_text().split()[0]) * 100
    assert (facts.device, facts.sys_name, facts.interfaces) == ("gnmi-sw", "leaf9", 1)
    assert facts.sys_descr.startswith("nms-lab gNMI target") and abs(facts.uptime_ticks - uptime_ticks) < 500
    [plain] = [r for r in collect_once(device(target, inventory=False)).records if isinstance(r, DeviceFacts)]
    assert (plain.sys_name, plain.sys_descr, plain.uptime_ticks) == ("gnmi-sw", "gNMI 0.8.0 target", None)


def test_poll_mode_keeps_one_subscription_and_each_poll_reads_the_counters_anew(target, tmp_path):
    """`mode: poll`: one Subscribe POLL for the device, a Poll request per poll; counters between two
    polls grow by at least what was sent over lo; a poll cut off at its deadline closes the
    subscription and the next poll opens another."""
    collector = GnmiCollector()
    dev = device(target, mode="poll")
    assert not collector.streams(dev) and collector.streams(device(target))

    def octets(result) -> int:
        [s] = [r for r in result.records if isinstance(r, PortSample)]
        return s.in_octets

    async def run():
        try:
            first = await collector.collect_with_deadline(dev, 10)
            sent = blast(2_000_000)
            second = await collector.collect_with_deadline(dev, 10)
            call = collector._polls["gnmi-sw"]
            third = await collector.collect_with_deadline(dev, 10)
            assert collector._polls["gnmi-sw"] is call and call.polls == 3
            os.kill(target.proc.pid, signal.SIGSTOP)  # a target that stops answering
            try:
                with pytest.raises(CollectorTimeout):
                    await collector.collect_with_deadline(dev, 0.5)
            finally:
                os.kill(target.proc.pid, signal.SIGCONT)
            assert "gnmi-sw" not in collector._polls
            fourth = await collector.collect_with_deadline(dev, 10)
            return first, second, third, fourth, sent
        finally:
            await collector.close()

    first, second, third, fourth, sent = asyncio.run(run())
    assert octets(second) - octets(first) >= sent
    assert octets(first) <= octets(second) <= octets(third) <= octets(fourth)
    facts = [r for r in second.records if isinstance(r, DeviceFacts)]
    assert facts[0].sys_name == "leaf9"
    log = (tmp_path / "target.log").read_text()
    assert log.count("Subscribe POLL") == 2 and "Subscribe ONCE" not in log


def test_a_wrong_password_is_an_auth_error_that_names_no_secret(target):
    with pytest.raises(CollectorAuthError) as e:
        collect_once(device(target, password="not-the-password"))
    assert "UNAUTHENTICATED" in str(e.value) and "not-the-password" not in str(e.value)


def test_nothing_listening_is_unreachable_quickly(tmp_path):
    start = time.monotonic()
    with pytest.raises(CollectorUnreachable):
        collect_once(device(Target(tmp_path), timeout=2))
    assert time.monotonic() - start < 5


def test_tls_checks_the_target_certificate(tmp_path):
    from test_ufm_collector import _self_signed

    cert, key = _self_signed(tmp_path)
    target = Target(tmp_path, "--tls-cert", cert, "--tls-key", key, "--interfaces", "lo").start()
    try:
        good = collect_once(device(target, insecure=False, ca_file=cert))
        assert any(isinstance(r, PortSample) for r in good.records)
        (tmp_path / "other").mkdir()
        other, _ = _self_signed(tmp_path / "other")
        with pytest.raises(CollectorUnreachable):  # a certificate our CA did not sign: no connection
            collect_once(device(target, insecure=False, ca_file=other, timeout=2))
        with pytest.raises(CollectorUnreachable):  # plaintext to a TLS target
            collect_once(device(target, timeout=2))
    finally:
        target.stop()


# --- the service's stream ---------------------------------------------------------------------


def test_the_stream_gives_rates_that_follow_real_traffic(target, tmp_path):
    """SAMPLE every 0.2 s: rates of lo while 8 MB cross it match what was sent; no poll is scheduled."""
    records: list = []
    poller = poller_for(device(target), tmp_path, records)

    async def run():
        poller.schedule(_NoScheduler())
        try:
            assert await until(lambda: any(isinstance(r, PortRates) for r in records), 5), poller.devices()
            start_ns, sent = time.time_ns(), 0
            t_end = time.monotonic() + 1.5
            while time.monotonic() < t_end:
                sent += blast(400_000)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.6)  # the last interval closes
            return start_ns, sent
        finally:
            await poller.close()

    start_ns, sent = asyncio.run(run())
    rates = [r for r in records if isinstance(r, PortRates) and r.ts > start_ns]
    assert len(rates) >= 5
    assert all(0.1 < r.interval_s < 0.5 for r in rates)  # one per SAMPLE tick
    carried = sum(r.in_bps * r.interval_s / 8 for r in rates)
    assert sent <= carried <= sent * 1.05 + 500_000, (sent, carried)  # + gRPC's own bytes on lo
    st = poller.devices()[0]
    assert st.state == "ok" and st.polls >= 10 and st.collector == "gnmi"
    assert poller._streams == {}  # closed


def test_a_silent_stream_goes_stale_and_a_restarted_target_is_streamed_again(target, tmp_path):
    records: list = []
    poller = poller_for(device(target, stale_after=1), tmp_path, records)

    async def run():
        poller.schedule(_NoScheduler())
        try:
            assert await until(lambda: poller.devices()[0].state == "ok", 5)
            target.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            assert await until(lambda: poller.devices()[0].state != "ok", 5)
            stale_after = time.monotonic() - stopped
            st = poller.devices()[0]
            assert st.last_error_kind == "timeout" and "stale" in st.last_error
            target.proc.send_signal(signal.SIGCONT)
            target.stop()
            target.start()  # same port, a new process
            assert await until(lambda: poller.devices()[0].state == "ok", 10), poller.devices()
            polls = poller.devices()[0].polls
            assert await until(lambda: poller.devices()[0].polls > polls + 3, 5)
            return stale_after
        finally:
            await poller.close()

    stale_after = asyncio.run(run())
    assert 0.8 < stale_after < 2.5


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a veth pair to take down (needs root)")
def test_a_link_going_down_reaches_the_poller_within_a_second(tmp_path):
    """ON_CHANGE: the target sees the veth go down through rtnetlink; a LinkEvent follows at once,
    well before the next SAMPLE (interval 10 s here)."""
    a, b = f"nmsgA{os.getpid() % 100000}", f"nmsgB{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        for ifname in (a, b):
            subprocess.run(["ip", "link", "set", ifname, "up"], check=True)
        target = Target(tmp_path, "--insecure", "--interfaces", a).start()
        records: list = []
        arrivals: list[tuple[int, list]] = []
        poller = poller_for(device(target, interval=10), tmp_path, records)
        poller.on_records = lambda batch: (records.extend(batch), arrivals.append((time.time_ns(), batch)))

        async def run():
            poller.schedule(_NoScheduler())
            try:
                assert await until(lambda: (poller.recent.samples.get(("gnmi-sw", a)) or PortSample(
                    device="x", port="x", ts=1)).oper_status == "up", 10)
                downed = time.time_ns()
                subprocess.run(["ip", "link", "set", a, "down"], check=True)
                assert await until(lambda: any(isinstance(r, LinkEvent) and r.state != "up" for r in records), 3)
                down = next(r for r in records if isinstance(r, LinkEvent))
                subprocess.run(["ip", "link", "set", a, "up"], check=True)
                assert await until(lambda: any(isinstance(r, LinkEvent) and r.state == "up" for r in records), 3)
                return downed, down
            finally:
                await poller.close()
                target.stop()

        downed, down = asyncio.run(run())
        arrived = next(t for t, batch in arrivals if down in batch)
        assert down.port == a and down.previous == "up"
        assert (arrived - downed) / 1e9 < 1.0  # from `ip link set down` to the poller's hook
        assert any(p.measurement == "link_event" for p in poller.store.points)  # and stored
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


# --- notifications from other targets ---------------------------------------------------------


def test_full_paths_json_ietf_values_and_a_bad_value_among_good_ones():
    """Targets differ: full paths with module prefixes and JSON_IETF values (uint64 as strings) read
    the same as a prefix with typed values; a value of the wrong kind is left out with its reason,
    the rest of the notification kept."""
    from pygnmi.spec.v080 import gnmi_pb2 as pb

    from collectors.gnmi.model import apply, sample

    def full(name: str, leaf: str):
        return pb.Path(elem=[pb.PathElem(name="openconfig-interfaces:interfaces"),
                             pb.PathElem(name="interface", key={"name": name}),
                             *(pb.PathElem(name=p) for p in leaf.split("/"))])

    n = pb.Notification(timestamp=1_700_000_000_000_000_000, update=[
        pb.Update(path=full("Ethernet1", "state/counters/in-octets"),
                  val=pb.TypedValue(json_ietf_val=b'"18446744073709551615"')),
        pb.Update(path=full("Ethernet1", "state/counters/out-octets"), val=pb.TypedValue(uint_val=42)),
        pb.Update(path=full("Ethernet1", "state/counters/in-errors"), val=pb.TypedValue(string_val="lots")),
        pb.Update(path=full("Ethernet1", "state/oper-status"),
                  val=pb.TypedValue(json_ietf_val=b'"openconfig-interfaces:UP"')),
        pb.Update(path=full("Ethernet1", "ethernet/state/port-speed"),
                  val=pb.TypedValue(string_val="openconfig-if-ethernet:SPEED_400GB")),
        pb.Update(path=full("Ethernet2", "state/counters/in-octets"), val=pb.TypedValue(int_val=-5)),
        pb.Update(path=pb.Path(elem=[pb.PathElem(name="system"), pb.PathElem(name="state")]),
                  val=pb.TypedValue(string_val="ignored")),
    ])
    ports: dict = {}
    update = apply(ports, n)
    assert update.counters == {"Ethernet1"} and update.status == {"Ethernet1"}
    assert sorted(p.what for p in update.problems) == ["Ethernet1 state/counters/in-errors",
                                                      "Ethernet2 state/counters/in-octets"]
    s = sample("sw", "Ethernet1", ports["Ethernet1"], n.timestamp, True)
    assert (s.in_octets, s.out_octets, s.in_errors) == (2**64 - 1, 42, None)
    assert s.oper_status == "up" and s.speed_bps == 400 * 10**9 and s.ts == n.timestamp
    status_only = sample("sw", "Ethernet1", ports["Ethernet1"], n.timestamp + 1, False)
    assert status_only.in_octets is None and status_only.oper_status == "up"
    again = apply(ports, pb.Notification(timestamp=n.timestamp + 10, prefix=pb.Path(elem=[
        pb.PathElem(name="interfaces"), pb.PathElem(name="interface", key={"name": "Ethernet1"})]), update=[
        pb.Update(path=pb.Path(elem=[pb.PathElem(name="state"), pb.PathElem(name="oper-status")]),
                  val=pb.TypedValue(string_val="DOWN"))]))
    assert again.status == {"Ethernet1"} and again.counters == set() and ports["Ethernet1"].leaves[
        "state/oper-status"] == "down"


def test_with_snmp_and_gnmi_on_one_switch_the_stream_gives_link_state_while_it_is_up(tmp_path):
    """A polled agent's cached oper status lags the stream (snmpd caches its interface table): its
    samples must not turn one link-down into flaps. They still give rates; when the stream fails,
    SNMP gives link state again."""
    from collectors.base import PollResult

    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "sw", "mgmt_address": "127.0.0.1", "collectors": {
            "snmp": {"community": "c"}, "gnmi": {"insecure": True, "interval": 1}}}]}}))
    poller = Poller(cfg, _Store(), registry=None)
    t0 = time.time_ns()

    def result(collector: str, dt: float, status: str, octets: int | None) -> PollResult:
        s = PortSample(device="sw", port="swp1", ts=t0 + int(dt * 1e9), oper_status=status, in_octets=octets,
                       out_octets=octets)
        return PollResult(device="sw", collector=collector, started_ns=s.ts, records=[s])

    async def run():
        poller.status[("gnmi", "sw")].state = "ok"  # the stream is up
        events = []
        for collector, dt, status, octets in [("gnmi", 0, "up", 1000), ("snmp", 0.5, "up", 1000),
                                              ("gnmi", 1, "down", None), ("snmp", 1.5, "up", 2000),
                                              ("gnmi", 2, "down", 1000), ("snmp", 2.5, "up", 3000)]:
            before = len(poller.recent.events)
            await poller.ingest(result(collector, dt, status, octets))
            events += [(collector, e.state) for e in list(poller.recent.events)[before:]]
        assert events == [("gnmi", "down")]
        assert poller.recent.samples[("sw", "swp1")].oper_status == "down"
        assert poller.recent.rates[("sw", "swp1")].in_bps == 1000 * 8 / 1.0  # SNMP's rates still count
        poller.status[("gnmi", "sw")].state = "error"  # the stream failed: SNMP's word counts again
        await poller.ingest(result("snmp", 3.5, "up", 4000))
        assert [e.state for e in poller.recent.events][-1] == "up"
        await poller.close()

    asyncio.run(run())


def test_inventory_answers_in_other_vendors_shapes():
    """/system/state as a JSON value at /system ({"state": ...}), as typed leaves with a full path and
    no prefix, and with leaves of the wrong kind (noted, the rest kept)."""
    from pygnmi.spec.v080 import gnmi_pb2 as pb

    from collectors.gnmi.inventory import system_state

    def elems(*names):
        return pb.Path(elem=[pb.PathElem(name=n) for n in names])

    now = 2_000_000_000 * 10**9
    at_system = pb.GetResponse(
        notification=[
            pb.Notification(
                update=[
                    pb.Update(
                        path=elems("openconfig-system:system"),
                        val=pb.TypedValue(
                            json_ietf_val=json.dumps(
                                {
                                    "openconfig-system:state": {
                                        "hostname": "spine3",
                                        "software-version": "EOS-4.31.1F",
                                        "boot-time": str(now - 86_400 * 10**9),
                                    }
                                }
                            ).encode()
                        ),
                    )
                ]
            )
        ]
    )
    problems: list = []
    state = system_state(at_system, now, problems)
    assert (state.hostname, state.software_version, problems) == ("spine3", "EOS-4.31.1F", [])
    facts = state.facts("sw", now, 3, "0.10.0")
    assert (facts.sys_name, facts.sys_descr, facts.uptime_ticks) == ("spine3", "EOS-4.31.1F", 86_400 * 100)
    leaves = pb.GetResponse(notification=[pb.Notification(update=[
        pb.Update(path=elems("system", "state", "hostname"), val=pb.TypedValue(string_val="leaf4")),
        pb.Update(path=elems("system", "state", "up-time"), val=pb.TypedValue(uint_val=5 * 10**9)),
        pb.Update(path=elems("system", "state", "software-version"), val=pb.TypedValue(int_val=7))])])
    state = system_state(leaves, now, problems)
    assert (state.hostname, state.software_version, state.boot_ns) == ("leaf4", None, now - 5 * 10**9)
    assert [str(p) for p in problems] == ["/system/state/software-version: expected a string, got 7"]
    bad = pb.GetResponse(notification=[pb.Notification(prefix=elems("system", "state"), update=[
        pb.Update(path=elems("boot-time"), val=pb.TypedValue(string_val="yesterday"))])])
    problems = []
    state = system_state(bad, now, problems)
    assert state.boot_ns is None and [str(p) for p in problems] == [
        "/system/state/boot-time: expected nanoseconds (uint64), got 'yesterday'"]
    assert state.facts("sw", now, 0, "").sys_descr == "gNMI ? target"
