"""The SNMP collector and scheduled polling against a real net-snmp snmpd (root namespace IF-MIB)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _snmpd import (
    COMMUNITY,
    COMMUNITY_NO_ADDRESSES,
    COMMUNITY_NO_IFXTABLE,
    COMMUNITY_NO_IPADDRTABLE,
    IF_SPEED_LO,
    SKIP_REASON,
    V3_USERS,
    Snmpd,
    available,
    kernel_ipv4,
    kernel_stats,
)

from collectors.base import CollectorAuthError, CollectorTimeout
from collectors.snmp.collector import SnmpCollector
from nms.app.polling import Poller
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint, InterfaceAddress, LinkEvent, PortRates, PortSample

pytestmark = [pytest.mark.snmpd, pytest.mark.skipif(not available(), reason=SKIP_REASON)]
REPO = Path(__file__).resolve().parents[1]
SNMPD_CACHE_S = 3.5  # snmpd serves IF-MIB from a cache refreshed at most every ~3 s


def switch(name: str, snmp: dict, address: str = "127.0.0.1") -> SwitchConfig:
    return SwitchConfig(name=name, mgmt_address=address, collectors={"snmp": snmp})


def blast_loopback(packets: int = 3000, size: int = 1200) -> None:
    """Real traffic on lo so that its counters move by a known amount between two reads."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        for _ in range(packets):
            tx.sendto(b"x" * size, rx.getsockname())
            try:
                rx.recv(2048)
            except BlockingIOError:
                pass


async def poll(collector: SnmpCollector, device: SwitchConfig):
    try:
        return await collector.collect_with_deadline(device)
    finally:
        await collector.close()


def test_polled_counters_match_the_kernel(snmpd):
    """Every counter of `lo` lies between the kernel's value read before snmpd's cache could have
    been filled and the value read after the poll (counters only grow)."""
    blast_loopback()
    before = kernel_stats("lo")
    time.sleep(SNMPD_CACHE_S)
    result = asyncio.run(poll(SnmpCollector(), switch("root", snmpd.settings(interfaces=["lo"]))))
    after = kernel_stats("lo")
    (lo,) = result.samples
    assert lo.port == "lo" and lo.oper_status in ("up", "unknown") and lo.mtu == 65536
    pairs = {"in_octets": "rx_bytes", "out_octets": "tx_bytes", "in_pkts": "rx_packets", "out_pkts": "tx_packets",
             "in_errors": "rx_errors", "out_errors": "tx_errors", "in_discards": "rx_dropped"}
    for ours, kernel in pairs.items():
        assert before[kernel] <= getattr(lo, ours) <= after[kernel], (ours, before[kernel], getattr(lo, ours),
                                                                      after[kernel])
    assert after["rx_bytes"] - before["rx_bytes"] < 50_000_000  # the bracket is tight enough to mean something
    assert lo.uptime_ticks > 0 and lo.ts >= result.started_ns
    facts = result.facts
    assert facts.sys_name == "nms-test-snmpd" and facts.sys_object_id.startswith("1.3.6.1.4.1.8072")
    assert facts.interfaces > 1


def test_every_interface_is_reported_with_its_kernel_name_and_mtu(snmpd):
    result = asyncio.run(poll(SnmpCollector(), switch("root", snmpd.settings())))
    names = {s.port: s for s in result.samples}
    for ifname in ("lo", *(n for n in os.listdir("/sys/class/net") if n.startswith("eth"))):
        assert ifname in names
        mtu = int(Path(f"/sys/class/net/{ifname}/mtu").read_text())
        assert names[ifname].mtu == mtu
    assert all(isinstance(r, (PortSample, DeviceFacts, InterfaceAddress)) for r in result.records)
    assert result.values >= 15 * len(result.samples)  # every column came back for every interface


@pytest.mark.parametrize("user", sorted(V3_USERS))
def test_v3_with_each_protocol_pair(snmpd, user):  # authPriv, and one authNoPriv user
    v3 = asyncio.run(poll(SnmpCollector(), switch("v3dev", snmpd.settings(user, interfaces=["lo"]))))
    (lo,) = v3.samples
    assert lo.port == "lo" and lo.in_octets > 0 and v3.facts.sys_name == "nms-test-snmpd"


