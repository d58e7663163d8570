"""Network-effect clock sync: the solve against synthetic truth (nms/clock_solve.py), the service's
clock job, GET /clock, corrected probe windows, `nms clock`."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.local_daemons import free_port
from nms.app.service import Service
from nms.clock_solve import clock_offset, correct_window, slot_of, solve, solve_window
from nms.records import ClockSolution, ProbeWindow
from tests._clocktruth import W_NS, W_S, Fabric, ProbedFabric, random_peers, ring_with_chords
from tests.helpers import auth, make_config, wait_until

REF = 850_000_000 * W_NS  # a slot start (2026)
NOISE = 20.0


def _edges(fabric, links, rng, noise=NOISE, both=True, method="svm"):
    out = [fabric.edge(a, b, REF, rng, noise, method=method) for a, b in links]
    if both:
        out += [fabric.edge(b, a, REF, rng, noise, method=method) for a, b in links]
    return out


def _errors(solutions, truth):
    by_host = {s.host: s for s in solutions}
    assert set(by_host) == set(truth)
    off = np.array([by_host[h].offset_ns - truth[h][0] for h in truth])
    drift = np.array([by_host[h].drift_ppb - truth[h][1] for h in truth])
    return off, drift


@pytest.fixture
def rng():
    return np.random.default_rng(20260101)


def test_solution_matches_truth_within_a_few_sigmas(rng):
    fabric = Fabric.random(60, rng, REF)
    edges = _edges(fabric, ring_with_chords(60, 90, rng), rng)
    result = solve(edges, REF, W_S)
    assert result.converged and result.components == 1 and not result.dropped
    assert result.edges_used == len(edges) == 300 and result.ignored == 0
    off, drift = _errors(result.solutions, fabric.truth())
    # each host averages ~10 edge estimates: errors well under the 20 ns per-edge noise
    assert np.sqrt(np.mean(off ** 2)) < NOISE / 2 and np.abs(off).max() < 3 * NOISE
    assert np.sqrt(np.mean(drift ** 2)) < NOISE and np.abs(drift).max() < 4 * NOISE
    assert abs(sum(s.offset_ns for s in result.solutions)) < 1e-3 * 60  # the gauge: mean offset 0
    assert abs(sum(s.drift_ppb for s in result.solutions)) < 1e-3 * 60
    bounds = np.array([s.bound_ns for s in result.solutions])
    assert all(s.window_start == REF and s.component == 0 for s in result.solutions)
    # the smallest edge bound (20 ns, possibly common to all the host's edges) + 3 standard errors
    assert np.all(np.abs(off) <= bounds) and NOISE < bounds.min() and bounds.max() < 8 * NOISE
    # pairwise offsets at another time within the slot, drift-extrapolated
    sols = {s.host: s for s in result.solutions}
    t = REF + W_NS
    truth = fabric.truth()
    for a, b in ((0, 1), (5, 40), (59, 17)):
        ha, hb = fabric.hosts[a], fabric.hosts[b]
        expected = (truth[hb][0] - truth[ha][0]) + (truth[hb][1] - truth[ha][1]) * 2.0
        assert clock_offset(sols, ha, hb, t) == pytest.approx(expected, abs=4 * NOISE)
    assert clock_offset(sols, "h0", "nobody", t) is None


def test_bounds_hold_through_standing_queues_path_asymmetry_and_drift():
    """End to end, agent estimator to solve: 12 hosts with hidden clocks (+-10 ms, +-50 ppm), each
    probing 4 random peers at 20 exchanges/s; constant path asymmetry of up to 100 ns each way;
    two hosts whose egress sits in a standing queue (up to 50 and 30 us, on 90 % of the time:
    purity cannot see it, and it biases every edge of the host the same way); one direction of
    one pair 5 us longer from t = 10 s (a path moved). After the agents' 30 s of margin warm-up,
    >= 99 % of the true pairwise errors (all pairs of a solve and component, at the slot's middle)
    lie within bound_a + bound_b, and the median bound is within 20 x the median error. The bound
    that was the fit's standard error (20-105 ns in issue 28) is far below the errors here: their
    p99 is microseconds. (Seeds 5-10 of this scenario: 98.1-100 % covered, bound/error 6-10 x.)"""
    rng = np.random.default_rng(20261126)
    fabric = Fabric.random(12, rng, REF)
    probed = ProbedFabric(fabric, random_peers(12, 4, rng), rng, loaded={0: 50_000.0, 3: 30_000.0}, busy=0.9,
                          shift=(1, 2, 5_000.0, 10.0))
    slots: dict[int, list] = {}
    for e in probed.clock_edges(52):
        slots.setdefault(slot_of(e.window_start, W_S), []).append(e)
    errors, bounds = [], []
    for slot in sorted(slots)[17:]:  # MARGIN_WARMUP (15 windows) and the first, partial ones
        result = solve(slots[slot], slot * W_NS, W_S)
        sols = {s.host: s for s in result.solutions}
        assert len(sols) == 12 and result.components == 1 and result.unchecked == 0
        t = slot * W_NS + W_NS // 2
        for i, j in itertools.combinations(range(12), 2):
            a, b = sols[fabric.hosts[i]], sols[fabric.hosts[j]]
            errors.append(abs(clock_offset(sols, a.host, b.host, t) - probed.pair_truth(i, j, t)))
            bounds.append(a.bound_ns + b.bound_ns)
    errors_a, bounds_a = np.array(errors), np.array(bounds)
    assert len(errors_a) >= 500 and np.percentile(errors_a, 99) > 1_000  # the queues do bias
    assert np.mean(errors_a <= bounds_a) >= 0.99
    assert np.median(bounds_a) < 20 * np.median(errors_a)


def test_a_component_whose_edges_form_a_tree_is_not_solved(rng):
    """Nothing checks an edge that is the only link between its hosts: a path of one-way edges
    gets no solutions (a ring beside it does)."""
    fabric = Fabric.random(8, rng, REF)
    ring = [(i, (i + 1) % 4) for i in range(4)]
    path = [(4, 5), (5, 6), (6, 7)]
    result = solve(_edges(fabric, ring, rng, both=False) + _edges(fabric, path, rng, both=False), REF, W_S)
    assert sorted(s.host for s in result.solutions) == ["h0", "h1", "h2", "h3"]
    assert result.unchecked == 4 and result.components == 1
    assert {s.component for s in result.solutions} == {0}


def test_second_pass_matters_at_large_offset_times_drift(rng):
    # +-10 ms offsets with +-50 ppm drifts: evaluating each edge at the slot middle of the wrong
    # clock is up to 10 ms x 100 ppm = 1 us off; only the second pass (x_a known) gets it right
    fabric = Fabric.random(40, rng, REF)
    edges = _edges(fabric, ring_with_chords(40, 40, rng), rng)
    one, _ = _errors(solve(edges, REF, W_S, passes=1).solutions, fabric.truth())
    two, _ = _errors(solve(edges, REF, W_S, passes=2).solutions, fabric.truth())
    assert np.abs(one).max() > 150  # ns
    assert np.abs(two).max() < 3 * NOISE
    # with small offsets the first pass was already right: the error above is offset x drift
    calm = Fabric(fabric.hosts, fabric.o / 1000, fabric.r, REF)
    calm_edges = _edges(calm, ring_with_chords(40, 40, rng), rng)
    calm_one, _ = _errors(solve(calm_edges, REF, W_S, passes=1).solutions, calm.truth())
    assert np.abs(calm_one).max() < 3 * NOISE


def test_poisoned_edge_is_dropped_and_moves_nobody(rng):
    fabric = Fabric.random(30, rng, REF)
    edges = _edges(fabric, ring_with_chords(30, 30, rng), rng)
    clean = {s.host: s for s in solve_window(edges, REF, W_S)}
    bad = edges[7]
    poisoned = edges[:7] + [bad.model_copy(update={"offset_ns": bad.offset_ns + 50_000})] + edges[8:]
    result = solve(poisoned, REF, W_S)
    assert result.dropped == [(bad.host_a, bad.host_b)]
    assert result.edges_used == len(edges) - 1
    without = {s.host: s for s in solve_window(edges[:7] + edges[8:], REF, W_S)}
    for s in result.solutions:  # the same as if the edge had never been sent
        assert s.offset_ns == pytest.approx(without[s.host].offset_ns, abs=0.5)
        assert abs(s.offset_ns - clean[s.host].offset_ns) < NOISE
    # a step in one edge's drift (the clock stepped during the window) is dropped too
    stepped = edges[:3] + [edges[3].model_copy(update={"drift_ppb": edges[3].drift_ppb + 20_000})] + edges[4:]
    assert solve(stepped, REF, W_S).dropped == [(edges[3].host_a, edges[3].host_b)]
    # without the robust rounds the poison spreads over several us
    naive = {s.host: s for s in solve(poisoned, REF, W_S, max_rounds=0).solutions}
    assert max(abs(naive[h].offset_ns - clean[h].offset_ns) for h in clean) > 5_000


def test_components_are_solved_separately(rng):
    fabric = Fabric.random(20, rng, REF)
    links = ring_with_chords(12, 10, rng) + ring_with_chords(8, 6, rng, offset=12)
    result = solve(_edges(fabric, links, rng), REF, W_S)
    assert result.components == 2
    first, second = list(range(12)), list(range(12, 20))
    assert len({result.component[fabric.hosts[i]] for i in first}) == 1
    assert len({result.component[fabric.hosts[i]] for i in second}) == 1
    assert result.component["h0"] != result.component["h12"]
    sols = {s.host: s for s in result.solutions}
    for idx in (first, second):  # each component's fabric time is the mean of its own clocks
        truth = fabric.truth(idx)
        assert abs(sum(sols[fabric.hosts[i]].offset_ns for i in idx)) < 1e-3 * len(idx)
        for h, (x, _) in truth.items():
            assert abs(sols[h].offset_ns - x) < 3 * NOISE


def test_one_direction_and_method_and_slot_selection(rng):
    fabric = Fabric.random(10, rng, REF)
    links = ring_with_chords(10, 5, rng)
    svm = _edges(fabric, links, rng, both=False)
    ntp = _edges(fabric, links, rng, noise=2_000.0, both=False, method="ntp")
    other_slot = [fabric.edge(0, 1, REF + W_NS, rng, NOISE), fabric.edge(2, 2, REF, rng, NOISE)]
    result = solve(svm + ntp + other_slot, REF, W_S)
    assert result.edges_used == len(svm) and result.ignored == len(ntp) + 2
    off, _ = _errors(result.solutions, fabric.truth())
    assert np.abs(off).max() < 4 * NOISE
    ntp_result = solve(svm + ntp, REF, W_S, method="ntp")
    assert ntp_result.edges_used == len(ntp)
    ntp_off, _ = _errors(ntp_result.solutions, fabric.truth())
    assert np.abs(ntp_off).max() < 4 * 2_000 and np.abs(ntp_off).max() > 4 * NOISE
    assert solve_window([], REF, W_S) == []


def test_slot_assignment_tolerates_clock_offsets():
    assert slot_of(REF, W_S) == REF // W_NS
    assert slot_of(REF + 30_000_000, W_S) == slot_of(REF - 30_000_000, W_S) == REF // W_NS
    assert slot_of(REF + W_NS - 1, W_S) == REF // W_NS + 1


def test_correct_window_sign_conventions():
    # dst clock 1 ms ahead of src: forward delays read 1 ms too long, reverse 1 ms too short
    true_owd = 5_000
    offset = 1_000_000.0
    w = ProbeWindow(src_host="a", src_nic="eth0", dst_host="b", dst_nic="eth0", path_id="p", window_start=REF,
                    sent=10, received=10, owd_fwd_min_ns=true_owd + 1_000_000, owd_fwd_p50_ns=true_owd + 1_000_100,
                    owd_fwd_p99_ns=None, owd_rev_min_ns=true_owd - 1_000_000, owd_rev_p50_ns=true_owd - 999_900,
                    owd_rev_p99_ns=true_owd - 990_000)
    c = correct_window(w, offset)
    assert c.clock_offset_ns == offset
    assert (c.owd_fwd_min_corr_ns, c.owd_fwd_p50_corr_ns, c.owd_fwd_p99_corr_ns) == (true_owd, true_owd + 100, None)
    assert (c.owd_rev_min_corr_ns, c.owd_rev_p50_corr_ns, c.owd_rev_p99_corr_ns) == (
        true_owd, true_owd + 100, true_owd + 10_000)
    assert c.owd_fwd_min_ns == w.owd_fwd_min_ns and w.clock_offset_ns is None  # raw kept, original untouched
    point = c.to_point()
    assert point.fields["owd_fwd_min_corr_ns"] == true_owd and point.fields["clock_offset_ns"] == offset
    # clock_offset is clock_b - clock_a: a solution pair that says b is 1 ms ahead gives +1 ms
    sols = {"a": ClockSolution(host="a", window_start=REF, offset_ns=-500_000.0, drift_ppb=0.0, bound_ns=1.0),
            "b": ClockSolution(host="b", window_start=REF, offset_ns=500_000.0, drift_ppb=1000.0, bound_ns=1.0)}
    assert clock_offset(sols, "a", "b", REF) == 1_000_000.0
    assert clock_offset(sols, "a", "b", REF + 2 * 10**9) == 1_002_000.0
    assert clock_offset(sols, "b", "a", REF) == -1_000_000.0


# --- the service: ingest hook, the solve job, GET /clock, corrected windows, `nms clock` ----------


def _window(src, dst, start, fwd, rev, **kw):
    return {"src_host": src, "src_nic": "eth0", "dst_host": dst, "dst_nic": "eth0", "path_id": "p1",
            "window_start": start, "window_s": 1.0, "sent": 10, "received": 10, "owd_fwd_min_ns": fwd,
            "owd_fwd_p50_ns": fwd + 500, "owd_rev_min_ns": rev, "owd_rev_p50_ns": rev + 500, **kw}


def _stored_window(client, src, dst):
    r = client.get("/telemetry/latest", params={"measurement": "probe_window", "tag": [f"src_host={src}",
                                                                                       f"dst_host={dst}"]},
                   headers=auth("read"))
    [series] = r.json()["series"]
    return dict(zip(series["columns"], series["values"][0]))


def test_api_solves_ingested_edges_and_corrects_later_windows(tmp_path, rng):
    service = Service(make_config(tmp_path))
    client = TestClient(create_app(service, manage_lifecycle=False))  # the job is called directly below
    slot = time.time_ns() // W_NS - 5  # ended 8 s ago: due with the default 4 s lag
    ref = slot * W_NS
    fabric = Fabric.random(6, rng, ref)
    links = ring_with_chords(6, 3, rng)
    edges = [fabric.edge(a, b, ref, rng, NOISE) for a, b in links] + [fabric.edge(b, a, ref, rng, NOISE)
                                                                         for a, b in links]
    items = [e.model_dump() for e in edges] + [fabric.edge(0, 1, ref, rng, 500.0, method="ntp").model_dump()]
    r = client.post("/ingest/clock_edges", json={"items": items}, headers=auth("ingest"))
    assert r.json() == {"accepted": len(items), "rejected": []}
    # before any solve: windows are stored as they came
    client.post("/ingest/probe_windows", json={"items": [_window("h0", "h3", ref, 5_000, 6_000)]},
                headers=auth("ingest"))
    assert _stored_window(client, "h0", "h3").get("clock_offset_ns") is None
    status = client.get("/clock", headers=auth("read")).json()
    assert status["hosts"] == [] and status["last_solve"] is None
    assert status["pending_edges"] == len(edges) and status["ignored_edges"] == 1  # the ntp edge

    [result] = service.clock.solve_due()
    assert len(result.solutions) == 6 and service.clock.solve_due() == []  # a slot is solved once

    status = client.get("/clock", headers=auth("read")).json()
    last = status["last_solve"]
    assert (last["hosts"], last["components"], last["edges_used"], last["edges_dropped"]) == (6, 1, len(edges), 0)
    assert last["slot_start_ns"] == ref and last["method"] == "svm" and status["pending_edges"] == 0
    assert last["hosts_unchecked"] == 0 and all(h["component"] == 0 for h in status["hosts"])
    truth = fabric.truth()
    assert [h["host"] for h in status["hosts"]] == sorted(truth)
    for h in status["hosts"]:
        assert abs(h["offset_ns"] - truth[h["host"]][0]) < 4 * NOISE
        assert h["window_start"] == ref and h["in_last_solve"] and 6 < h["age_s"] < 60
    only = client.get("/clock", params={"host": ["h2"]}, headers=auth("read")).json()
    assert [h["host"] for h in only["hosts"]] == ["h2"]
    stored = client.get("/telemetry/latest", params={"measurement": "clock_solution"}, headers=auth("read")).json()
    assert len(stored["series"]) == 6

    # a window of h0 -> h3 half a second into the slot: corrected with clock_h3 - clock_h0 then
    start = ref + 500_000_000
    offset = (truth["h3"][0] - truth["h0"][0]) + (truth["h3"][1] - truth["h0"][1]) * 1.0  # at the middle (+1 s)
    true_fwd, true_rev = 4_000, 4_200
    window = _window("h0", "h3", start, round(true_fwd + offset), round(true_rev - offset))
    far = _window("h1", "h2", ref + 120 * 10**9, 1, 1)  # 2 min from the solved slot: too old a solution
    stranger = _window("h1", "h99", start, 1, 1)  # h99 has no solution
    r = client.post("/ingest/probe_windows", json={"items": [window, far, stranger]}, headers=auth("ingest"))
    assert r.json()["accepted"] == 3
    row = _stored_window(client, "h0", "h3")
    assert row["clock_offset_ns"] == pytest.approx(offset, abs=4 * NOISE)
    assert abs(row["owd_fwd_min_corr_ns"] - true_fwd) < 4 * NOISE
    assert abs(row["owd_rev_min_corr_ns"] - true_rev) < 4 * NOISE
    assert abs(row["owd_fwd_p50_corr_ns"] - (true_fwd + 500)) < 4 * NOISE
    assert row["owd_fwd_min_ns"] == window["owd_fwd_min_ns"]  # raw delays kept
    assert _stored_window(client, "h1", "h2").get("clock_offset_ns") is None
    assert _stored_window(client, "h1", "h99").get("clock_offset_ns") is None
    metrics = client.get("/metrics", headers=auth("read")).text
    assert 'nms_clock_windows_total{result="corrected"} 1.0' in metrics
    assert f'nms_clock_edges_total{{result="used"}} {len(edges)}.0' in metrics

    # an edge for the solved slot is late: stored, counted, not solved
    r = client.post("/ingest/clock_edges", json={"items": [edges[0].model_dump()]}, headers=auth("ingest"))
    assert r.json()["accepted"] == 1
    assert client.get("/clock", headers=auth("read")).json()["late_edges"] == 1
    assert service.clock.solve_due() == []

    # an API worker of a cluster (no `correlate`: it does not solve) shows what the solving member stored
    worker = Service(make_config(tmp_path / "worker"), store=service.store, roles=frozenset({"api"}))
    shown = TestClient(create_app(worker, manage_lifecycle=False)).get("/clock", headers=auth("read")).json()
    assert shown["last_solve"] is None
    assert [(h["host"], h["window_start"], round(h["offset_ns"], 3)) for h in shown["hosts"]] == [
        (h["host"], h["window_start"], round(h["offset_ns"], 3)) for h in status["hosts"]]
    worker.state.close()
    service.store.close()
    service.state.close()


def test_clock_disabled_leaves_everything_alone(tmp_path, rng):
    service = Service(make_config(tmp_path, clock={"enabled": False}))
    client = TestClient(create_app(service, manage_lifecycle=False))
    ref = (time.time_ns() // W_NS - 5) * W_NS
    fabric = Fabric.random(3, rng, ref)
    items = [fabric.edge(0, 1, ref).model_dump(), fabric.edge(1, 2, ref).model_dump()]
    assert client.post("/ingest/clock_edges", json={"items": items}, headers=auth("ingest")).json()["accepted"] == 2
    assert service.clock.solve_due() == [] and client.get("/clock", headers=auth("read")).json()["enabled"] is False
    service.store.close()
    service.state.close()


def test_serve_runs_the_clock_job_and_the_cli_shows_it(tmp_path, rng):
    """The real process: the scheduled job solves ingested edges; `nms clock` prints the table."""
    port = free_port()
    token = "clock-cli-token-0123456789abcdef"
    config = tmp_path / "nms.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "clock": {"solve_lag": "100ms"},
                                      "api": {"port": port, "tokens": [{"name": "admin", "scopes": ["admin"],
                                                                        "token": token}]}}))
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(config)], stdout=log,
                            stderr=subprocess.STDOUT)
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        _wait(lambda: httpx.get(f"{url}/health", timeout=0.5).status_code == 200, tmp_path)
        ref = (time.time_ns() // W_NS - 2) * W_NS
        fabric = Fabric.random(4, rng, ref, prefix="gpu")
        edges = [fabric.edge(a, b, ref, rng, NOISE).model_dump() for a, b in ((0, 1), (1, 2), (2, 3), (3, 0), (0, 2))]
        assert httpx.post(f"{url}/ingest/clock_edges", json={"items": edges}, headers=headers).status_code == 200
        _wait(lambda: httpx.get(f"{url}/clock", headers=headers).json()["last_solve"] is not None, tmp_path)
        env = {k: v for k, v in os.environ.items() if k not in ("NMS_TOKEN", "NMS_URL")}
        env.update(NMS_URL=url, NMS_TOKEN=token, COLUMNS="200")
        out = subprocess.run([sys.executable, "-m", "nms", "clock", "--json"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        truth = fabric.truth()
        assert {h["host"]: round(h["offset_ns"] / 100) for h in status["hosts"]} == pytest.approx(
            {h: round(x / 100) for h, (x, _) in truth.items()}, abs=1)
        table = subprocess.run([sys.executable, "-m", "nms", "clock"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert table.returncode == 0, table.stderr
        assert all(h in table.stdout for h in truth) and "4 hosts in 1 component(s), 5 svm edges used" in table.stdout
        assert "us" in table.stdout and "ppm" in table.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _wait(check, tmp_path, timeout=15.0):
    wait_until(check, timeout, 0.1, what="the served clock", why=lambda: (tmp_path / "server.log").read_text()[-3000:],
               ignore=(httpx.HTTPError,))
