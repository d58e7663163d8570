"""The probe agents on the real 2x2x2 lab, against a real `nms serve`: discovered paths, loss, one-way
delay under congestion, link-down events, forged packets, a service restart.

Expected paths come from the kernel itself (`ip route get ... sport S dport D` on the leaves via
lab.paths.predict), never from the agents' own answers. Switches answer traceroute from the
interface a packet came in by, so a hop address names the link: the source leaf's host port, the
spine's port facing the source leaf, the destination leaf's port facing that spine.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest
from lab_helpers import skip_reason

from hostprobe import wire
from hostprobe.config import ProbeSettings
from lab import faults, netns, paths, traffic
from lab.inventory import probe_key_file
from lab.mesh import MeshLab, legs_through  # the harness the agent benchmarks share

pytestmark = pytest.mark.root
PORT = 33434  # the agents' probe port (default)
HOSTS = ("host1", "host2", "host3", "host4")


@pytest.fixture(scope="module")
def mesh():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    m = MeshLab("nmsp-", "198.18.249.0/24")
    try:
        m.up()
        m.t0 = time.time_ns()
        m.wait_traced()
        yield m
    finally:
        m.down()


def hop_addresses(topo, src: str, dst: str, sport: int, dport: int) -> list[str]:
    """The router interfaces a datagram from src:sport to dst:dport enters, as the kernel routes it."""
    s_leaf, d_leaf = topo.link_of_port(src, "eth0").a, topo.link_of_port(dst, "eth0").a
    hops = [s_leaf.ip]
    spine = paths.predict(topo, src, dst, "udp", sport, dport)["spine"]
    if spine:
        hops.append(topo.find_link(f"{s_leaf.node}-{spine}").end(spine).ip)
        hops.append(topo.find_link(f"{d_leaf.node}-{spine}").end(d_leaf.node).ip)
    return hops


def probed_paths(mesh) -> dict[tuple[str, str, str], int]:
    return mesh.probed_paths()


def test_discovered_paths_match_kernel_routes_for_every_source_port(mesh):
    rows = mesh.query("probe_path", mesh.t0)
    topo = mesh.topo
    seen = set()
    for r in rows:
        src, dst = r["src_host"], r["dst_host"]
        assert r["fwd_complete"] and r["rev_complete"], r
        for sport in map(int, r["sports"].split(",")):
            seen.add((src, dst, sport))
            assert r["fwd_hops"].split(",") == hop_addresses(topo, src, dst, sport, PORT), (src, dst, sport)
            assert r["rev_hops"].split(",") == hop_addresses(topo, dst, src, PORT, sport), (dst, src, sport)
    pairs = {(s, d) for s, d, _ in seen}
    assert pairs == {(s, d) for s in HOSTS for d in HOSTS if s != d}
    per_pair = {pair: sum(1 for s, d, _ in seen if (s, d) == pair) for pair in pairs}
    assert set(per_pair.values()) == {32}, per_pair  # every source port of every agent was traced
    # every ECMP path is probed: both spines between hosts under different leaves
    for (src, dst, _pid), sport in probed_paths(mesh).items():
        assert (src, dst, sport) in seen
    spines = {}
    for (src, dst, _pid), sport in probed_paths(mesh).items():
        spines.setdefault((src, dst), set()).add(paths.predict(topo, src, dst, "udp", sport, PORT)["spine"])
    for (src, dst), got in spines.items():
        same_leaf = topo.link_of_port(src, "eth0").a.node == topo.link_of_port(dst, "eth0").a.node
        assert got == ({None} if same_leaf else {"spine1", "spine2"}), (src, dst, got)


def _windows(mesh, start: int, end: int) -> dict[tuple[str, str, str], list[dict]]:
    out: dict = {}
    for r in mesh.query("probe_window", start, end):
        out.setdefault((r["src_host"], r["dst_host"], r["path_id"]), []).append(r)
    return out


def _settle(seconds: float) -> tuple[int, int]:
    """Sleep; return the range of whole windows inside the sleep."""
    start = (time.time_ns() // 10**9 + 1) * 10**9
    time.sleep(seconds)
    end = (time.time_ns() // 10**9) * 10**9
    return start, end


def _closed(mesh, end: int) -> None:
    """Wait until windows up to `end` are closed (1 s + timeout) and reported (1 s batches)."""
    time.sleep(max(0.0, (end - time.time_ns()) / 1e9) + 3.5)


def test_silent_loss_shows_on_exactly_the_paths_through_the_link(mesh):
    probers = ["host1", "host3"]
    mesh.command("set_rate", {"rate": 60}, hosts=probers)
    time.sleep(1.0)
    f = faults.inject(mesh.dir, "loss", "leaf1-spine1", percent=20.0, from_node="leaf1")
    try:
        time.sleep(1.0)
        start, end = _settle(5.0)
    finally:
        faults.heal(mesh.dir, f["id"])
        mesh.command("set_rate", {"rate": ProbeSettings.model_fields["rate"].default}, hosts=probers)
    _closed(mesh, end)
    sport_of = probed_paths(mesh)
    checked = 0
    for (src, dst, pid), rows in _windows(mesh, start, end).items():
        if src not in probers or (src, dst, pid) not in sport_of:
            continue
        sent = sum(r["sent"] for r in rows)
        loss = 1 - sum(r["received"] for r in rows) / sent
        assert sent >= 200, (src, dst, pid, sent)
        through = bool(legs_through(mesh.topo, src, dst, sport_of[(src, dst, pid)], "leaf1-spine1",
                                    ("leaf1", "spine1")))
        if through:
            assert 0.12 <= loss <= 0.28, (src, dst, pid, loss)  # 20% +- 8 (sd ~2.5 at 300 exchanges)
        else:
            assert loss <= 0.02, (src, dst, pid, loss)
        checked += through
    assert checked == 4  # host1 -> host3/host4 forward, host3 -> host1/host2 reverse, via spine1


def test_congested_link_inflates_one_way_delay_in_the_loaded_direction_only(mesh):
    # the load: UDP host1 -> host3 via spine1 at 30 Mbit/s into a 10 Mbit/s cut of leaf1 -> spine1
    f = faults.inject(mesh.dir, "congestion", "leaf1-spine1", rate="10M", from_node="leaf1")
    base_start, base_end = _settle(0.0)
    base_start -= 3 * 10**9
    load = threading.Thread(target=traffic.run, args=(mesh.dir, "pairs"),
                            kwargs=dict(pairs=["host1:host3"], proto="udp", rate="30M", duration=6.0, via="spine1"),
                            daemon=True)
    try:
        load.start()
        time.sleep(2.0)
        start, end = _settle(3.0)
        load.join(30)
    finally:
        faults.heal(mesh.dir, f["id"])
    _closed(mesh, end)
    before, during = _windows(mesh, base_start, base_end), _windows(mesh, start, end)
    sport_of = probed_paths(mesh)
    seen = {"fwd": 0, "rev": 0}
    for key, rows in during.items():
        src, dst, _ = key
        if key not in sport_of or key not in before:
            continue
        loaded = legs_through(mesh.topo, src, dst, sport_of[key], "leaf1-spine1", ("leaf1", "spine1"))
        for d in ("fwd", "rev"):
            base = min(r[f"owd_{d}_p50_ns"] for r in before[key] if r[f"owd_{d}_p50_ns"] is not None)
            now = sorted(r[f"owd_{d}_p50_ns"] for r in rows if r[f"owd_{d}_p50_ns"] is not None)
            assert now, (key, d)
            inflation = now[len(now) // 2] - base
            if d in loaded:
                seen[d] += 1
                assert inflation > 2_000_000, (key, d, inflation)  # TBF queue: up to 20 ms
            else:
                assert inflation < 500_000, (key, d, inflation)
    # host1/host2 -> host3/host4 via spine1 forward; host3/host4 -> host1/host2 via spine1 in reply
    assert seen == {"fwd": 4, "rev": 4}, seen


def test_link_down_sends_path_events_for_every_affected_path_and_no_other(mesh):
    sport_of = probed_paths(mesh)
    affected = {k for k, sp in sport_of.items() if legs_through(mesh.topo, k[0], k[1], sp, "leaf2-spine2")}
    assert len(affected) == 8  # 4 hosts x the peers under the other leaf, via spine2 (both directions)
    f = faults.inject(mesh.dir, "link-down", "leaf2-spine2")
    try:
        time.sleep(2.5)
    finally:
        faults.heal(mesh.dir, f["id"])
    time.sleep(2.5)
    events = mesh.query("path_event", f["start_ns"] - 10**9)
    down = {(e["src_host"], e["dst_host"], e["path_id"]) for e in events if e["state"] == "down"}
    up = {(e["src_host"], e["dst_host"], e["path_id"]) for e in events if e["state"] == "up"}
    assert down == affected
    assert up == affected
    for e in events:
        if e["state"] == "down":
            assert 0.5e9 < e["time"] - f["start_ns"] < 1.6e9, e  # down_after (1 s) after the last reply


def test_forged_and_foreign_probes_are_dropped_and_counted(mesh):
    key = probe_key_file(mesh.dir).read_text().strip().encode()
    target = (mesh.topo.link_of_port("host1", "eth0").b.ip, PORT)
    before = mesh.agent_status()["host1"]["stats"]
    with netns.entered(mesh.topo.netns("host2")):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((mesh.topo.link_of_port("host2", "eth0").b.ip, 0))
        s.settimeout(0.5)
        good = wire.encode(key, wire.PROBE, 12345, 7)
        s.sendto(good, target)  # control: the real key gets an answer
        assert wire.decode(key, s.recv(2048)).type == wire.REPLY
        followup = wire.decode(key, s.recv(2048))  # t3, the reply's kernel TX stamp
        assert followup.type == wire.FOLLOWUP and followup.entries[0][0] == 7 and followup.entries[0][1] > 0
        forged = [wire.encode(b"not-the-fabric-key-000", wire.PROBE, 12345, 8 + i) for i in range(5)]
        tampered = bytearray(good)
        tampered[20] ^= 1  # flip a bit of the session: the MAC no longer matches
        for pkt in [*forged, bytes(tampered), b"\x00" * 60, b"GET / HTTP/1.0\r\n\r\n"]:
            s.sendto(pkt, target)
        with pytest.raises(socket.timeout):
            s.recv(2048)  # nothing answered
    finally:
        s.close()
    time.sleep(2.5)  # the agent's stats period in the lab is 2 s
    after = mesh.agent_status()["host1"]["stats"]
    assert after.get("rx_forged", 0) - before.get("rx_forged", 0) == 6
    assert after.get("rx_foreign", 0) - before.get("rx_foreign", 0) == 2
    assert after["probes_answered"] > before["probes_answered"]


def test_nic_down_is_reported_by_netlink_at_once(mesh):
    before = time.time_ns()
    f = faults.inject(mesh.dir, "nic-down", "host4")
    try:
        time.sleep(1.5)
    finally:
        faults.heal(mesh.dir, f["id"])
    time.sleep(2.5)
    samples = mesh.query("host_nic", before - 10 * 10**9, host="host4", nic="eth0")
    assert any(s["rx_bytes"] for s in samples)  # the periodic sysfs counters
    states = [(s["time"], s["oper_status"]) for s in samples if s["time"] >= f["start_ns"]]
    down = [t for t, st in states if st == "down"]
    assert down and down[0] - f["start_ns"] < 0.5e9, states  # the netlink event, not the next period
    assert any(st == "up" and t > down[0] for t, st in states), states
    events = [e for e in mesh.query("path_event", f["start_ns"], src_host="host4") if e["state"] == "down"]
    assert events and all("local NIC eth0" in e["reason"] and e["time"] - f["start_ns"] < 0.5e9 for e in events)
    assert {e["path_id"] for e in events} == {pid for (src, _, pid) in mesh.probed_paths() if src == "host4"}


def test_windows_survive_a_service_restart(mesh):
    time.sleep(1.0)
    stopped = time.time_ns()
    mesh.stop_service()
    time.sleep(4.0)
    mesh.start_service()
    restarted = time.time_ns()
    time.sleep(6.0)
    rows = _windows(mesh, stopped - 2 * 10**9, restarted + 2 * 10**9)
    sport_of = probed_paths(mesh)
    assert rows
    for key in sport_of:
        starts = sorted(r["time"] for r in rows.get(key, []))
        expected = list(range(starts[0], starts[-1] + 1, 10**9)) if starts else []
        assert starts and starts == expected, (key, len(starts))  # no missing second
        assert starts[0] <= stopped - 10**9 and starts[-1] >= restarted + 10**9, key
    replayed = sum(a["stats"].get("batches_replayed", 0) for a in mesh.agent_status().values())
    assert replayed > 0


def test_clock_sync_follows_an_injected_clock_error_across_its_step(mesh):
    """host2's clock jumps 3 ms and drifts 20 ppm (the lab's clock fault: host2's agent applies it
    to every stamp). No estimate mixes stamps from both sides of the step: every edge of a window
    that ends after it is within 50 us (a mixed one is ~3 ms off) of the truth before the step (no
    clock error: a window with only earlier exchanges) or of the new one, from both sides of every
    pair, and the SVM edges within 2 us at the median."""
    S = 10**9
    f = faults.inject(mesh.dir, "clock", "host2", offset_us=3000.0, drift_ppm=20.0)
    try:
        time.sleep(14.0)  # 2 s windows, complete ~3 s after their end, then reported
        state = mesh.dir.load()
        assert mesh.agent_status()["host2"]["stats"].get("clock_steps", 0) >= 1
        edges = [e for e in mesh.query("clock_edge", f["start_ns"] - 4 * S)
                 if "host2" in (e["host_a"], e["host_b"])]

        def truth(a: str, b: str, local_a: int) -> float:  # clock_b - clock_a when a's clock reads local_a
            t = local_a - faults.clock_error_ns(state, a, local_a)
            return faults.clock_error_ns(state, b, t) - faults.clock_error_ns(state, a, t)

        after = []
        for e in edges:
            end = e["time"] + 2 * S - faults.clock_error_ns(state, e["host_a"], e["time"])  # real, about
            if end > f["start_ns"] + 10**7:
                est = e["offset_ns"] + e["drift_ppb"] * 1.0  # at the window's middle
                err = min(abs(est), abs(est - truth(e["host_a"], e["host_b"], e["time"] + S)))
                # with the edge's own bound and window, so a failure says whether it claimed to be this good
                after.append((err, e["method"], e["host_a"], e["host_b"], e.get("bound_ns"), e["time"] - f["start_ns"]))
        svm = [x[0] for x in after if x[1] == "svm"]
        assert {x[2] for x in after if x[1] == "svm"} >= {"host2", "host1"}  # both sides of the pair
        # a window mixing both sides of the step would be ~3 ms off: no edge, SVM or the NTP-style
        # baseline, is more than 50 us off. The SVM's own accuracy by its median (tens to hundreds
        # of ns here): single SVM windows reached 14-23 us in one full suite run on 2 loaded cores
        # (two of 32 each time, twice in a row; not reproduced alone or beside the no-deadline tests)
        assert len(svm) >= 8 and statistics.median(svm) < 2_000, sorted(after)
        assert max(x[0] for x in after) < 50_000, sorted(after)
    finally:
        faults.heal(mesh.dir, f["id"])