def test_wrong_credentials_give_a_clear_per_device_error_without_secrets(snmpd):
    async def run():
        collector = SnmpCollector()
        devices = {
            "good": switch("good", snmpd.settings("nmssha", interfaces=["lo"])),
            "badkey": switch("badkey", snmpd.settings("nmssha", auth_key="not-the-key-1", interfaces=["lo"])),
            "nouser": switch("nouser", {**snmpd.settings("nmssha", interfaces=["lo"]), "user": "ghost"}),
            "badcomm": switch("badcomm", snmpd.settings(community="wrong-community", timeout=0.5, retries=0)),
        }
        try:
            results = await asyncio.gather(*(collector.collect_with_deadline(d) for d in devices.values()),
                                           return_exceptions=True)
        finally:
            await collector.close()
        return dict(zip(devices, results))

    res = asyncio.run(run())
    assert res["good"].samples[0].port == "lo"  # same user name, right key: unaffected by the bad one
    assert isinstance(res["badkey"], CollectorAuthError) and res["badkey"].kind == "auth"
    assert "badkey" in str(res["badkey"]) and "wrong authentication key" in str(res["badkey"])
    assert isinstance(res["nouser"], CollectorAuthError) and "no such user" in str(res["nouser"])
    assert isinstance(res["badcomm"], CollectorTimeout) and "wrong community" in str(res["badcomm"])
    for err in (res["badkey"], res["nouser"], res["badcomm"]):
        text = str(err)
        assert "not-the-key-1" not in text and "wrong-community" not in text and "auth-key-sha" not in text


def test_unreachable_device_times_out_while_the_others_finish_on_time(snmpd, tmp_path):
    # a UDP socket that reads requests and never answers: a hung agent
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens: ICMP port unreachable
    config = _config(tmp_path, [
        switch("ok-v2c", snmpd.settings(interfaces=["lo"])),
        switch("ok-v3", snmpd.settings("nmssha256", interfaces=["lo"])),
        switch("hung", {"community": "x", "port": sink.getsockname()[1], "timeout": 5.0, "retries": 3,
                        "deadline": 1.5}),
        switch("closed", {"community": "x", "port": closed_port, "timeout": 1.0, "retries": 1}),
    ])

    async def run():
        poller = Poller(config, _ListStore(), registry=None)
        started = time.time_ns()
        try:
            await poller.poll_all()
        finally:
            await poller.close()
        return started, {d.device: d for d in poller.devices()}

    try:
        started, status = asyncio.run(run())
    finally:
        sink.close()
    for name in ("ok-v2c", "ok-v3"):
        assert status[name].state == "ok"
        assert (status[name].last_success_ns - started) / 1e9 < 1.4, "good devices waited for the bad ones"
    assert status["hung"].last_error_kind == "timeout" and "deadline of 1.5 s" in status["hung"].last_error
    assert 1.4 <= status["hung"].last_duration_s < 2.5
    assert status["closed"].last_error_kind == "timeout" and "2 tries of 1 s" in status["closed"].last_error


def test_scheduled_polling_isolates_a_failing_device_and_backs_off(snmpd, tmp_path):
    from nms.app.service import Service

    config = _config(tmp_path, [
        switch("good", snmpd.settings(interval=1.0, interfaces=["lo"])),
        switch("bad", snmpd.settings("nmssha", auth_key="wrong-key-123", interval=1.0, interfaces=["lo"])),
    ])

    async def run():
        service = Service(config, store=_ListStore())
        await service.start()
        await asyncio.sleep(5.6)
        await service.stop()
        return {d.device: d for d in service.poller.devices()}, service

    status, service = asyncio.run(run())
    good, bad = status["good"], status["bad"]
    assert good.state == "ok" and good.polls >= 5 and good.failures == 0
    assert bad.state == "backoff" and bad.last_error_kind == "auth"
    # backoff 1, 2, 4 s: at most 3 attempts in ~5.6 s, where the good device polled every second
    assert 2 <= bad.polls <= 3 and bad.consecutive_failures == bad.polls
    rates = [p for p in service.store.points if p.measurement == "port_rates"]
    # snmpd refreshes IF-MIB every few seconds: polls in between are held, not rates of 0 (nms/counters.py)
    assert len(rates) >= 1 and all(p.tags == {"device": "good", "port": "lo"} for p in rates)
    # lo carries the polls: a rate over a refresh is > 0; a 0 only once the hold (5 s) ran out (a
    # loaded machine's snmpd once went that long without refreshing: the full suite saw it)
    seen = [(p.fields["in_bps"], p.fields["interval_s"]) for p in rates]
    assert any(bps > 0 for bps, _ in seen) and all(bps > 0 or interval >= 5.0 for bps, interval in seen), seen


