"""openconfig-qos output queues over gNMI, end to end below the lab: the tc parser (nms/qdisc.py), the
notification mapping (collectors/gnmi/qos.py), the lab target serving real qdisc counters
(lab/gnmi_qos.py), the collector's ONCE/POLL/STREAM with and without the model, a target that
refuses the path, and a POLL target that waits for the first Poll."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time

import grpc
import pytest
from _gnmi import Target, free_port
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

from collectors.gnmi import qos as gnmi_qos
from collectors.gnmi.collector import GnmiCollector
from lab.gnmi_qos import Queues
from lab.gnmi_target import Target as TargetServicer
from lab.gnmi_tree import Kernel
from nms import qdisc
from nms.config.models import SwitchConfig
from nms.records import QueueRates, QueueSample
from tests.test_gnmi_collector import _NoScheduler, device, poller_for, until

T0 = 1_700_000_000 * 10**9
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes veth pairs, qdiscs and a namespace (needs root)")

# `tc -s -j qdisc show` on this kernel (iproute2 6.1): a TBF port, an HTB tree, ingress, noqueue
TC_OUTPUT = json.dumps([
    {"kind": "noqueue", "handle": "0:", "dev": "lo", "root": True, "refcnt": 2, "options": {}, "bytes": 0,
     "packets": 0, "drops": 0, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
    {"kind": "tbf", "handle": "8001:", "dev": "l1", "root": True, "refcnt": 3,
     "options": {"rate": 1250000, "burst": 10240, "lat": 20000}, "bytes": 656, "packets": 8, "drops": 3,
     "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
    {"kind": "ingress", "handle": "ffff:", "dev": "l1", "parent": "ffff:fff1", "options": {}, "bytes": 50,
     "packets": 1, "drops": 0, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
    {"kind": "htb", "handle": "1:", "dev": "l2", "root": True, "refcnt": 3, "options": {"r2q": 10}, "bytes": 90,
     "packets": 1, "drops": 9, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
    {"kind": "pfifo", "handle": "10:", "dev": "l2", "parent": "1:10", "options": {"limit": 10}, "bytes": 90,
     "packets": 1, "drops": 9, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0},
])


# --- the tc parser ------------------------------------------------------------------------------


def test_tc_queues_are_the_leaf_egress_qdiscs():
    notes: list[str] = []
    found = {(s.port, s.queue): s for s in qdisc.queue_samples("sw", TC_OUTPUT, T0, lambda p: True, notes)}
    assert set(found) == {("l1", "root"), ("l2", "1:10")} and not notes  # not noqueue, ingress, nor HTB's root
    s = found[("l1", "root")]
    assert (s.transmit_pkts, s.transmit_octets, s.dropped_pkts, s.ecn_marked_pkts, s.dropped_octets) == (
        8, 656, 3, None, None)  # tbf counts no ECN marks, Linux no dropped bytes: absent, not 0
    assert found[("l2", "1:10")].dropped_pkts == 9
    assert [s.port for s in qdisc.queue_samples("sw", TC_OUTPUT, T0, lambda p: p == "l2", [])] == ["l2"]


def test_tc_ecn_marks_of_an_aqm_qdisc_are_read():
    # iproute2 prints fq_codel's and codel's extended statistics as ecn_mark, red's as marked
    items = [{"kind": "fq_codel", "handle": "8002:", "dev": "l3", "root": True, "bytes": 10, "packets": 1,
              "drops": 0, "ecn_mark": 42, "maxpacket": 1514},
             {"kind": "red", "handle": "8003:", "dev": "l4", "root": True, "bytes": 10, "packets": 1, "drops": 2,
              "marked": 7, "early": 2}]
    found = {s.port: s.ecn_marked_pkts for s in qdisc.queue_samples("sw", json.dumps(items), T0, lambda p: True, [])}
    assert found == {"l3": 42, "l4": 7}


def test_tc_malformed_values_are_left_out_with_a_reason_and_the_rest_kept():
    items = json.loads(TC_OUTPUT)
    items[1]["drops"] = -3
    items[4]["bytes"] = "many"
    items.append({"handle": "1:"})  # no dev, no kind
    notes: list[str] = []
    found = {(s.port, s.queue): s for s in qdisc.queue_samples("sw", json.dumps(items), T0, lambda p: True, notes)}
    assert found[("l1", "root")].dropped_pkts is None and found[("l1", "root")].transmit_pkts == 8
    assert found[("l2", "1:10")].transmit_octets is None and found[("l2", "1:10")].dropped_pkts == 9
    assert any("l1 queue root: drops -3 is not a counter" in n for n in notes)
    assert any("bytes 'many'" in n for n in notes) and any("no 'dev' or 'kind'" in n for n in notes)
    with pytest.raises(qdisc.QdiscError, match="not JSON"):
        qdisc.queue_samples("sw", "qdisc tbf 8001: root", T0, lambda p: True, [])
    with pytest.raises(qdisc.QdiscError, match="JSON list"):
        qdisc.queue_samples("sw", '{"a": 1}', T0, lambda p: True, [])


def test_cli_linux_parses_the_same_and_declares_32_bit_drops():
    from collectors.cli import linux as cli_linux

    samples = cli_linux.queue_samples("sw", TC_OUTPUT, T0, lambda p: True, [])
    assert samples == qdisc.queue_samples("sw", TC_OUTPUT, T0, lambda p: True, [])
    assert cli_linux.COUNTER_BITS["dropped_pkts"] == 32
    with pytest.raises(cli_linux.Bad):
        cli_linux.queue_samples("sw", "garbage", T0, lambda p: True, [])


def test_the_lab_target_widens_32_bit_drops_and_restarts_with_a_new_qdisc(tmp_path):
    out = tmp_path / "tc.json"
    queues = Queues(lambda p: True, command=("cat", str(out)))

    def read(drops, packets):
        out.write_text(json.dumps([{"kind": "tbf", "handle": "8001:", "dev": "l1", "root": True, "bytes": packets * 100,
                                    "packets": packets, "drops": drops}]))
        return queues.read()[("l1", "root")][1]

    assert read((1 << 32) - 5, 100)["state/dropped-pkts"] == (1 << 32) - 5
    assert read(10, 200)["state/dropped-pkts"] == (1 << 32) + 10  # wrapped: counter64 goes on
    assert read(20, 300)["state/dropped-pkts"] == (1 << 32) + 20
    assert read(3, 5)["state/dropped-pkts"] == 3  # packets went back too: a new qdisc, not a wrap


# --- notifications -> QueueSample -----------------------------------------------------------------


def _elem(elem_name, **key):
    return gnmi_pb2.PathElem(name=elem_name, key=key)


def _queue_prefix(port, queue, module=""):
    return gnmi_pb2.Path(elem=[_elem(module + "qos"), _elem("interfaces"), _elem("interface", **{"interface-id": port}),
                               _elem("output"), _elem("queues"), _elem("queue", name=queue)])


def _leaf(text):
    return gnmi_pb2.Path(elem=[_elem(p) for p in text.split("/")])


def test_typed_values_under_a_queue_prefix():
    n = gnmi_pb2.Notification(timestamp=T0, prefix=_queue_prefix("Ethernet1", "UC3"))
    for leaf, v in (("transmit-pkts", 10), ("transmit-octets", 1000), ("dropped-pkts", 4), ("ecn-marked-pkts", 2),
                    ("max-queue-len", 77)):
        n.update.add(path=_leaf(f"state/{leaf}"), val=gnmi_pb2.TypedValue(uint_val=v))
    queues: dict = {}
    touched, problems = gnmi_qos.apply(queues, n)
    assert touched == {("Ethernet1", "UC3")} and not problems
    [s] = gnmi_qos.samples("leaf1", queues, touched, 0)
    assert (s.port, s.queue, s.ts, s.transmit_pkts, s.dropped_pkts, s.ecn_marked_pkts, s.dropped_octets) == (
        "Ethernet1", "UC3", T0, 10, 4, 2, None)


def test_whole_paths_json_ietf_strings_module_prefixes_and_a_bad_value():
    """Full paths from the root with openconfig-qos: prefixes, JSON_IETF uint64 as strings; a value of the
    wrong kind is noted with the leaf and left out, the other leaves of the same notification kept."""
    n = gnmi_pb2.Notification(timestamp=T0)
    base = list(_queue_prefix("swp1", "0", "openconfig-qos:").elem)
    for leaf, raw in (("dropped-pkts", '"18446744073709551615"'), ("transmit-pkts", '"12"'),
                      ("transmit-octets", '"-1"'), ("dropped-octets", "true")):
        n.update.add(path=gnmi_pb2.Path(elem=base + list(_leaf(f"state/{leaf}").elem)),
                     val=gnmi_pb2.TypedValue(json_ietf_val=raw.encode()))
    queues: dict = {}
    touched, problems = gnmi_qos.apply(queues, n)
    [s] = gnmi_qos.samples("leaf1", queues, touched, 0)
    assert s.dropped_pkts == 2**64 - 1 and s.transmit_pkts == 12 and s.transmit_octets is None
    assert s.dropped_octets is None and len(problems) == 2
    assert "swp1 queue 0 state/transmit-octets: expected an unsigned integer, got '-1'" in map(str, problems)


def test_interfaces_input_queues_and_unwanted_ports_are_ignored_and_a_delete_forgets():
    queues: dict = {}
    other = gnmi_pb2.Notification(prefix=gnmi_pb2.Path(elem=[_elem("interfaces"), _elem("interface", name="swp1")]))
    other.update.add(path=_leaf("state/counters/in-octets"), val=gnmi_pb2.TypedValue(uint_val=5))
    assert gnmi_qos.apply(queues, other) == (set(), [])
    inp = gnmi_pb2.Notification(prefix=gnmi_pb2.Path(elem=[_elem("qos"), _elem("interfaces"), _elem(
        "interface", **{"interface-id": "swp1"}), _elem("input"), _elem("queues"), _elem("queue", name="0")]))
    inp.update.add(path=_leaf("state/dropped-pkts"), val=gnmi_pb2.TypedValue(uint_val=5))
    assert gnmi_qos.apply(queues, inp) == (set(), [])
    n = gnmi_pb2.Notification(timestamp=T0, prefix=_queue_prefix("swp2", "0"))
    n.update.add(path=_leaf("state/dropped-pkts"), val=gnmi_pb2.TypedValue(uint_val=1))
    assert gnmi_qos.apply(queues, n, lambda p: p != "swp2") == (set(), [])
    assert gnmi_qos.apply(queues, n)[0] == {("swp2", "0")}
    gone = gnmi_pb2.Notification(prefix=_queue_prefix("swp2", "0"))
    gone.delete.add()
    gnmi_qos.apply(queues, gone)
    assert queues == {}


# --- the collector against targets on loopback ----------------------------------------------------


def _collect(dev: SwitchConfig, collector: GnmiCollector | None = None, polls: int = 1):
    collector = collector or GnmiCollector()

    async def run():
        try:
            return [await collector.collect_with_deadline(dev, 10) for _ in range(polls)], collector
        finally:
            await collector.close()

    return asyncio.run(run())


def test_a_target_without_the_model_is_read_as_before(tmp_path):
    t = Target(tmp_path, "--insecure", "--interfaces", "lo", "--no-qos").start()
    try:
        for mode in ("once", "poll"):
            [result], collector = _collect(device(t, mode=mode))
            assert result.samples and not [r for r in result.records if isinstance(r, QueueSample)]
            assert result.problems == []  # not asked, so nothing refused
    finally:
        t.stop()


class _Unlisting(TargetServicer):
    """A target that lists no models (some do) and serves no openconfig-qos: it refuses the path."""

    async def Capabilities(self, request, context):
        return gnmi_pb2.CapabilityResponse(supported_encodings=[gnmi_pb2.PROTO], gNMI_version="0.7.0")


@pytest.mark.parametrize("mode", ["once", "poll", "stream"])
def test_a_refused_queue_path_is_noted_and_the_interfaces_still_read(mode, tmp_path):
    port = free_port()
    dev = SwitchConfig(name="gnmi-sw", mgmt_address="127.0.0.1", collectors={"gnmi": {
        "port": port, "insecure": True, "interval": 0.2, "mode": mode, "inventory": False}})

    async def run():
        server = grpc.aio.server()
        gnmi_pb2_grpc.add_gNMIServicer_to_server(_Unlisting(Kernel(["lo"]), qos=False), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        collector = GnmiCollector()
        try:
            if mode != "stream":
                out = []
                for _ in range(2):
                    result = await collector.collect_with_deadline(dev, 10)
                    out.append((result.samples, result.problems))
                return out
            batches: list = []

            async def emit(result):
                batches.append((result.samples, result.problems))
            task = asyncio.create_task(collector.stream(dev, emit))
            assert await until(lambda: len(batches) >= 2, 5)
            task.cancel()
            return batches
        finally:
            await collector.close()
            await server.stop(0)

    batches = asyncio.run(run())
    for samples, problems in batches[:2]:
        assert any(s.port == "lo" and s.in_octets is not None for s in samples)
        assert any(str(p).startswith("openconfig-qos: NOT_FOUND") and "queues not collected" in str(p)
                   for p in problems), problems  # every poll, every batch of a stream


# --- real qdiscs: a shaped port that drops, one that does not -------------------------------------


@pytest.fixture
def shaped(tmp_path):
    """Two veth ports in this namespace (nmsqA0 -> nmsqB0, nmsqA1 -> nmsqB1, the B ends in the netns
    nmsq-peer), each shaped by TBF at 2 Mbit/s; a gNMI target serving them."""
    ns, ports = "nmsq-peer", ("nmsqA0", "nmsqA1")
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for i, a in enumerate(ports):
            b = f"nmsqB{i}"
            subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns], check=True)
            subprocess.run(["ip", "addr", "add", f"198.18.247.{209 + 4 * i}/30", "dev", a], check=True)
            subprocess.run(["ip", "link", "set", a, "up"], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"198.18.247.{210 + 4 * i}/30", "dev", b], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", b, "up"], check=True)
            subprocess.run(["tc", "qdisc", "replace", "dev", a, "root", "tbf", "rate", "2mbit", "burst", "4kb",
                            "latency", "5ms"], check=True)
        target = Target(tmp_path, "--insecure", "--interfaces", "nmsqA*").start()
        yield target, ports
        target.stop()
    finally:
        for a in ports:
            subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def tc_drops(dev: str) -> int:
    [q] = json.loads(subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True,
                                    check=True).stdout)
    return q["drops"]


def flood(dst: str, seconds: float) -> int:
    """UDP at far above 2 Mbit/s towards `dst` (its qdisc drops the excess); returns datagrams sent."""
    sent, end = 0, time.monotonic() + seconds
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        while time.monotonic() < end:
            try:
                s.sendto(b"q" * 1200, (dst, 9))
                sent += 1
            except OSError:  # ENOBUFS: the qdisc refused it (counted as a drop there)
                pass
    return sent


@needs_root
def test_once_reads_the_qdisc_drops_of_the_right_port(shaped):
    target, (busy, idle) = shaped
    flood("198.18.247.210", 0.5)
    [result], collector = _collect(device(target, interfaces=["nmsqA*"]))
    queues = {q.port: q for q in result.records if isinstance(q, QueueSample)}
    assert set(queues) == {busy, idle} and {q.queue for q in queues.values()} == {"root"}
    after = tc_drops(busy)
    assert 0 < queues[busy].dropped_pkts <= after and queues[idle].dropped_pkts == 0
    assert queues[busy].transmit_pkts > 0 and queues[busy].ecn_marked_pkts is None  # tbf marks nothing
    assert result.problems == []


@needs_root
def test_streamed_queue_rates_reach_the_poller_and_the_store(shaped, tmp_path):
    """STREAM (SAMPLE 0.3 s): QueueRates of the flooded port show drops at about the rate tc counts
    them; the idle port's queue drops nothing; both records are stored."""
    target, (busy, idle) = shaped
    records: list = []
    poller = poller_for(device(target, interval=0.3, interfaces=["nmsqA*"]), tmp_path, records)

    async def run():
        poller.schedule(_NoScheduler())
        try:
            assert await until(lambda: any(isinstance(r, QueueRates) for r in records), 5), poller.devices()
            before, t0 = tc_drops(busy), time.monotonic()
            await asyncio.to_thread(flood, "198.18.247.210", 2.0)
            counted = (tc_drops(busy) - before) / (time.monotonic() - t0)
            await asyncio.sleep(0.8)
            return counted
        finally:
            await poller.close()

    counted = asyncio.run(run())
    busy_rates = [r for r in records if isinstance(r, QueueRates) and r.port == busy]
    idle_rates = [r for r in records if isinstance(r, QueueRates) and r.port == idle]
    assert idle_rates and all(r.dropped_pps == 0 for r in idle_rates)
    peak = max(r.dropped_pps for r in busy_rates)
    assert peak > 100 and counted > 100
    assert 0.5 * counted < peak < 3 * counted  # a sample interval is shorter than the flood: its rate is higher
    measurements = {p.measurement for p in poller.store.points}
    assert {"queue_counters", "queue_rates"} <= measurements


