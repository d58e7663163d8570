"""The CLI collector against a real OpenSSH sshd (tests/_sshd.py): a throwaway network namespace
playing a Linux switch, with sshd, lldpd and an LLDP neighbour, reached over a veth pair.

What the switch answers is the kernel's own: counters of its `lo` are compared with its sysfs and
with UDP traffic the test sends there; its routes are changed to change its configuration. Login
failures, timeouts and host keys are real sshd and paramiko behaviour. No vendor CLI and no napalm
driver ran these tests (docs/cli_collector.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from _sshd import PASSWORD, PEER_NAME, PORT, USER, SshBox, keygen, skip_reason

from collectors.base import (
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorTimeout,
    CollectorUnreachable,
)
from collectors.cli.collector import CliCollector
from collectors.cli.config import DIFF_MAX, TEXT_MAX, ConfigTracker
from collectors.cli.linux import Bad, addresses, neighbors, normalize, port_samples
from collectors.cli.settings import CliSettings
from nms.app.polling import Poller
from nms.config import parse_config
from nms.config.loader import ConfigError
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint, InterfaceAddress, LldpNeighbor, PortSample
from nms.store import Query
from nms.store.embedded import EmbeddedStore

SKIP = skip_reason()
needs_sshd = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
UDP_ON_LO = 20 + 8  # what lo counts per datagram besides its payload: IPv4 and UDP headers


@pytest.fixture(scope="module")
def box():
    box = SshBox().start()
    yield box
    box.stop()


def switch(box: SshBox, name: str = "sw-1", **settings) -> SwitchConfig:
    cli = {"username": "root", "key_file": str(box.client_key), "known_hosts": str(box.known_hosts), "port": PORT,
           "timeout": 3, **settings}
    return SwitchConfig(name=name, mgmt_address=settings.pop("address", box.address),
                        collectors={"cli": {k: v for k, v in cli.items() if v is not None and k != "address"}})


def poll(dev: SwitchConfig, collector: CliCollector | None = None, deadline: float = 10):
    collector = collector or CliCollector()

    async def run():
        try:
            return await collector.collect_with_deadline(dev, deadline)
        finally:
            await collector.close()

    return asyncio.run(run())


def failure(dev: SwitchConfig, deadline: float = 10) -> tuple[Exception, float]:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        poll(dev, deadline=deadline)
    return info.value, time.monotonic() - started


def of(records, kind):
    return [r for r in records if isinstance(r, kind)]


def port(result, name: str) -> PortSample:
    [sample] = [s for s in result.samples if s.port == name]
    return sample


# --- what a poll reads ------------------------------------------------------------------------------


@needs_sshd
def test_counters_are_the_kernels_and_grow_by_exactly_the_traffic_sent(box):
    collector = CliCollector()
    dev = switch(box, lldp=False, config=False)

    async def run():
        try:
            first = await collector.collect(dev)
            kernel = box.lo_counters()  # nothing else uses the switch's lo
            box.udp_on_lo(50, 200)
            second = await collector.collect(dev)
            return first, kernel, second
        finally:
            await collector.close()

    first, kernel, second = asyncio.run(run())
    lo1, lo2 = port(first, "lo"), port(second, "lo")
    assert (lo1.in_octets, lo1.out_octets, lo1.in_pkts, lo1.out_pkts) == (
        kernel["rx_bytes"], kernel["tx_bytes"], kernel["rx_packets"], kernel["tx_packets"])
    assert (lo2.in_pkts - lo1.in_pkts, lo2.out_pkts - lo1.out_pkts) == (50, 50)
    assert lo2.in_octets - lo1.in_octets == lo2.out_octets - lo1.out_octets == 50 * (200 + UDP_ON_LO)
    assert (lo2.in_errors, lo2.in_discards, lo2.out_errors, lo2.out_discards) == (0, 0, 0, 0)
    assert lo1.counter_bits is None  # 64-bit (stats64); only a qdisc's drops and marks are 32-bit
    assert first.counter_bits == {"dropped_pkts": 32, "ecn_marked_pkts": 32}
    # oper status: lo (operstate UNKNOWN, UP and LOWER_UP) and the veths up, the pair never set up down
    assert {s.port: s.oper_status for s in second.samples} == {
        "lo": "up", "mgmt0": "up", "swp1": "up", "down0": "down", "down1": "down"}
    assert port(second, "swp1").speed_bps == 10_000_000_000  # a veth says 10000 Mb/s
    assert port(second, "lo").speed_bps is None and port(second, "down0").speed_bps is None  # sysfs: EINVAL
    assert port(second, "lo").mtu == 65536 and port(second, "mgmt0").mtu == 1500
    assert first.started_ns <= lo1.ts <= second.started_ns < lo2.ts <= time.time_ns()
    facts = second.records[0]
    assert isinstance(facts, DeviceFacts) and facts.device == "sw-1" and facts.interfaces == 5
    assert facts.sys_descr == box.run("uname", "-a").strip()
    assert facts.sys_name == box.run("cat", "/proc/sys/kernel/hostname").strip()
    assert abs(facts.uptime_ticks - float(box.run("cat", "/proc/uptime").split()[0]) * 100) < 500


@needs_sshd
def test_egress_queues_are_the_qdiscs_tc_shows(box):
    """`tc -s -j qdisc show` over SSH: a TBF on swp1 is its queue `root`, with the kernel's counters."""
    from nms.records import QueueSample

    subprocess.run(["tc", "-n", box.ns, "qdisc", "replace", "dev", "swp1", "root", "tbf", "rate", "10mbit",
                    "burst", "10kb", "latency", "20ms"], check=True)
    try:
        result = poll(switch(box, lldp=False, config=False))
        [tc] = json.loads(subprocess.run(["tc", "-n", box.ns, "-s", "-j", "qdisc", "show", "dev", "swp1"],
                                         capture_output=True, text=True, check=True).stdout)
        queues = {(q.port, q.queue): q for q in of(result.records, QueueSample)}
        q = queues[("swp1", "root")]
        assert q.dropped_pkts == tc["drops"] == 0 and q.transmit_pkts <= tc["packets"]
        assert q.transmit_octets <= tc["bytes"] and q.ecn_marked_pkts is None
        assert ("lo", "root") not in queues  # noqueue is not a queue
    finally:
        subprocess.run(["tc", "-n", box.ns, "qdisc", "del", "dev", "swp1", "root"], check=False)