def test_extra_objects_numeric_and_by_mib_name(snmpd, tmp_path):
    pytest.importorskip("pysmi", reason="MIB names need pysmi (pip install 'fabric-nms[mibs]')")
    mibs = tmp_path / "mibs"
    mibs.mkdir()
    _write_test_mibs(mibs)
    settings = snmpd.settings(interfaces=["lo"], extra_oids=[
        "1.3.6.1.2.1.1.5.0",                      # sysName: GET
        "1.3.6.1.2.1.2.1.0",                      # ifNumber: a number
        "1.3.6.1.2.1.1.9.1.3",                    # sysORDescr column: walked
        "NMS-TEST-MIB::nmsTestContact.0",         # sysContact by a name from a MIB in mibs/
        "NMS-TEST-MIB::nmsTestIfNames",           # ifName column by name
    ])
    result = asyncio.run(poll(SnmpCollector(mib_dirs=[str(mibs)]), switch("root", settings)))
    extras = [r for r in result.records if isinstance(r, GenericPoint)]
    by_object: dict[str, list[GenericPoint]] = {}
    for p in extras:
        by_object.setdefault(p.tags["object"], []).append(p)
    assert [p.fields for p in by_object["1.3.6.1.2.1.1.5.0"]] == [{"text": "nms-test-snmpd"}]
    (if_number,) = by_object["1.3.6.1.2.1.2.1.0"]
    # an integer field (interfaces come and go in the root namespace: no exact count)
    assert type(if_number.fields["value"]) is int and if_number.fields["value"] >= 1
    assert if_number.tags["index"] == "0"
    assert len(by_object["1.3.6.1.2.1.1.9.1.3"]) >= 5 and all(p.tags["device"] == "root" for p in extras)
    assert len(by_object["NMS-TEST-MIB::nmsTestContact.0"]) == 1
    if_names = {p.fields["text"] for p in by_object["NMS-TEST-MIB::nmsTestIfNames"]}
    assert "lo" in if_names
    from collectors.base import CollectorConfigError

    bad = snmpd.settings(extra_oids=["NMS-TEST-MIB::noSuchThing"])
    with pytest.raises(CollectorConfigError, match="defines no object 'noSuchThing'"):
        asyncio.run(poll(SnmpCollector(mib_dirs=[str(mibs)]), switch("root", bad)))


def test_an_extra_object_the_agent_lacks_is_a_problem_and_the_rest_is_kept(snmpd):
    """snmpd answers noSuchObject for an OID in the system group it does not have: the poll is ok,
    its problems name the object; what the agent has is read as usual."""
    missing = "1.3.6.1.2.1.1.99.0"
    settings = snmpd.settings(interfaces=["lo"], extra_oids=["1.3.6.1.2.1.1.5.0", missing])
    result = asyncio.run(poll(SnmpCollector(), switch("root", settings)))
    assert [p.tags["object"] for p in result.records if isinstance(p, GenericPoint)] == ["1.3.6.1.2.1.1.5.0"]
    assert [s.port for s in result.samples] == ["lo"] and result.facts.sys_name == "nms-test-snmpd"
    [problem] = result.problems
    assert (problem.what, problem.kind) == (f"extra object {missing}", "bad_response")
    assert "no such object" in problem.reason and snmpd.settings()["community"] not in str(problem)


def test_interface_addresses_come_back_with_their_port_and_prefix_length(snmpd):
    """IP-MIB ipAddrTable, read from the kernel by snmpd: every address of the machine's eth*
    interfaces with the kernel's interface name and prefix length; loopback left out; addresses of
    every interface although the counters are filtered to `lo`."""
    before = kernel_ipv4()
    result = asyncio.run(poll(SnmpCollector(), switch("root", snmpd.settings(interfaces=["lo"]))))
    after = kernel_ipv4()
    assert [s.port for s in result.samples] == ["lo"] and result.addresses_walked
    got = {a.address: a for a in result.addresses}
    assert len(got) == len(result.addresses)  # one record per address
    assert not any(a.startswith("127.") for a in got) and "127.0.0.1" in before
    for a in got.values():
        assert a.device == "root" and a.ts >= result.started_ns and a.prefix_len is not None
        assert 0 <= a.prefix_len <= 32 and a.port  # other engineers' lab interfaces come and go: no exact set
        if a.port == "lo" or a.port.startswith("eth"):
            assert before.get(a.address) == (a.port, a.prefix_len) or after.get(a.address) == (a.port, a.prefix_len)
    # the machine's own interfaces do not change under the test
    stable = {addr: v for addr, v in before.items()
              if after.get(addr) == v and v[0].startswith("eth") and not addr.startswith("127.")}
    if not stable:
        pytest.skip("no IPv4 address on an eth* interface to compare with")
    for address, (ifname, prefix_len) in stable.items():
        assert (got[address].port, got[address].prefix_len) == (ifname, prefix_len)
    # the record is storable as is
    point = got[next(iter(stable))].to_point()
    assert point.measurement == "interface_address" and set(point.tags) == {"device", "port", "address"}
    assert point.fields == {"prefix_len": stable[next(iter(stable))][1]}


