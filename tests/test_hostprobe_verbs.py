"""The RDMA UD probe transport (hostprobe.verbs) against the fake pyverbs of tests/fakeverbs.

No RDMA device exists here: the fake keeps pyverbs' API (names, signatures, enum values, checked
against the real pyverbs in tests/test_fakeverbs.py) and carries UD SENDs as UDP datagrams on
loopback, with a simulated HCA clock (offset, drift) stamping completions. What runs for real:
this transport's code, the prober and responder, real `nms-agent` processes and `nms serve`.
What does not: a NIC, its firmware's timestamps, RoCE on a wire, switches hashing RoCE 5-tuples.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from hostprobe import verbs, wire
from hostprobe.prober import LocalNic, Target
from hostprobe.trace import STEP_TIMEOUT, STEP_TRIES, TraceJob, Tracer
from nms.app.local_daemons import free_port
from tests.test_hostprobe_agent import HOSTS, Bed

FAKE = Path(__file__).parent / "fakeverbs"
KEY = b"verbs-test-probe-key-0123456789"


def fake_fabric(path: Path, devices: dict[str, dict], loss: list[dict] | None = None) -> None:
    entries = [{"name": name, "ipv4": d["ipv4"], "wire": [d["ipv4"], d["wire_port"]], "hca_core_clock_khz": 156250,
                "clock_offset_ns": d.get("offset_ns", 0), "drift_ppm": d.get("drift_ppm", 0.0),
                "timestamp_mask": d.get("mask", (1 << 48) - 1), "port_state": "active"}
               for name, d in devices.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": entries, "loss": loss or []}))
    os.replace(tmp, path)


@pytest.fixture
def pyverbs_fake(tmp_path, monkeypatch):
    """Two fake devices (127.0.0.2 and 127.0.0.3) with clocks far apart and drifting."""
    monkeypatch.syspath_prepend(str(FAKE))
    for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    conf = tmp_path / "fabric.json"
    devices = {"fake_a": {"ipv4": "127.0.0.2", "wire_port": free_port(), "offset_ns": 123_456_789_000,
                          "drift_ppm": 40.0},
               "fake_b": {"ipv4": "127.0.0.3", "wire_port": free_port(), "offset_ns": -7_000_000_000,
                          "drift_ppm": -25.0}}
    fake_fabric(conf, devices)
    monkeypatch.setenv("NMS_FAKE_VERBS", str(conf))
    return conf, devices


def test_flow_labels_give_the_roce_source_port_back():
    for sport in range(verbs.SPORT_MIN + 1, 0x10000):
        assert verbs.sport_for_flow_label(verbs.flow_label_for_sport(sport)) == sport
    assert verbs.sport_for_flow_label(0xABCDE) == (0xABCDE & 0x3FFF ^ 0xABCDE >> 14) | 0xC000  # libibverbs' fold
    with pytest.raises(ValueError, match="49153..65535"):
        verbs.flow_label_for_sport(33434)


def test_gids_and_grh_addresses():
    assert verbs.mapped_gid("10.1.2.3") == "0000:0000:0000:0000:0000:ffff:0a01:0203"
    ipv4_grh = bytes(20) + bytes([0x45, 0, 0, 60, 0, 0, 0, 0, 64, 17, 0, 0, 10, 1, 2, 3, 10, 9, 9, 9])
    assert verbs._ipv4_of_grh(ipv4_grh) == "10.1.2.3"
    ipv6_grh = bytes([0x60, 0, 0, 0, 0, 20, 17, 64]) + bytes(10) + b"\xff\xff" + bytes([10, 4, 5, 6]) + bytes(16)
    assert verbs._ipv4_of_grh(ipv6_grh) == "10.4.5.6"
    assert verbs._ipv4_of_grh(b"short") is None


class _Counter:
    """A NIC clock counter for HcaClock's arithmetic alone: wraps at `mask`, runs `ppm` fast."""

    def __init__(self, khz: int, mask: int, ppm: float, start: int):
        self.khz, self.mask, self.ppm, self.start, self.t0 = khz, mask, ppm, start, time.time_ns()

    def cycles_at(self, real_ns: int) -> int:
        return int(self.start + (real_ns - self.t0) * (1 + self.ppm * 1e-6) * self.khz / 1e6) & self.mask

    def query_device_ex(self):
        return type("Attr", (), {"hca_core_clock": self.khz, "completion_timestamp_mask": self.mask})()

    def query_rt_values_ex(self):
        return 0, self.cycles_at(time.time_ns())


