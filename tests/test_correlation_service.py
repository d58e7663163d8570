"""The correlator inside the service, without the lab: agents' telemetry through POST /ingest, the
scheduled `correlate` job, incidents in the API, a job attached, resolution when the fault heals,
and a webhook delivery to a real local receiver. The lab tests (tests/lab/test_correlator_lab.py)
do the same with real agents and real faults, as root."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from nms.app.api import create_app
from nms.app.service import Service
from tests._fabric_synth import NS, Synth
from tests._notify import Receiver
from tests.helpers import auth, make_config, wait_until

SECOND = 10**9


KIND = {"probe_window": "probe_windows", "path_event": "path_events", "probe_path": "probe_paths"}


def _post(client: TestClient, records: list) -> None:
    """Post records as agents do: one batch per kind."""
    for measurement, kind in KIND.items():
        items = [r.model_dump(mode="json", exclude_none=True) for r in records if r.measurement == measurement]
        if items:
            r = client.post(f"/ingest/{kind}", json={"items": items}, headers=auth("ingest"))
            assert r.status_code == 200 and r.json()["rejected"] == [], r.text


def _until(predicate, timeout: float = 10.0):
    return wait_until(predicate, timeout, 0.1, what="the service")


def test_ingested_telemetry_opens_an_incident_that_resolves_and_is_delivered(tmp_path):
    synth = Synth()
    link = synth.up_link(2, 1).split("->")
    cable = "--".join(sorted(link))
    rx = Receiver()
    config = make_config(tmp_path, fabric=synth.fabric.model_dump(mode="json", exclude_none=True),
                         thresholds={"resolve_after_clean_windows": 2}, polling={"enabled": False},
                         notifications={"sinks": [{"name": "noc", "kind": "webhook", "url": rx.url("/hook"),
                                                   "secret": "s3cret"}], "backoff_initial": "0.1s"})
    service = Service(config)
    try:
        with TestClient(create_app(service)) as client:
            now = time.time_ns() // SECOND
            service.correlation.add(synth.inventory_records(now - 20, with_paths=False), "test")  # the poller's part
            _post(client, synth.inventory_records(now - 20))
            client.post("/jobs", json={"id": "train-1", "hosts": ["host3", "host5"], "start": (now - 60) * NS},
                        headers=auth("ingest")).raise_for_status()
            for t in range(now - 15, now):  # a clean past: delay baselines, no finding
                _post(client, synth.windows(t))
            assert client.get("/incidents", headers=auth("read")).json() == []

            synth.down.add(cable)  # the link fails: its paths' windows come back empty
            t = now
            incident = None
            while incident is None:
                _post(client, synth.windows(t))
                t += 1
                time.sleep(max(0.0, t - time.time_ns() / SECOND))  # real time: the job steps every second
                found = client.get("/incidents", params={"state": "open"}, headers=auth("read")).json()
                incident = found[0] if found else None
                assert t - now < 8, "no incident within 8 s"
            assert (incident["kind"], incident["element"]) == ("link_down", cable)
            assert incident["jobs"] == ["train-1"] and incident["evidence"]["paths_down"] > 0

            synth.down.clear()
            while client.get(f"/incidents/{incident['id']}", headers=auth("read")).json()["state"] != "resolved":
                _post(client, synth.windows(t))
                t += 1
                time.sleep(max(0.0, t - time.time_ns() / SECOND))
                assert t - now < 25, "the incident did not resolve"
            events = client.get(f"/incidents/{incident['id']}/events", headers=auth("read")).json()
            assert [e["event"] for e in events][0] == "opened" and events[-1]["event"] == "resolved"
            hooks = _until(lambda: len(rx.at("/hook")) >= 2 and rx.at("/hook"))
            assert [h.json()["event"] for h in hooks[:2]] == ["opened", "resolved"]
    finally:
        rx.close()


def test_each_new_second_of_windows_triggers_one_step(tmp_path):
    """Steps follow the agents' windows (not a fixed tick): the first batch of a new second steps
    within SETTLE_S; a straggler of the same second waits for the next step."""
    synth = Synth()
    config = make_config(tmp_path, fabric=synth.fabric.model_dump(mode="json", exclude_none=True),
                         polling={"enabled": False}, correlator={"interval": "2s"})  # untriggered: every 3 s
    service = Service(config)
    steps: list[float] = []
    step = service.correlation.step
    service.correlation.step = lambda now_ns=None: (steps.append(time.monotonic()), step(now_ns))[1]
    with TestClient(create_app(service)) as client:
        now = time.time_ns() // SECOND
        _post(client, synth.inventory_records(now - 20))
        for t in range(now - 4, now):
            windows = synth.windows(t)
            time.sleep(0.3)
            before, posted = len(steps), time.monotonic()
            _post(client, windows[: len(windows) // 2])  # the first agents of second t
            _until(lambda before=before: len(steps) > before, timeout=1.0)
            assert steps[-1] - posted < 0.6
            _post(client, windows[len(windows) // 2:])  # the rest, after the step: no step of its own
            time.sleep(0.6)
            assert len(steps) == before + 1
        assert service.correlation.last.findings == 0


def test_the_paths_of_a_link_suspected_of_loss_are_probed_faster_by_their_agents(tmp_path):
    """Focused probing end to end: the correlator suspects a link of 0.5 % loss (p < 1e-4) seconds
    before it can prove it (p < 1e-7), and the service issues `focus` commands (correlator.focus_rate,
    focus_s) to the agents whose paths cross it, each naming that agent's paths."""
    synth = Synth(spines=3, leaves=4, hosts_per_leaf=2, background_loss=1e-4)  # ~240 exchanges/s cross a link
    directed = synth.up_link(2, 1)
    config = make_config(tmp_path, fabric=synth.fabric.model_dump(mode="json", exclude_none=True),
                         polling={"enabled": False}, correlator={"focus_rate": 50, "focus_s": "30s"})
    service = Service(config)

    def focus_commands() -> list[dict]:
        r = client.get("/agents/commands", params={"limit": 1000}, headers=auth("read"))
        assert r.status_code == 200, r.text
        return [c for c in r.json() if c["kind"] == "focus"]

    with TestClient(create_app(service)) as client:
        now = time.time_ns() // SECOND
        service.correlation.add(synth.inventory_records(now - 20, with_paths=False), "test")  # the poller's part
        _post(client, synth.inventory_records(now - 20))
        for t in range(now - 15, now):  # a clean past
            _post(client, synth.windows(t))
        synth.loss[directed] = 0.005
        crossing = {(synth.keys[i][0], synth.keys[i][4]) for i in synth.paths_through(directed)}
        t = now
        while not crossing <= (asked := {(c["host"], p) for c in focus_commands() for p in c["args"]["paths"]}):
            time.sleep(max(0.0, t + 1.05 - time.time_ns() / SECOND))  # as agents do: a window once it ended
            _post(client, synth.windows(t))
            t += 1
            assert t - now < 30, (f"the paths crossing {directed} were not focused within 30 s: {asked}",
                                  client.get("/incidents", headers=auth("read")).json())
        assert client.get("/incidents", headers=auth("read")).json() == []  # not proven yet
        commands = focus_commands()
        assert all(c["by"] == "correlator" and c["args"]["rate"] == 50 and c["args"]["for_s"] == 30
                   for c in commands), commands
        # a link the lossy paths also cross may be focused too (its own evidence clears it), not more
        assert len(asked) < len(synth.keys) / 2, asked