def test_addresses_are_walked_on_the_first_poll_then_every_refresh_or_after_a_reboot(snmpd):
    device = switch("root", snmpd.settings(interfaces=["lo"]))

    async def run(collector: SnmpCollector, polls: int, before_each=lambda c: None):
        out = []
        try:
            for _ in range(polls):
                before_each(collector)
                out.append(await collector.collect_with_deadline(device))
        finally:
            await collector.close()
        return out

    first, second, third = asyncio.run(run(SnmpCollector(), 3))
    assert first.addresses_walked and not second.addresses_walked and not third.addresses_walked
    assert not second.addresses and second.samples and second.facts  # the rest of the poll is unchanged
    assert second.values < first.values
    # sysUpTime went back (the switch rebooted; ifIndexes may have moved): walked again at once
    rebooted = asyncio.run(run(SnmpCollector(), 2, lambda c: c._uptimes.update(root=2**31)))
    assert [r.addresses_walked for r in rebooted] == [True, True]
    every = asyncio.run(run(SnmpCollector(address_refresh_s=0), 2))
    assert [r.addresses_walked for r in every] == [True, True]
    assert {a.address for a in every[1].addresses} == {a.address for a in first.addresses}


def test_address_fallback_table_and_a_device_without_addresses(snmpd, tmp_path):
    """snmpd seen through views: ipAddrTable hidden -> the same addresses from ipAddressTable; both
    hidden -> no address records, the poll is still fine. Through the poller, into the embedded
    store, the recent window and the on_records hook."""
    from nms.store.embedded import EmbeddedStore

    config = _config(tmp_path, [
        switch("full", snmpd.settings(interfaces=["lo"])),
        switch("newtable", snmpd.settings(community=COMMUNITY_NO_IPADDRTABLE, interfaces=["lo"])),
        switch("noaddr", snmpd.settings(community=COMMUNITY_NO_ADDRESSES, interfaces=["lo"])),
    ], unchanged_hold=0)  # polls 0.3 s apart inside snmpd's counter cache: every poll a rate
    store = EmbeddedStore(tmp_path / "telemetry.duckdb")
    batches: list[list] = []

    def broken_hook(records):
        raise RuntimeError("a consumer bug")

    async def run():
        poller = Poller(config, store, registry=None, on_records=batches.append)
        try:
            await poller.poll_all()
            first = {d: list(a) for d, a in poller.recent.addresses.items()}
            await asyncio.sleep(0.3)  # long enough for a rate interval
            await poller.poll_all()
            poller.on_records = broken_hook
            await poller.poll_all()
        finally:
            await poller.close()
        return poller, first

    try:
        poller, first = asyncio.run(run())
        status = {d.device: d for d in poller.devices()}
        assert all(st.state == "ok" and st.polls == 3 and st.failures == 0 for st in status.values()), status
        full = {(a.address, a.port, a.prefix_len) for a in first["full"]}
        assert full and {(a.address, a.port, a.prefix_len) for a in first["newtable"]} == full
        assert first["noaddr"] == [] and poller.recent.addresses["noaddr"] == []
        # later polls did not walk the addresses: the recent window keeps the first set
        assert [a.address for a in poller.recent.addresses["full"]] == [a.address for a in first["full"]]
        # the hook saw every successful poll (the broken one was logged): records + derived
        assert len(batches) == 6 and {b[0].device for b in batches} == {"full", "newtable", "noaddr"}
        with_addresses = [b for b in batches if any(isinstance(r, InterfaceAddress) for r in b)]
        assert {b[0].device for b in with_addresses} == {"full", "newtable"} and len(with_addresses) == 2
        assert all(any(isinstance(r, PortRates) for r in b) for b in batches[3:])
        assert all(isinstance(r, (PortSample, DeviceFacts, InterfaceAddress, PortRates, LinkEvent))
                   for b in batches for r in b)
        stored = store.latest("interface_address")
        assert {(s.tags["device"], s.tags["address"], s.tags["port"], s.values[0][1]) for s in stored} == \
            {(d, *a) for d in ("full", "newtable") for a in full}
        assert store.latest("port_rates", {"device": ["noaddr"]})  # the third poll was stored too
    finally:
        store.close()