@needs_sshd
def test_the_interfaces_patterns_keep_only_matching_ports(box):
    result = poll(switch(box, interfaces=["swp*", "lo"], lldp=False, config=False))
    assert {s.port for s in result.samples} == {"lo", "swp1"}
    assert result.facts.interfaces == 5  # the device's, whatever is kept


@needs_sshd
def test_without_lldpd_lldp_is_noted_and_the_rest_kept(box):
    box.stop_lldpd()
    collector = CliCollector()
    result = poll(switch(box, config=False), collector)
    assert not of(result.records, LldpNeighbor) and result.facts.lldp_chassis_id is None
    assert {s.port for s in result.samples} >= {"lo", "swp1"}
    [problem] = result.problems
    assert problem.kind == "bad_response" and problem.what == "lldpctl -f json"
    assert "unable to connect to socket" in str(problem) and "LLDP neighbours left out" in str(problem)


@needs_sshd
def test_lldp_neighbours_and_chassis_come_from_lldpd(box):
    box.start_lldpd()
    try:
        found, result = [], None
        deadline = time.monotonic() + 15
        while not found and time.monotonic() < deadline:  # the peer sends every second
            result = poll(switch(box, config=False))
            found = of(result.records, LldpNeighbor)
            time.sleep(0.3)
        [n] = found
        peer = json.loads(subprocess.run(["lldpcli", "-u", str(box.dir / "peer.sock"), "-f", "json", "show", "chassis"],
                                         capture_output=True, text=True, check=True).stdout)
        own = json.loads(box.run("lldpcli", "-f", "json", "show", "chassis"))
        assert (n.device, n.port, n.remote_name, n.remote_port) == ("sw-1", "swp1", PEER_NAME, "eth0")
        assert n.remote_chassis_id == peer["local-chassis"]["chassis"][PEER_NAME]["id"]["value"]
        assert result.facts.lldp_chassis_id == own["local-chassis"]["chassis"]["nmsct-sw"]["id"]["value"]
    finally:
        box.stop_lldpd()


@needs_sshd
def test_unparseable_output_names_the_command(box):
    """lldpctl printing something else: noted, the poll kept; `ip` doing so: the poll fails."""
    box.fake_command("/usr/sbin/lldpcli", "lldpd says hello")
    try:
        collector = CliCollector()
        result = poll(switch(box, config=False), collector)
        assert result.samples and not of(result.records, LldpNeighbor)
        [problem] = result.problems
        assert "lldpctl -f json: not JSON" in str(problem) and problem.kind == "bad_response"
    finally:
        box.restore_command("/usr/sbin/lldpcli")
    box.fake_command("/usr/bin/ip", '{"not": "a list"}')
    try:
        e, _ = failure(switch(box, lldp=False, config=False))
        assert isinstance(e, CollectorBadResponse)
        assert f"sw-1: {box.address}:{PORT}: 'ip -s -s -j link show': expected a JSON list" in str(e)
    finally:
        box.restore_command("/usr/bin/ip")


@needs_sshd
def test_a_password_user_logs_in_and_what_it_may_not_read_is_noted(box):
    """A non-root monitoring user: counters and facts as for root; Debian's lldpcli is for group adm
    and nft needs root, so those are noted (nft in the snapshot too), the poll is kept."""
    collector = CliCollector()
    dev = switch(box, username=USER, password=PASSWORD, key_file=None)
    result = poll(dev, collector)
    assert {s.port for s in result.samples} == {"lo", "mgmt0", "swp1", "down0", "down1"}
    problems = " | ".join(str(p) for p in result.problems)
    assert "lldpctl -f json: exit status 127 (not installed, or not allowed for this user)" in problems
    assert "nft list ruleset: exit status 1" in problems and "noted in the configuration snapshot" in problems
    [config], _ = _configs(result.records)
    assert "### nftables: nft list ruleset\n(not readable: exit status 1: " in config.fields["text"]
    assert PASSWORD not in problems + repr(result.records) + repr(dev)