# --- a POLL target that waits for the first Poll --------------------------------------------------


def test_a_poll_target_that_waits_for_the_first_poll(tmp_path):
    """`--poll-waits`: the target sends nothing after the SubscriptionList (checked with a raw client);
    the collector's `mode: poll` then sends a Poll after 1 s and reads the answer, and later polls
    are answered at once on the same subscription."""
    t = Target(tmp_path, "--insecure", "--interfaces", "lo", "--poll-waits").start()
    try:
        async def raw():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{t.port}") as channel:
                stub = gnmi_pb2_grpc.gNMIStub(channel)
                requests: asyncio.Queue = asyncio.Queue()
                requests.put_nowait(gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
                    subscription=[gnmi_pb2.Subscription(path=_leaf("interfaces/interface/state/counters"))],
                    mode=gnmi_pb2.SubscriptionList.POLL, encoding=gnmi_pb2.PROTO)))

                async def outgoing():
                    while True:
                        yield await requests.get()
                call = stub.Subscribe(outgoing(), metadata=(("username", "nms"), ("password",
                                                                                  "gnmi-test-password-7Qx")))
                reading = asyncio.ensure_future(call.read())  # (a timed-out read() would cancel the call)
                done, _ = await asyncio.wait({reading}, timeout=1.0)
                assert not done, "the target answered before any Poll"
                requests.put_nowait(gnmi_pb2.SubscribeRequest(poll=gnmi_pb2.Poll()))
                first = await asyncio.wait_for(reading, 3)
                call.cancel()
                return first

        first = asyncio.run(raw())
        assert first.update.prefix.elem[1].key["name"] == "lo"

        dev = device(t, mode="poll")
        collector = GnmiCollector()

        async def polls():
            try:
                out = []
                for _ in range(3):
                    t0 = time.monotonic()
                    result = await collector.collect_with_deadline(dev, 5)
                    out.append((time.monotonic() - t0, result))
                return out, collector._polls["gnmi-sw"].polls
            finally:
                await collector.close()

        out, polls_on_call = asyncio.run(polls())
        assert polls_on_call == 3  # one subscription
        assert 1.0 <= out[0][0] < 3.0 and all(d < 0.8 for d, _ in out[1:])  # waited once, then at once
        octets = [next(s.in_octets for s in r.samples if s.port == "lo") for _, r in out]
        assert octets == sorted(octets) and all(o > 0 for o in octets)
    finally:
        t.stop()