def test_address_table_parsers_on_snmpd_values():
    """The two IP-MIB tables as pysnmp values (shapes captured from net-snmp 5.9 on this machine):
    netmasks to prefix lengths (non-contiguous: unknown), ipAddressTable's broadcast rows and IPv6
    rows skipped, the prefix length read from the ipAddressPrefix row pointer."""
    from pysnmp.proto.rfc1902 import Integer32, IpAddress, ObjectName

    from collectors.snmp.collector import IP_ADDR, IP_ADDRESS, _ip_addr_table, _ip_address_table, _prefix_len
    from collectors.snmp.transport import oid

    assert [_prefix_len(IpAddress(m)) for m in ("255.255.255.0", "255.0.0.0", "255.255.255.255", "0.0.0.0",
                                                "255.0.255.0")] == [24, 8, 32, 0, None]
    assert _prefix_len(None) is None
    v4 = {oid(f"{IP_ADDR}.2"): {(127, 0, 0, 1): Integer32(1), (192, 0, 2, 2): Integer32(4)},
          oid(f"{IP_ADDR}.3"): {(127, 0, 0, 1): IpAddress("255.0.0.0"), (192, 0, 2, 2): IpAddress("255.255.255.0")}}
    assert sorted(_ip_addr_table(v4)) == [("127.0.0.1", 1, 8), ("192.0.2.2", 4, 24)]
    v6 = (2, 16, 253, *[0] * 14, 2)
    table = {
        oid(f"{IP_ADDRESS}.3"): {(1, 4, 192, 0, 2, 2): Integer32(4), (1, 4, 192, 0, 2, 255): Integer32(4),
                                 v6: Integer32(4), (1, 4, 10, 0, 0, 1): Integer32(7)},
        oid(f"{IP_ADDRESS}.4"): {(1, 4, 192, 0, 2, 2): Integer32(1), (1, 4, 192, 0, 2, 255): Integer32(3),
                                 v6: Integer32(1), (1, 4, 10, 0, 0, 1): Integer32(1)},
        oid(f"{IP_ADDRESS}.5"): {(1, 4, 192, 0, 2, 2): ObjectName("1.3.6.1.2.1.4.32.1.5.4.1.4.192.0.2.0.24"),
                                 (1, 4, 10, 0, 0, 1): ObjectName("0.0")},
    }
    assert sorted(_ip_address_table(table)) == [("10.0.0.1", 7, None), ("192.0.2.2", 4, 24)]


def test_device_without_ifxtable_reads_the_iftable(snmpd):
    """ifXTable hidden by snmpd's view: the ifTable's 32-bit counters, ifSpeed and ifDescr instead,
    marked 32-bit; the same agent through the full view for comparison. The second poll reads both
    tables in its one interface walk and gives the same."""
    blast_loopback()
    before = kernel_stats("lo")
    time.sleep(SNMPD_CACHE_S)
    old_device = switch("old", snmpd.settings(community=COMMUNITY_NO_IFXTABLE))

    async def run():
        collector = SnmpCollector()
        try:
            old = await collector.collect_with_deadline(old_device)
            new = await collector.collect_with_deadline(switch("new", snmpd.settings()))
            again = await collector.collect_with_deadline(old_device)
        finally:
            await collector.close()
        return old, new, again

    old, new, again = asyncio.run(run())
    after = kernel_stats("lo")
    by_name = {s.port: s for s in new.samples}
    # ifDescr is the kernel name on Linux, as ifName is (other engineers' interfaces come and go in
    # this namespace: the machine's own are checked by name, the rest where both polls saw them)
    for result in (old, again):
        ports = {s.port for s in result.samples}
        assert {"lo", *(n for n in os.listdir("/sys/class/net") if n.startswith("eth"))} <= ports
        assert not any(re.fullmatch(r"if\d+", p) for p in ports), ports
    common = [s for s in old.samples + again.samples if s.port in by_name]
    assert {s.port for s in common} >= {"lo"} and len(common) >= len(old.samples)  # old's and again's
    for sample in common:
        full = by_name[sample.port]
        assert sample.counter_bits == 32 and full.counter_bits is None
        assert (sample.mtu, sample.oper_status) == (full.mtu, full.oper_status)
        # ifSpeed (bit/s) = ifHighSpeed (Mbit/s) x 10^6, unknown where ifSpeed tops out (> 4.29 Gbit/s)
        assert sample.speed_bps == (full.speed_bps if (full.speed_bps or 0) < 2**32 - 1 else None)
    lo = next(s for s in old.samples if s.port == "lo")
    assert lo.speed_bps == 10**7  # net-snmp's loopback speed
    pairs = {"in_octets": "rx_bytes", "out_octets": "tx_bytes", "in_pkts": "rx_packets", "out_pkts": "tx_packets",
             "in_errors": "rx_errors", "out_errors": "tx_errors", "in_discards": "rx_dropped"}
    for ours, kernel in pairs.items():  # the kernel's 64-bit value modulo 2^32, within the bracket
        value = getattr(lo, ours)
        assert value < 2**32 and (value - before[kernel]) % 2**32 <= after[kernel] - before[kernel], \
            (ours, before[kernel], value, after[kernel])
    assert after["rx_bytes"] - before["rx_bytes"] < 50_000_000 and lo.in_pkts > 0


def test_iftable_speed_at_its_maximum_means_unknown():
    """ifSpeed 4294967295 is "faster than this, see ifHighSpeed": without ifHighSpeed the speed is
    unknown (not 4.29 Gbit/s, which would cap the plausible rates and inflate utilization)."""
    server = Snmpd(extra_config=[f"override {IF_SPEED_LO} unsigned 4294967295"])
    server.start()
    try:
        old = asyncio.run(poll(SnmpCollector(), switch("old", server.settings(community=COMMUNITY_NO_IFXTABLE,
                                                                             interfaces=["lo"]))))
        new = asyncio.run(poll(SnmpCollector(), switch("new", server.settings(interfaces=["lo"]))))
        raw = subprocess.run(["snmpget", "-v2c", "-c", COMMUNITY, "-Oqv", f"127.0.0.1:{server.port}", IF_SPEED_LO],
                             capture_output=True, text=True, env={**os.environ, "MIBS": ""}).stdout.strip()
    finally:
        server.stop()
    assert raw == "4294967295"  # the agent really says so
    (lo_old,), (lo_new,) = old.samples, new.samples
    assert lo_old.speed_bps is None and lo_old.counter_bits == 32 and lo_old.in_octets is not None
    assert lo_new.speed_bps == 10**7  # ifHighSpeed, where present, wins