# --- errors -------------------------------------------------------------------------------------------


@needs_sshd
def test_a_wrong_password_or_key_is_an_auth_error_naming_neither(box):
    wrong = keygen(box.dir / "wrong_key")
    for dev in (switch(box, username=USER, password="not-the-password", key_file=None),
                switch(box, key_file=str(wrong)),
                switch(box, password="any-password", key_file=None)):  # root: keys only
        e, took = failure(dev)
        assert isinstance(e, CollectorAuthError) and e.kind == "auth", e
        assert f"sw-1: {box.address}:{PORT}: login refused for user" in str(e) and took < 3
        assert "not-the-password" not in str(e) and "any-password" not in str(e)
        assert "PRIVATE KEY" not in str(e) and wrong.read_text().splitlines()[1] not in str(e)


@needs_sshd
def test_an_encrypted_key_needs_its_passphrase(box):
    phrase = "key-phrase-secret-7"
    key = keygen(box.dir / "encrypted_key", passphrase=phrase)
    authorized = box.dir / "authorized_keys"
    authorized.write_text(authorized.read_text() + Path(f"{key}.pub").read_text())
    assert poll(switch(box, key_file=str(key), key_passphrase=phrase, lldp=False, config=False)).samples
    e, _ = failure(switch(box, key_file=str(key)))
    assert isinstance(e, CollectorConfigError) and f"key_file {key} is encrypted: give key_passphrase" in str(e)
    e, _ = failure(switch(box, key_file=str(key), key_passphrase="not-the-phrase"))
    assert isinstance(e, CollectorConfigError) and "cannot load the private key (wrong key_passphrase?)" in str(e)
    assert phrase not in str(e) and "not-the-phrase" not in str(e)


@needs_sshd
def test_nothing_listening_is_unreachable_at_once(box):
    e, took = failure(switch(box, port=PORT + 1))
    assert isinstance(e, CollectorUnreachable), e
    assert str(e) == f"sw-1: {box.address}:{PORT + 1}: Connection refused" and took < 1