def test_hca_clock_follows_drift_and_counter_wraps():
    # a 32-bit counter at 1 GHz wraps every 4.3 s; start just before the wrap
    ctr = _Counter(1_000_000, (1 << 32) - 1, 30.0, (1 << 32) - 300_000_000)
    clock = verbs.HcaClock(ctr, None)
    for _ in range(6):
        time.sleep(0.1)
        clock.calibrate()
    assert abs(clock.rate - 1 / 1.00003) < 1e-5  # ns per cycle, fitted: 30 ppm fast
    later = time.time_ns() + 400_000_000  # past the wrap
    assert abs(clock.to_ns(ctr.cycles_at(later)) - later) < 50_000


def test_hca_clock_restarts_after_a_step():
    ctr = _Counter(156_250, (1 << 48) - 1, 0.0, 10**12)
    clock = verbs.HcaClock(ctr, None)
    clock.calibrate()
    ctr.start += 156_250 * 5  # the NIC clock jumps 5 ms
    clock.calibrate()
    assert clock.steps == 1 and len(clock.samples) == 1
    now = time.time_ns()
    assert abs(clock.to_ns(ctr.cycles_at(now)) - now) < 50_000


def test_ud_exchange_between_two_nics(pyverbs_fake):
    stats: defaultdict[str, int] = defaultdict(int)
    a, b = verbs.VerbsDevice("127.0.0.2", stats), verbs.VerbsDevice("127.0.0.3", stats)
    try:
        assert (a.port, a.gid_index) == (1, 3)  # ::ffff:IPv4 as RoCE v2 (mlx5's table order)
        qa, qb = a.prober, b.responder
        sport = 0xC123
        probe = wire.encode(KEY, wire.PROBE, 77, 1, ta=verbs.flow_label_for_sport(sport))
        assert qa.send(probe, ("127.0.0.3", qb.qpn, verbs.flow_label_for_sport(sport)), token="ex1")
        got = []
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            got = list(qb.receive(KEY, stats))
        (msg, t2, src), = got
        assert msg.type == wire.PROBE and msg.seq == 1
        assert src == ("127.0.0.2", qa.qpn, verbs.flow_label_for_sport(sport))  # answer on the same 5-tuple
        stamps, errors = qa.drain_errqueue()
        assert errors == [] and [k for k, _ in stamps] == [0] and qa.pending == {0: "ex1"}
        t1 = stamps[0][1]
        # both NIC clocks (123 s and -7 s off, +40 and -25 ppm) mapped back to realtime: the one-way
        # delay is loopback-small (the mapping's error is a few us)
        assert -50_000 < t2 - t1 < 2_000_000, (t1, t2)
        assert abs(t1 - time.time_ns()) < 1_000_000_000
        # a packet without our MAC is counted, not delivered
        assert qa.send(probe[:-1] + bytes([probe[-1] ^ 1]), ("127.0.0.3", qb.qpn, 5))
        deadline = time.monotonic() + 2
        while not stats["rx_forged"] and time.monotonic() < deadline:
            assert list(qb.receive(KEY, stats)) == []
        assert stats["rx_forged"] == 1
    finally:
        a.close()
        b.close()


def test_a_nic_without_its_address_as_a_gid_is_refused(pyverbs_fake):
    with pytest.raises(verbs.VerbsError, match="no RDMA device has 127.0.0.9"):
        verbs.VerbsDevice("127.0.0.9", {})