def test_iftable_rates_through_the_poller(tmp_path):
    """Two polls of the ifTable-only view through the poller: rates from the 32-bit counters, and
    the stored raw counters say their width.

    lo is the machine's: other tests' traffic crosses it too, and at net-snmp's 10 Mbit/s for lo a
    busy moment is an impossible rate (dropped, rightly). This snmpd says 4 Gbit/s (ifSpeed)."""
    server = Snmpd(extra_config=[f"override {IF_SPEED_LO} unsigned 4000000000"])
    server.start()
    config = _config(tmp_path, [
        switch("old", server.settings(community=COMMUNITY_NO_IFXTABLE, interfaces=["lo"])),
        switch("new", server.settings(interfaces=["lo"])),
    ])
    store = _ListStore()

    async def run():
        poller = Poller(config, store, registry=None)
        try:
            await poller.poll_all()
            blast_loopback(2000)
            await asyncio.sleep(SNMPD_CACHE_S)
            await poller.poll_all()
        finally:
            await poller.close()
        return poller

    try:
        poller = asyncio.run(run())
    finally:
        server.stop()
    assert all(d.state == "ok" for d in poller.devices())
    rates = {p.tags["device"]: p.fields for p in store.points if p.measurement == "port_rates"}
    assert rates["old"]["in_bps"] > 2000 * 1200 * 8 / 10 and rates["old"]["in_utilization"] > 0  # the blast
    counters = [p for p in store.points if p.measurement == "port_counters"]
    assert {p.tags["device"]: p.fields.get("counter_bits") for p in counters} == {"old": 32, "new": None}


def test_interface_names_and_32_bit_sums_from_snmp_values():
    """Naming and the ifTable packet sums on pysnmp values of the types agents send: ifName, else
    ifDescr (NUL-terminated by some agents), else if<ifIndex>; a shared ifDescr made unique; packet
    sums wrapping like one 32-bit counter."""
    from pysnmp.proto.rfc1902 import Counter32, Gauge32, Integer32, OctetString

    from collectors.snmp.ifmib import needs_if_table, port_names, port_sample

    rows = {(1,): {"oper": Integer32(1), "name": OctetString("swp1"), "descr": OctetString("Ethernet")},
            (2,): {"oper": Integer32(1), "descr": OctetString(b"mgmt0\0\0")},
            (3,): {"oper": Integer32(1), "descr": OctetString("Ethernet")},
            (4,): {"oper": Integer32(1), "descr": OctetString("Ethernet")},
            (5,): {"oper": Integer32(2), "name": OctetString(""), "descr": OctetString("bad\\name")},
            (6, 1): {"oper": Integer32(1)}}  # not an ifIndex row
    assert port_names(rows) == {1: "swp1", 2: "mgmt0", 3: "Ethernet #3", 4: "Ethernet #4", 5: "if5"}
    assert needs_if_table(rows)
    full = {(1,): {"oper": Integer32(1), "name": OctetString("swp1"), "in_octets": Counter32(1),
                   "high_speed": Gauge32(100)}}
    assert not needs_if_table(full)
    row = {"oper": Integer32(1), "in_octets_32": Counter32(7), "in_ucast_32": Counter32(2**32 - 10),
           "in_nucast_32": Counter32(25), "out_ucast_32": Counter32(3), "speed": Gauge32(10**9)}
    sample = port_sample("old", (2,), row, "mgmt0", 1, None)
    assert (sample.in_pkts, sample.out_pkts, sample.in_octets, sample.out_octets) == (15, 3, 7, None)
    assert sample.counter_bits == 32 and sample.speed_bps == 10**9