def _silent_server():
    """Accepts TCP on loopback and never says anything."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(8)], daemon=True).start()
    return server, held


@needs_sshd
def test_a_server_that_never_speaks_ssh_times_out(box):
    server, held = _silent_server()
    try:
        port_ = server.getsockname()[1]
        # within the settings' timeout (no SSH banner) ...
        e, took = failure(switch(box, address="127.0.0.1", port=port_, timeout=1), deadline=5)
        assert isinstance(e, CollectorTimeout), e
        assert f"127.0.0.1:{port_}: no SSH banner within 1 s" in str(e) and 0.9 < took < 2
        # ... or at the poll's deadline when that comes first
        e, took = failure(switch(box, address="127.0.0.1", port=port_, timeout=30), deadline=1.5)
        assert isinstance(e, CollectorTimeout) and "deadline of 1.5 s" in str(e) and 1.4 < took < 2.5
    finally:
        server.close()
        for conn, _ in held:
            conn.close()


@needs_sshd
def test_an_unknown_host_is_refused_naming_the_fingerprint(box):
    other = box.dir / "other_known_hosts"
    other.write_text(f"198.18.254.99 {(box.dir / 'id_ed25519.pub').read_text()}")  # another host's key
    e, took = failure(switch(box, known_hosts=str(other)))
    assert isinstance(e, CollectorAuthError), e
    assert (f"sw-1: {box.address}:{PORT}: host key ssh-ed25519 {box.host_fingerprint()} is not in known_hosts {other}: "
            "refused") in str(e) and took < 2
    missing = box.dir / "no_such_file"
    e, _ = failure(switch(box, known_hosts=str(missing)))
    assert isinstance(e, CollectorConfigError) and f"known_hosts {missing}: no such file" in str(e)


@needs_sshd
def test_a_changed_host_key_is_refused_and_verify_off_accepts_it(box, caplog):
    trusted = box.host_fingerprint()
    box.rekey()
    try:
        now = box.host_fingerprint()
        e, _ = failure(switch(box))
        assert isinstance(e, CollectorAuthError), e
        assert (f"sw-1: {box.address}:{PORT}: host key ssh-ed25519 {now} does not match known_hosts {box.known_hosts} "
                f"(which has ssh-ed25519 {trusted}): refused") in str(e)
        result = poll(switch(box, verify_host_key=False, known_hosts=None, lldp=False, config=False))
        assert result.samples
        assert (f"host key of [{box.address}]:{PORT} NOT verified (verify_host_key: false): ssh-ed25519 {now}"
                in caplog.text)
    finally:
        box.trust_host_key()
    assert poll(switch(box, lldp=False, config=False)).samples  # trusted again


@needs_sshd
def test_a_broken_session_is_logged_into_again(box):
    collector = CliCollector()
    dev = switch(box, lldp=False, config=False)

    async def run():
        try:
            await collector.collect(dev)
            first = collector._sessions.kept("sw-1")
            box.stop_sshd()  # the kept session dies with sshd
            box.start_sshd()
            result = await collector.collect(dev)
            return first, collector._sessions.kept("sw-1"), result
        finally:
            await collector.close()

    first, second, result = asyncio.run(run())
    assert second is first and result.samples  # the same session object, logged in again
    assert box.log("sshd").count("Accepted publickey for root") >= 2


@needs_sshd
def test_a_poll_cut_at_its_deadline_closes_its_session(box):
    """A command that hangs (sleep): the deadline cancels the poll; its session is closed, the next
    poll logs in again and works."""
    box.fake_command("/usr/sbin/lldpcli", script="sleep 4")  # outlives the poll: ssh does not stop it
    collector = CliCollector()
    dev = switch(box, config=False, timeout=20)

    async def run():
        try:
            with pytest.raises(CollectorTimeout, match="deadline of 1 s"):
                await collector.collect_with_deadline(dev, 1)
            hung = collector._sessions.kept("sw-1")
            for _ in range(50):
                if not hung.connected:
                    break
                await asyncio.sleep(0.05)
            box.restore_command("/usr/sbin/lldpcli")
            result = await collector.collect_with_deadline(dev, 10)
            return hung, collector._sessions.kept("sw-1"), result
        finally:
            await collector.close()

    hung, fresh, result = asyncio.run(run())
    assert hung.aborted and not hung.connected and fresh is not hung and result.samples


# --- configuration snapshots ----------------------------------------------------------------------------


def _configs(records):
    points = of(records, GenericPoint)
    return ([p for p in points if p.measurement == "device_config"],
            [p for p in points if p.measurement == "device_config_change"])


@needs_sshd
def test_a_config_change_gives_a_diff_and_the_points_round_trip_the_store(box, tmp_path):
    config = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "sw-1", "mgmt_address": box.address, "collectors": {"cli": {
            "username": "root", "key_file": str(box.client_key), "known_hosts": str(box.known_hosts),
            "port": PORT, "timeout": 3, "lldp": False, "config_interval": "10ms"}}}]}}))
    store = EmbeddedStore(tmp_path / "t.duckdb")
    seen = []
    poller = Poller(config, store, registry=None, collectors={"cli": CliCollector.from_config(config)},
                    on_records=seen.append)
    route = ["ip", "-n", box.ns, "route", "add", "blackhole", "203.0.113.0/24"]

    async def run():
        try:
            for step in range(3):
                if step == 2:
                    subprocess.run(route, check=True)
                await asyncio.sleep(0.02)
                [status] = await poller.poll_all()
                assert status.state == "ok", status.last_error
        finally:
            await poller.close()
            subprocess.run(["ip", "-n", box.ns, "route", "del", "blackhole", "203.0.113.0/24"], check=False)

    asyncio.run(run())
    snaps = [_configs(records) for records in seen]
    (first, no1), (second, no2), (third, [change]) = snaps
    assert not no1 and not no2
    assert [len(first), len(second), len(third)] == [1, 1, 1]
    first, second, third = first[0], second[0], third[0]
    # the first snapshot after a start compares with nothing; an unchanged switch keeps its hash
    assert (first.fields["changed"], second.fields["changed"], third.fields["changed"]) == (False, False, True)
    assert first.fields["sha256"] == second.fields["sha256"] != third.fields["sha256"]
    text = third.fields["text"]
    assert text.startswith("### addresses: ip -d address show\n") and "### routes: ip -4 route show table all\n" in text
    assert f"inet {box.address}/30 scope global mgmt0" in text and "valid_lft" not in text
    assert third.fields["lines"] == len(text.splitlines()) and third.fields["truncated"] is False
    assert change.fields["added"] == 1 and change.fields["removed"] == 0
    assert "\n+blackhole 203.0.113.0/24" in change.fields["diff"] and change.fields["diff_truncated"] is False
    assert change.fields["previous_sha256"] == second.fields["sha256"]
    assert change.fields["sha256"] == third.fields["sha256"] and change.tags == {"device": "sw-1"}
    # the store gives back what was written, with the declared types
    end = time.time_ns() + 1
    [stored] = store.query(Query(measurement="device_config", start=0, end=end))
    assert stored.tags == {"device": "sw-1"} and len(stored.values) == 3
    row = dict(zip(stored.columns, stored.values[-1]))
    assert {k: row[k] for k in third.fields} == third.fields
    [stored] = store.query(Query(measurement="device_config_change", start=0, end=end))
    row = dict(zip(stored.columns, stored.values[0]))
    assert {k: row[k] for k in change.fields} == change.fields
    store.close()


@needs_sshd
def test_snapshots_come_at_most_every_config_interval(box):
    collector = CliCollector()
    dev = switch(box, lldp=False)  # config_interval: 1 h

    async def run():
        try:
            return [await collector.collect(dev) for _ in range(2)]
        finally:
            await collector.close()

    first, second = asyncio.run(run())
    assert len(_configs(first.records)[0]) == 1 and _configs(second.records) == ([], [])


def test_long_configs_and_diffs_are_cut_at_a_line_end():
    tracker = ConfigTracker()
    big = "".join(f"line {i} {'x' * 60}\n" for i in range(2000))  # ~140 KB
    [first] = tracker.snapshot("sw-1", big, 1)
    assert first.fields["truncated"] is True and first.fields["lines"] == 2000 and first.fields["bytes"] == len(big)
    assert len(first.fields["text"].encode()) <= TEXT_MAX and first.fields["text"].endswith("\n")
    changed = big.replace("x" * 60, "y" * 60)
    snap, change = tracker.snapshot("sw-1", changed, 2)
    assert snap.fields["changed"] is True and (change.fields["added"], change.fields["removed"]) == (2000, 2000)
    assert change.fields["diff_truncated"] is True and len(change.fields["diff"].encode()) <= DIFF_MAX
    assert change.fields["diff"].startswith("--- sw-1 ")


# --- parsers on their own -----------------------------------------------------------------------------------


def test_lldpctl_json_shapes_one_neighbour_and_a_chassis_without_a_name():
    """lldpctl -f json writes one interface as an object, several as a list; a chassis without a
    system name is its body directly. A port id that is a MAC gives the port description."""
    one = {"lldp": {"interface": {"swp3": {"chassis": {"id": {"type": "mac", "value": "0c:42:a1:00:00:01"}},
                                           "port": {"id": {"type": "mac", "value": "0c:42:a1:00:00:02"},
                                                    "descr": "Ethernet12"}}}}}
    [n] = neighbors("sw-1", json.dumps(one), 1, lambda _: True, notes := [])
    assert (n.port, n.remote_name, n.remote_port, n.remote_chassis_id) == ("swp3", None, "Ethernet12",
                                                                           "0c:42:a1:00:00:01")
    assert neighbors("sw-1", '{"lldp": {}}', 1, lambda _: True, notes) == [] and notes == []
    with pytest.raises(Bad, match="no 'lldp' object"):
        neighbors("sw-1", "[]", 1, lambda _: True, notes)


def test_only_state_is_removed_from_configuration_text():
    ip = ("2: swp1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9216 qdisc noqueue master br0 state UP group default\n"
          "    link/ether 0c:42:a1:00:00:01 brd ff:ff:ff:ff:ff:ff promiscuity 1  allmulti 0 minmtu 68\n"
          "    bridge_slave state forwarding priority 32 hold_timer    0.00 message_age_timer    0.00\n"
          "    inet 10.0.0.1/31 scope global swp1\n       valid_lft forever preferred_lft forever\n"
          "    inet6 2001:db8::1/64 scope global dynamic tentative\n"
          "       valid_lft 2591998sec preferred_lft 604798sec\n")
    assert normalize(ip, "ip") == (
        "2: swp1: <BROADCAST,MULTICAST,UP> mtu 9216 qdisc noqueue master br0 group default\n"
        "    link/ether 0c:42:a1:00:00:01 brd ff:ff:ff:ff:ff:ff  minmtu 68\n"
        "    bridge_slave priority 32\n"
        "    inet 10.0.0.1/31 scope global swp1\n"
        "    inet6 2001:db8::1/64 scope global dynamic\n")
    assert normalize("default via 10.0.0.0 dev swp1 proto bgp metric 20 linkdown expires 298sec\n", "ip") == (
        "default via 10.0.0.0 dev swp1 proto bgp metric 20\n")
    assert normalize("10.0.0.0/31 dev swp3 proto kernel scope link src 10.0.0.1 dead \n", "ip") == (
        "10.0.0.0/31 dev swp3 proto kernel scope link src 10.0.0.1 \n")  # a carrier-less port's nexthop
    nft = "  ct state established,related counter packets 1234 bytes 99999 accept\n"
    assert normalize(nft, "nft") == "  ct state established,related counter accept\n"  # a rule's state match stays
    assert normalize("interface swp1\n  state up\n", None) == "interface swp1\n  state up\n"  # files as they are


def test_ip_link_items_without_what_is_needed_are_left_out():
    links = [{"ifname": "ok0", "operstate": "UP", "mtu": 9216, "stats64": {"rx": {"bytes": 2**64 - 1}, "tx": {}}},
             {"operstate": "UP"}, {"ifname": "nostats", "operstate": "DOWN"},
             {"ifname": "bad\\name", "operstate": "UP", "stats64": {"rx": {}}}]
    samples, total = port_samples("sw-1", json.dumps(links), 1, {}, lambda _: True, notes := [])
    assert [s.port for s in samples] == ["ok0"] and total == 4
    assert samples[0].in_octets == 2**64 - 1 and samples[0].out_octets is None and samples[0].mtu == 9216
    assert notes[0] == "item 1: no 'ifname'" and notes[1].startswith("nostats: no 'stats64'")
    assert notes[2].startswith("'bad\\\\name': port:")
    with pytest.raises(Bad, match="not JSON"):
        port_samples("sw-1", "Option \"-j\" is unknown", 1, {}, lambda _: True, [])


def test_ip_address_items_give_ipv4_addresses_and_bad_ones_are_left_out():
    links = [{"ifname": "swp1", "addr_info": [{"family": "inet", "local": "10.0.0.1", "prefixlen": 31},
                                              {"family": "inet6", "local": "2001:db8::1", "prefixlen": 64}]},
             {"ifname": "swp2", "addr_info": [{"family": "inet", "local": "10.0.0.3", "prefixlen": 99}]},
             {"ifname": "swp3", "addr_info": [{"family": "inet", "local": "10.0.0.256", "prefixlen": 31}]},
             {"ifname": "mgmt0", "addr_info": [{"family": "inet", "local": "192.0.2.5", "prefixlen": 24}]},
             {"addr_info": [{"family": "inet", "local": "10.9.9.9", "prefixlen": 32}]}]
    found = addresses("sw-1", json.dumps(links), 7, lambda name: name.startswith("swp"), notes := [])
    assert [(a.port, a.address, a.prefix_len, a.ts) for a in found] == [("swp1", "10.0.0.1", 31, 7)]
    assert notes == ["'swp2' '10.0.0.3': prefixlen 99 is not 0..32",
                     "'swp3' '10.0.0.256': Octet 256 (> 255) not permitted in '10.0.0.256'"]
    with pytest.raises(Bad, match="JSON list"):
        addresses("sw-1", "{}", 1, lambda _: True, [])


def test_with_a_cli_and_snmp_on_one_switch_the_cli_gives_link_state(tmp_path):
    """Two polled collectors with different freshness (snmpd answers ifOperStatus from a cache):
    link state from the one of lower rank while it works, rates from both; SNMP's word counts again
    when the CLI fails."""
    from collectors.base import PollResult

    cfg = parse_config(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "sw", "mgmt_address": "127.0.0.1", "collectors": {
            "snmp": {"community": "c"}, "cli": {"username": "u", "password": "p", "verify_host_key": False}}}]}}))
    poller = Poller(cfg, EmbeddedStore(tmp_path / "t.duckdb"), registry=None)
    t0 = time.time_ns()

    def result(collector: str, dt: float, status: str, octets: int) -> PollResult:
        s = PortSample(device="sw", port="swp1", ts=t0 + int(dt * 1e9), oper_status=status, in_octets=octets,
                       out_octets=octets)
        return PollResult(device="sw", collector=collector, started_ns=s.ts, records=[s])

    async def run():
        for name in ("cli", "snmp"):
            poller.status[(name, "sw")].state = "ok"
        events = []
        for collector, dt, status, octets in [("cli", 0, "up", 1000), ("snmp", 0.5, "up", 1000),
                                              ("cli", 1, "down", 1000), ("snmp", 1.5, "up", 2000),
                                              ("cli", 2, "down", 1000), ("snmp", 2.5, "up", 3000)]:
            before = len(poller.recent.events)
            await poller.ingest(result(collector, dt, status, octets))
            events += [(collector, e.state) for e in list(poller.recent.events)[before:]]
        assert events == [("cli", "down")]
        assert poller.recent.rates[("sw", "swp1")].in_bps == 1000 * 8 / 1.0  # SNMP's rates still count
        poller.status[("cli", "sw")].state = "error"
        await poller.ingest(result("snmp", 3.5, "up", 4000))
        assert [e.state for e in poller.recent.events][-1] == "up"
        await poller.close()

    asyncio.run(run())


# --- settings and the command line ---------------------------------------------------------------------


def test_settings_errors_name_the_field_and_secrets_stay_hidden(tmp_path, monkeypatch):
    def error(**cli) -> str:
        doc = {"fabric": {"switches": [{"name": "sw-1", "mgmt_address": "192.0.2.1", "collectors": {"cli": cli}}]}}
        with pytest.raises(ConfigError) as info:
            parse_config(yaml.safe_dump(doc))
        return str(info.value)

    assert "collectors.cli: Value error, give a password or a key_file" in error(username="u", known_hosts="/k")
    assert "known_hosts is required" in error(username="u", password="p")
    assert "key_passphrase needs key_file" in error(username="u", password="p", known_hosts="/k",
                                                    key_passphrase="s3cret-phrase")
    assert "collectors.cli.platform: Value error, no command set for platform 'juniper_junos'" in error(
        username="u", password="p", known_hosts="/k", platform="juniper_junos")
    assert "collectors.cli.username" in error(password="p", known_hosts="/k")
    CliSettings(username="u", password="p", known_hosts="/k", platform="cisco_ios")  # napalm is installed here
    find_spec = importlib.util.find_spec  # where it is not, config check says what to install
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "napalm" else find_spec(name, *a))
    assert "platform 'cisco_ios' reads through napalm, which is not installed (pip install 'fabric-nms[cli]')" \
        in error(username="u", password="p", known_hosts="/k", platform="cisco_ios")
    monkeypatch.undo()
    assert "collectors.cli.timeout" in error(username="u", password="p", known_hosts="/k", timeout="soon")
    settings = CliSettings(username="u", password="pw-secret-1", key_file="/k", key_passphrase="phrase-secret-2",
                           verify_host_key=False)
    assert "pw-secret-1" not in repr(settings) and "phrase-secret-2" not in repr(settings)
    assert (settings.port, settings.interval, settings.config_interval, settings.timeout) == (22, 60, 3600, 10)


@needs_sshd
def test_nms_collect_cli_once_prints_the_ports_and_what_was_left_out(box, tmp_path):
    config = tmp_path / "nms.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "sw-1", "mgmt_address": box.address, "collectors": {"cli": {
            "username": USER, "password": PASSWORD, "known_hosts": str(box.known_hosts), "port": PORT}}}]}}))
    proc = subprocess.run([sys.executable, "-m", "nms", "collect", "cli", "--once", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    for name in ("lo", "swp1", "down0"):
        assert any("sw-1" in line and f" {name} " in line for line in lines), proc.stdout
    notes = " ".join(proc.stdout.split("left out of the last poll (the rest was kept):")[1].split())
    assert "sw-1 (cli): lldpctl -f json: exit status 127 (not installed, or not allowed for this user)" in notes
    assert "LLDP neighbours left out" in notes
    assert re.search(r"│ sw-1\s*│ ok\s*│[^│]*│[^│]*│\s*[1-9]\d*\s*│", proc.stdout), proc.stdout  # the count: left out
    assert "1/1 devices ok" in proc.stderr and PASSWORD not in proc.stdout + proc.stderr


# --- vendor platforms: their command sets over the same SSH path ------------------------------------

VENDOR_OUTPUTS = {  # command (without `| json`) -> fixture, as the switch's CLI prints it
    "arista_eos": {"show interfaces": "eos/show_interfaces.json", "show version": "eos/show_version.json",
                   "show hostname": "eos/show_hostname.json",
                   "show ip interface": "eos/show_ip_interface.json",
                   "show lldp neighbors detail": "eos/show_lldp_neighbors_detail.json",
                   "show running-config": "eos/show_running_config.txt"},
    "cisco_nxos": {"show interface": "nxos/show_interface.json", "show version": "nxos/show_version.json",
                   "show ip interface vrf all": "nxos/show_ip_interface_vrf_all.json",
                   "show lldp neighbors detail": "nxos/show_lldp_neighbors_detail.json",
                   "show running-config": "nxos/show_running_config.txt"},
    # napalm's public captures of real IOS devices (tests/test_cli_napalm_cases.py says where from)
    "cisco_ios": {"show version": "napalm/ios/test_get_facts/normal/show_version.txt",
                  "show hosts": "napalm/ios/test_get_facts/normal/show_hosts.txt",
                  "show ip interface brief": "napalm/ios/test_get_facts/normal/show_ip_interface_brief.txt",
                  "show interfaces": "napalm/ios/test_get_interfaces_counters/normal/show_interfaces.txt",
                  "show interface summary": "napalm/ios/test_get_interfaces_counters/normal/show_interface_summary.txt",
                  "show lldp neighbors": "napalm/ios/test_get_lldp_neighbors_detail/normal/show_lldp_neighbors.txt",
                  "show lldp neighbors detail":
                      "napalm/ios/test_get_lldp_neighbors_detail/normal/show_lldp_neighbors_detail.txt",
                  "show ip interface": "napalm/ios/test_get_interfaces_ip/normal/show_ip_interface.txt",
                  "show ipv6 interface": "napalm/ios/test_get_interfaces_ip/normal/show_ipv6_interface.txt",
                  "show running-config": "napalm/ios/test_get_config/normal/show_running_config.txt"},
}


def vendor_cli(box: SshBox, platform: str, hang: str | None = None) -> None:
    """`show` (printing the fixture of its arguments), `json` (a pass-through) and `terminal` (EOS's
    replies to netmiko's session preparation) on a tmpfs over the switch's /usr/local/bin: its own
    mount namespace, nothing of the machine's changes."""
    fixtures = Path(__file__).parent / "fixtures"
    cases = "".join(f'  "{cmd.removeprefix("show ")}") cat {fixtures / f} ;;\n'
                    for cmd, f in VENDOR_OUTPUTS[platform].items())
    box.run("mount", "-t", "tmpfs", "nms-vendor-cli", "/usr/local/bin")
    if hang:  # this one never answers
        cases = f'  "{hang.removeprefix("show ")}") sleep 30 ;;\n' + cases
    show = f'#!/bin/sh\ncase "$*" in\n{cases}  *) echo "% Invalid input" >&2; exit 1 ;;\nesac\n'
    terminal = ('#!/bin/sh\ncase "$1" in width) echo "Width set to $2 columns." ;; '
                'length) echo "Pagination disabled." ;; esac\n')
    box.run("sh", "-c", f"printf '%s' '{show}' > /usr/local/bin/show; printf '#!/bin/sh\\nexec cat\\n' "
                        f"> /usr/local/bin/json; printf '%s' '{terminal}' > /usr/local/bin/terminal; "
                        "chmod 755 /usr/local/bin/show /usr/local/bin/json /usr/local/bin/terminal")
    # the interactive shell that napalm's getters read (netmiko's send_command): bash without its
    # bracketed-paste escape (ESC[?2004l), which no switch prints, over /etc/inputrc in this namespace
    box.run("sh", "-c", "echo 'set enable-bracketed-paste off' > /usr/local/bin/inputrc")
    box.run("mount", "--bind", "/usr/local/bin/inputrc", "/etc/inputrc")


def vendor_cli_gone(box: SshBox) -> None:
    box.run("umount", "--lazy", "/etc/inputrc")
    box.run("umount", "--lazy", "/usr/local/bin")


@needs_sshd
@pytest.mark.parametrize("platform,ports,neighbour", [
    ("arista_eos", {"Ethernet1/1", "Ethernet2/1", "Management1", "Vlan100"}, ("Ethernet1/1", "spine1", "Ethernet3/1")),
    ("cisco_nxos", {"Ethernet1/1", "Ethernet1/2", "mgmt0", "loopback0"}, ("Ethernet1/1", "leaf1", "Ethernet3/1")),
])
def test_a_vendor_platform_is_polled_through_its_own_commands(box, platform, ports, neighbour):
    """No EOS or NX-OS device runs here: the box's sshd answers the platform's commands with
    outputs in the vendor's JSON shapes (tests/fixtures/). What runs for real: login, host key
    check, exec channels, the platform's command set and parsers, the poll's records."""
    vendor_cli(box, platform)
    try:
        collector = CliCollector()
        result = poll(switch(box, platform=platform, config=True), collector)
        assert {s.port for s in result.samples} == ports
        [facts] = of(result.records, DeviceFacts)
        assert facts.interfaces == 4 and facts.sys_descr.startswith(("Arista", "Cisco"))
        assert facts.sys_name == {"arista_eos": "leaf1", "cisco_nxos": "spine1"}[platform]
        assert (neighbour[1], neighbour[2]) in {(n.remote_name, n.remote_port)
                                                for n in of(result.records, LldpNeighbor) if n.port == neighbour[0]}
        assert ("Ethernet1/1", 31) in {(a.port, a.prefix_len) for a in of(result.records, InterfaceAddress)}
        [config] = [p for p in result.records if getattr(p, "measurement", None) == "device_config"]
        text = config.fields["text"]
        assert "### running-config: show running-config" in text and "hostname" in text
        assert "!Time" not in text and "! Command" not in text
        # what the fixtures leave out on purpose (an interface without counters, a bad address) is noted
        assert result.problems and all("left out" in str(e) for e in result.problems), result.problems
    finally:
        vendor_cli_gone(box)


@needs_sshd
def test_ios_is_read_through_napalms_getters_on_the_checked_session(box, caplog):
    """`cisco_ios`: our login (host key checked against known_hosts), then napalm's IOS getters
    (napalm 5.2.0) over netmiko's interactive shell on that session; the box's sshd answers the
    commands with napalm's captures of real IOS devices."""
    vendor_cli(box, "cisco_ios")
    try:
        collector = CliCollector()
        result = poll(switch(box, platform="cisco_ios", config=True), collector)
        assert result.problems == []
        [facts] = of(result.records, DeviceFacts)
        assert result.records[0] is facts
        assert (facts.sys_name, facts.interfaces, facts.uptime_ticks) == ("NS2903-ASW-01", 13, 16676160 * 100)
        assert facts.sys_descr.startswith("Cisco IOS WS-C2960G-8TC-L C2960 Software")
        g1 = port(result, "GigabitEthernet1")
        assert (g1.oper_status, g1.speed_bps, g1.mtu, g1.in_octets, g1.out_octets) == ("up", 10**9, 1500, 25963, 26812)
        assert (g1.in_pkts, g1.out_pkts) == (297, 160)  # napalm's -1 (not shown) broadcast/multicast: left out
        [n] = of(result.records, LldpNeighbor)
        assert (n.port, n.remote_name, n.remote_port, n.remote_chassis_id) == (
            "FastEthernet4", "twb-sf-hpsw1", "15", "00:18:fe:1e:b0:20")
        assert sorted((a.port, a.address, a.prefix_len) for a in of(result.records, InterfaceAddress)) == [
            ("Vlan20", "172.29.50.3", 27), ("Vlan41", "172.29.52.34", 27), ("Vlan41", "192.168.81.34", 24)]
        [config] = [p for p in result.records if getattr(p, "measurement", None) == "device_config"]
        assert "hostname CSR1" in config.fields["text"] and "Building configuration" not in config.fields["text"]
    finally:
        vendor_cli_gone(box)
    other = box.dir / "ios_known_hosts"  # a known_hosts without the box's key: the same check as every platform
    other.write_text("")
    e, _ = failure(switch(box, platform="cisco_ios", known_hosts=str(other)))
    assert isinstance(e, CollectorAuthError) and f"is not in known_hosts {other}: refused" in str(e)


@needs_sshd
def test_a_napalm_getter_cut_at_the_deadline_ends_with_its_session(box):
    """napalm's getter blocks in netmiko's read of the shell: the deadline closes the session, which
    ends that read; with one worker thread, the next poll runs only once it has."""
    vendor_cli(box, "cisco_ios", hang="show lldp neighbors")
    collector = CliCollector(max_concurrency=1)
    dev = switch(box, platform="cisco_ios", config=False, timeout=20)

    async def run():
        try:
            with pytest.raises(CollectorTimeout, match="deadline of 3 s"):
                await collector.collect_with_deadline(dev, 3)
            hung = collector._sessions.kept("sw-1")
            vendor_cli_gone(box)
            vendor_cli(box, "cisco_ios")
            result = await collector.collect_with_deadline(dev, 15)
            return hung, collector._sessions.kept("sw-1"), result
        finally:
            await collector.close()

    try:
        hung, fresh, result = asyncio.run(run())
    finally:
        vendor_cli_gone(box)
    assert hung.aborted and not hung.connected and fresh is not hung
    assert {"GigabitEthernet1", "GigabitEthernet2"} <= {s.port for s in result.samples}