# -- real agents over the fake devices -------------------------------------------------------------
class VerbsBed(Bed):
    """Bed's service and agents; h1 and h2 have (fake) RoCE devices, h3 only UDP."""

    def __init__(self, tmp, devices):
        super().__init__(tmp)
        self.fabric = tmp / "fabric.json"
        self.devices = devices
        fake_fabric(self.fabric, devices)

    def start_agent(self, host: str, env: dict | None = None):
        super().start_agent(host, env={**os.environ, "NMS_FAKE_VERBS": str(self.fabric), "NMS_FAKE_VERBS_SEED": "7",
                                       "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")])})


@pytest.fixture(scope="module")
def vbed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verbs")
    devices = {"fake_h1": {"ipv4": HOSTS["h1"], "wire_port": free_port(), "offset_ns": 50_000_000_000,
                           "drift_ppm": 30.0},
               "fake_h2": {"ipv4": HOSTS["h2"], "wire_port": free_port(), "offset_ns": -3_000_000_000,
                           "drift_ppm": -45.0}}
    b = VerbsBed(tmp, devices)
    b.start_all(wait=25)
    time.sleep(3.5)
    yield b
    b.close()


def test_agents_register_their_responder_qps_and_probe_each_other_over_ud(vbed):
    agents = {a["host"]: a for a in vbed.api("GET", "/agents").json()}
    assert agents["h1"]["transport"] == agents["h2"]["transport"] == "verbs"
    assert agents["h3"]["transport"] == "udp"  # no RDMA device has its address
    assert all(isinstance(agents[h]["nics"][0]["qpn"], int) for h in ("h1", "h2"))
    assert agents["h3"]["nics"][0].get("qpn") is None
    paths = {(p["src_host"], p["dst_host"]): p for p in vbed.rows("probe_path", vbed.t0)}
    for pair in [("h1", "h2"), ("h2", "h1")]:
        p = paths[pair]
        assert p["dport"] == verbs.ROCE_V2_PORT and p["probed_sport"] > verbs.SPORT_MIN, p
    for pair in [("h1", "h3"), ("h3", "h1"), ("h2", "h3"), ("h3", "h2")]:  # mixed fleet: UDP both ways
        assert paths[pair]["dport"] == vbed.probe_port, paths[pair]
    windows = [w for w in vbed.rows("probe_window", vbed.t0) if w["sent"] >= 8]
    ud = [w for w in windows if {w["src_host"], w["dst_host"]} == {"h1", "h2"}]
    assert len(ud) >= 4 and all(w["received"] == w["sent"] for w in ud)
    for w in ud:  # t1..t4 are the fake NICs' completion stamps, their clocks 53 s apart, mapped back
        assert 0 < w["rtt_p50_ns"] < 5_000_000, w
        assert -50_000 < w["owd_fwd_min_ns"] < 2_000_000 and -50_000 < w["owd_rev_min_ns"] < 2_000_000, w
    stats = vbed.status("h1")["stats"]
    assert stats["probes_answered"] > 0 and not stats.get("verbs_send_errors") and not stats.get("rx_forged")


def test_loss_on_one_roce_source_port_downs_exactly_that_path(vbed):
    h1_paths = [p for p in vbed.status("h1")["paths"] if p["peer"] == "h2"]
    assert len(h1_paths) == 1  # loopback: one path; the probed source port carries it
    sport = h1_paths[0]["sport"]
    start = time.time_ns()
    fake_fabric(vbed.fabric, vbed.devices, loss=[{"src": HOSTS["h1"], "dst": HOSTS["h2"], "udp_sport": sport,
                                                  "rate": 1.0}])
    deadline = time.monotonic() + 8
    events = []
    while time.monotonic() < deadline and not events:
        time.sleep(0.5)
        events = [e for e in vbed.rows("path_event", start) if e["state"] == "down"]
    assert [(e["src_host"], e["dst_host"], e["sport"]) for e in events] == [("h1", "h2", sport)]
    fake_fabric(vbed.fabric, vbed.devices)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if any(e["state"] == "up" for e in vbed.rows("path_event", start, src_host="h1", dst_host="h2")):
            break
    else:
        pytest.fail("the path did not come back up after the loss stopped")