def test_collect_once_cli_prints_a_table_and_fails_for_a_dead_device(snmpd, tmp_path):
    cfg = tmp_path / "nms.yaml"
    doc = {"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "snmpd-local", "mgmt_address": "127.0.0.1", "collectors": {"snmp": snmpd.settings(interfaces=["lo"])}},
        {"name": "dead", "mgmt_address": "127.0.0.1",
         "collectors": {"snmp": {"community": "x", "port": 9, "timeout": 0.3, "retries": 0}}}]}}
    cfg.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "nms", "collect", "snmp", "--once", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "snmpd-local" in proc.stdout and " lo " in proc.stdout and "timeout" in proc.stdout
    assert "1/2 devices ok" in proc.stderr
    assert COMMUNITY not in proc.stdout + proc.stderr
    ok = subprocess.run([sys.executable, "-m", "nms", "collect", "snmp", "--once", "--config", str(cfg),
                         "--device", "snmpd-local"], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert ok.returncode == 0 and "1/1 devices ok" in ok.stderr


# --- helpers -------------------------------------------------------------------------------------


class _ListStore:
    def __init__(self):
        self.points = []

    def write(self, points):
        from nms.store import WriteResult

        self.points.extend(points)
        return WriteResult(accepted=len(points))

    # enough of the store interface for Service
    name = "list"

    def stats(self):
        return {}

    def close(self):
        pass


def _config(tmp_path, switches: list[SwitchConfig], **polling):
    from nms.config import parse_config

    doc = {"data_dir": str(tmp_path / "data"), "polling": polling,
           "fabric": {"switches": [s.model_dump(mode="json") for s in switches]}}
    for s, d in zip(switches, doc["fabric"]["switches"]):  # SecretStr dumps as stars: put the values back
        snmp = s.collectors.snmp
        for key in ("community", "auth_key", "priv_key"):
            if getattr(snmp, key) is not None:
                d["collectors"]["snmp"][key] = getattr(snmp, key).get_secret_value()
    return parse_config(yaml.safe_dump(doc))


def _write_test_mibs(d: Path) -> None:
    """Minimal stand-ins for the IETF base modules (written here, not copied) plus a test MIB that
    names objects snmpd serves."""
    (d / "SNMPv2-SMI.txt").write_text("""SNMPv2-SMI DEFINITIONS ::= BEGIN
org OBJECT IDENTIFIER ::= { iso 3 }
dod OBJECT IDENTIFIER ::= { org 6 }
internet OBJECT IDENTIFIER ::= { dod 1 }
mgmt OBJECT IDENTIFIER ::= { internet 2 }
mib-2 OBJECT IDENTIFIER ::= { mgmt 1 }
Integer32 ::= INTEGER (-2147483648..2147483647)
OBJECT-TYPE MACRO ::=
BEGIN
    TYPE NOTATION ::= "SYNTAX" Syntax
    VALUE NOTATION ::= value(VALUE ObjectName)
END
END
""")
    (d / "SNMPv2-TC.txt").write_text(
        "SNMPv2-TC DEFINITIONS ::= BEGIN\nDisplayString ::= OCTET STRING (SIZE (0..255))\nEND\n"
    )
    (d / "SNMPv2-CONF.txt").write_text("SNMPv2-CONF DEFINITIONS ::= BEGIN\nEND\n")
    (d / "NMS-TEST-MIB.txt").write_text("""NMS-TEST-MIB DEFINITIONS ::= BEGIN
IMPORTS OBJECT-TYPE, mib-2 FROM SNMPv2-SMI
        DisplayString FROM SNMPv2-TC;
nmsTestSystem OBJECT IDENTIFIER ::= { mib-2 1 }
nmsTestContact OBJECT-TYPE
    SYNTAX DisplayString
    MAX-ACCESS read-only
    STATUS current
    DESCRIPTION "sysContact under another name."
    ::= { nmsTestSystem 4 }
nmsTestIfXEntry OBJECT IDENTIFIER ::= { mib-2 31 1 1 1 }
nmsTestIfNames OBJECT-TYPE
    SYNTAX DisplayString
    MAX-ACCESS read-only
    STATUS current
    DESCRIPTION "ifName under another name."
    ::= { nmsTestIfXEntry 1 }
END
""")


def test_api_devices_ports_topology_and_metrics_after_real_polls(tmp_path):
    """Its own snmpd saying 4 Gbit/s for lo: the other xdist worker's traffic crosses lo too, and at
    net-snmp's 10 Mbit/s a busy moment is an impossible rate, rightly dropped (no `in_bps`)."""
    snmpd = Snmpd(extra_config=[f"override {IF_SPEED_LO} unsigned 4000000000"])
    snmpd.start()
    try:
        _api_after_real_polls(snmpd, tmp_path)
    finally:
        snmpd.stop()


def _api_after_real_polls(snmpd, tmp_path):
    from fastapi.testclient import TestClient
    from helpers import auth, make_config

    from nms.app.api import create_app
    from nms.app.service import Service

    config = make_config(tmp_path / "data", polling={"enabled": False}, fabric={"switches": [
        {"name": "rootns", "mgmt_address": "127.0.0.1", "collectors": {"snmp": snmpd.settings(
            interfaces=["lo"], extra_oids=["1.3.6.1.2.1.1.99.0"])}},  # an object snmpd lacks: a problem per poll
        {"name": "ghost", "mgmt_address": "127.0.0.1", "collectors": {
            "snmp": snmpd.settings("nmssha", auth_key="wrong-key-123")}}]})
    service = Service(config)
    with TestClient(create_app(service)) as client:
        portal = client.portal  # the app's event loop: the poller runs where the service runs
        portal.call(service.poller.poll_all)
        blast_loopback(2000)
        time.sleep(SNMPD_CACHE_S)
        portal.call(service.poller.poll_all)
        devices = {d["device"]: d for d in client.get("/devices", headers=auth("read")).json()}
        assert devices["rootns"]["state"] == "ok" and devices["rootns"]["polls"] == 2
        assert devices["ghost"]["state"] == "backoff" and devices["ghost"]["last_error_kind"] == "auth"
        assert "wrong-key-123" not in str(devices)
        rootns = devices["rootns"]  # what its polls left out: the latest poll's, and all so far
        assert (rootns["last_problem_count"], rootns["problems"]) == (1, 2)
        assert rootns["last_problems"] == [{"what": "extra object 1.3.6.1.2.1.1.99.0", "kind": "bad_response",
                                            "reason": "the agent has no such object (noSuchObject or noSuchInstance)"}]
        assert devices["ghost"]["problems"] == 0 and devices["ghost"]["last_problems"] == []
        ports = client.get("/ports", params={"device": "rootns"}, headers=auth("read")).json()
        (lo,) = ports
        assert lo["port"] == "lo" and lo["rates"]["in_bps"] > 2000 * 1200 * 8 / 10  # the blast, over < 10 s
        topo = client.get("/topology", headers=auth("read")).json()
        assert {n["name"]: n["reachable"] for n in topo["nodes"]} == {"rootns": True, "ghost": False}
        metrics = client.get("/metrics", headers=auth("read")).text
        assert 'nms_collector_device_up{collector="snmp",device="rootns"} 1.0' in metrics
        assert 'nms_collector_polls_total{collector="snmp",device="ghost",result="auth"} 2.0' in metrics
        assert 'nms_collector_poll_problems_total{collector="snmp",device="rootns"} 2.0' in metrics
        assert 'nms_collector_last_poll_problems{collector="snmp",device="rootns"} 1.0' in metrics
        stored = client.get("/telemetry/latest", params={"measurement": "port_rates", "tag": "device=rootns"},
                            headers=auth("read")).json()["series"]
        assert stored and stored[0]["tags"] == {"device": "rootns", "port": "lo"}
        assert client.get("/devices").status_code == 401


def test_nms_serve_polls_on_schedule_and_the_cli_shows_devices_and_topology(snmpd, tmp_path):
    """The real process: `nms serve` polls on its schedule; `nms devices` and `nms topology` read it."""
    import httpx
    from _influx import free_port

    port, token = free_port(), "snmp-cli-token-0123456789abcdef"
    cfg = tmp_path / "nms.yaml"
    cfg.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "api": {"port": port, "tokens": [{"name": "t", "scopes": ["read"], "token": token}]},
        "fabric": {"switches": [
            {"name": "snmpd-local", "mgmt_address": "127.0.0.1", "role": "leaf",
             "collectors": {"snmp": snmpd.settings(interval=1.0, interfaces=["lo"])}},
            {"name": "offline", "mgmt_address": "127.0.0.1", "role": "spine",
             "collectors": {"snmp": {"community": "x", "port": 9, "timeout": 0.2, "retries": 0, "interval": 1.0}}}],
            "links": [{"a": "snmpd-local:swp1", "b": "offline:swp1"}]}}))
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(cfg)], stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO)
    env = {**os.environ, "NMS_URL": f"http://127.0.0.1:{port}", "NMS_TOKEN": token, "COLUMNS": "200"}
    try:
        deadline = time.monotonic() + 20
        devices = []
        while time.monotonic() < deadline:
            try:
                devices = httpx.get(f"{env['NMS_URL']}/devices", headers={"Authorization": f"Bearer {token}"},
                                    timeout=1).json()
                if any(d["device"] == "snmpd-local" and d["polls"] >= 3 for d in devices):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"no scheduled polls: {devices}\n{(tmp_path / 'server.log').read_text()[-3000:]}")
        out = subprocess.run([sys.executable, "-m", "nms", "devices", "--json"], capture_output=True, text=True,
                             env=env, cwd=REPO, timeout=30)
        status = {d["device"]: d for d in json.loads(out.stdout)}
        assert status["snmpd-local"]["state"] == "ok" and status["offline"]["last_error_kind"] == "timeout"
        table = subprocess.run([sys.executable, "-m", "nms", "devices"], capture_output=True, text=True, env=env,
                               cwd=REPO, timeout=30).stdout
        assert "snmpd-local" in table and ("backoff" in table or "error" in table)
        topo = subprocess.run([sys.executable, "-m", "nms", "topology"], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=30).stdout
        # snmpd in the root namespace runs no lldpd: the configured cable cannot be seen -> missing
        assert "snmpd-local:swp1" in topo and "missing" in topo and "1 with problems" in topo
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