# -- tracing a RoCE 5-tuple --------------------------------------------------------------------------
class _TraceSock:
    """Records what the tracer sends (as VerbsPort.send would put it on the kernel socket)."""

    def __init__(self, port: int):
        self.port, self.addr, self.sent = port, "10.0.0.1", []

    def send(self, payload, dest, token=None, ttl=None):
        self.sent.append((dest, ttl))
        return True


def _icmp(router: str, dest: tuple, kind: int = 11):
    return type("Entry", (), {"dest": dest, "offender": router, "icmp_type": kind, "data": b""})()


def test_a_roce_trace_ends_after_two_silent_ttls_and_has_no_reverse_phase():
    sock = _TraceSock(0xC123)
    nic = LocalNic("eth0", "10.0.0.1", [], verbs=object(), verbs_ports=[sock])
    target = Target(nic, "h2", "eth0", "10.0.0.2", 33434, qpn=0x1234)
    assert target.verbs and target.dest == ("10.0.0.2", 0x1234) and target.wire_port == verbs.ROCE_V2_PORT
    seq = iter(range(1, 10**6))
    tracer = Tracer(b"k" * 16, 1, 8, 1e6, lambda: next(seq))
    job = TraceJob(sock, target)
    tracer.add(job)
    now = 100.0
    tracer.tick(now)
    assert sock.sent[-1] == (("10.0.0.2", verbs.ROCE_V2_PORT), 1)  # the RoCE 5-tuple, TTL 1
    for router in ("10.1.0.1", "10.2.0.1"):  # leaf and spine answer
        assert tracer.on_icmp(sock.port, _icmp(router, ("10.0.0.2", verbs.ROCE_V2_PORT)), now)
    # TTL 3 reaches the far leaf... which answers too; TTL 4 reaches the peer's NIC: silence, and TTL 5
    assert tracer.on_icmp(sock.port, _icmp("10.3.0.1", ("10.0.0.2", verbs.ROCE_V2_PORT)), now)
    while not job.finished:
        now += STEP_TIMEOUT + 0.01
        tracer.tick(now)
        assert now < 200
    assert job.fwd == ["10.1.0.1", "10.2.0.1", "10.3.0.1"] and job.fwd_done and job.rev == []
    assert [ttl for _, ttl in sock.sent] == [1, 2, 3] + [4] * STEP_TRIES + [5] * STEP_TRIES  # no reverse phase
    assert tracer.take_done() == [job]


def test_a_roce_trace_with_a_known_router_count_ends_at_the_last_router():
    from hostprobe.trace import Dest
    sock = _TraceSock(0xC124)
    seq = iter(range(1, 10**6))
    tracer = Tracer(b"k" * 16, 1, 8, 1e6, lambda: next(seq))
    dest = ("10.0.0.2", verbs.ROCE_V2_PORT)
    job, short = TraceJob(sock, Dest(*dest, known_hops=3)), TraceJob(_TraceSock(0xC125), Dest(*dest, known_hops=3))
    for j in (job, short):
        tracer.add(j)
    tracer.tick(100.0)
    for router in ("10.1.0.1", "10.2.0.1", "10.3.0.1"):  # the steer's trace: the prober knows 3 routers
        assert tracer.on_icmp(sock.port, _icmp(router, dest), 100.0)
    assert job.finished and job.fwd_done and job.fwd == ["10.1.0.1", "10.2.0.1", "10.3.0.1"]
    assert [ttl for _, ttl in sock.sent] == [1, 2, 3]  # no silent TTLs waited for
    # a silent router on the way: not done at TTL 3, the two silent TTLs still end it
    assert tracer.on_icmp(short.sock.port, _icmp("10.1.0.1", dest), 100.0)
    now = 100.0
    while short.ttl < 3:
        now += STEP_TIMEOUT + 0.01
        tracer.tick(now)
    assert tracer.on_icmp(short.sock.port, _icmp("10.3.0.1", dest), now)
    assert not short.finished and short.fwd == ["10.1.0.1", None, "10.3.0.1"]
