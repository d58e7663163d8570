"""A `correlate` member in its own process takes its telemetry from the bus: agents' batches -> an
`nms serve --role api` process -> NATS JetStream -> an `nms serve --role correlate` process, which
opens the incident in the shared PostgreSQL state, where the API reads it. The input is the
single-process test's (tests/test_correlation_service.py: a synthetic fabric, one link down), and so
must the incident be. Killed with SIGKILL while the fault goes on and started again, the member goes
on from its durable consumer's position: every message acknowledged, the incident not opened twice
and continued by the restarted member (once the agents' retrace re-sent the probe paths).

Real parts: nats-server with JetStream (tests/_nats.py), influxd (each member's store), PostgreSQL
(tests/_postgres.py), the service's own CLI as subprocesses."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import httpx
import yaml
from test_cluster_write import Member, members  # noqa: F401  (the members fixture)

from nms.app.service import Service
from nms.app.telemetry_bus import FAMILIES, stream_name
from tests._fabric_synth import Synth
from tests.helpers import auth, make_config, wait_until

PREFIX = "tw"  # test_cluster_write's Member
SECOND = 10**9
KIND = {"probe_window": "probe_windows", "path_event": "path_events", "probe_path": "probe_paths"}


def _member(tmp_path, name: str, role: str, influxd, nats_url: str, dsn: str, fabric: dict) -> Member:
    m = Member(tmp_path, name, role, influxd.url, f"t_{uuid.uuid4().hex[:12]}", nats_url)
    doc = yaml.safe_load(m.config.read_text())
    doc.update(fabric=fabric, state={"backend": "postgresql", "dsn": dsn},
               correlator={"enabled": True}, thresholds={"resolve_after_clean_windows": 2})
    doc["cluster"]["correlate"] = {"fetch_timeout": 0.2, "ack_wait": 2}
    m.config.write_text(yaml.safe_dump(doc))
    return m


def _post(api: Member, records: list) -> None:
    for measurement, kind in KIND.items():
        items = [r.model_dump(mode="json", exclude_none=True) for r in records if r.measurement == measurement]
        if items:
            r = httpx.post(f"{api.url}/ingest/{kind}", json={"items": items}, headers=auth("ingest"), timeout=30)
            assert r.status_code == 202 and r.json()["rejected"] == [], r.text


def _incidents(api: Member) -> list[dict]:
    r = httpx.get(f"{api.url}/incidents", headers=auth("read"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _single_process(tmp_path, fabric: dict, cable: str, now: int) -> tuple[str, str]:
    """(kind, element) of the first incident the single process (a Service, its own SQLite state)
    opens for the same input through the same entry point (Service.on_ingest), stepped per second."""
    synth = Synth()
    service = Service(make_config(tmp_path / "single", fabric=fabric, polling={"enabled": False}))
    try:
        paths = [r for r in synth.inventory_records(now - 20) if r.measurement == "probe_path"]
        service.on_ingest("probe_paths", paths)
        for t in range(now - 15, now + 15):
            if t == now + 3:
                synth.down.add(cable)
            service.on_ingest("probe_windows", synth.windows(t))
            for event in service.correlation.step((t + 1) * SECOND):
                if event.event == "opened":
                    return event.incident.kind, event.incident.element
        raise AssertionError("the single process opened no incident")
    finally:
        service.store.close()
        service.audits.history.close()
        service.state.close()


def _group_state(nats_url: str) -> dict[str, tuple[int, int, int]]:
    """family -> (taken not acknowledged, not yet delivered, stream messages not acknowledged by the
    group), asked of JetStream directly."""
    import nats

    async def ask():
        nc = await nats.connect(nats_url)
        try:
            js, out = nc.jetstream(), {}
            for family in FAMILIES:
                stream = await js.stream_info(stream_name(PREFIX, family))
                info = await js.consumer_info(stream_name(PREFIX, family), "correlate")
                out[family] = (info.num_ack_pending, info.num_pending,
                               stream.state.last_seq - info.ack_floor.stream_seq)
            return out
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_correlate_member_on_the_bus_opens_the_incident_once_across_a_kill(
        nats_server, influxd, postgres_database, tmp_path, members):  # noqa: F811  (the fixture)
    synth = Synth()
    cable = "--".join(sorted(synth.up_link(2, 1).split("->")))
    fabric = synth.fabric.model_dump(mode="json", exclude_none=True)
    dsn = postgres_database()
    api = _member(tmp_path, "api", "api", influxd, nats_server.url, dsn, fabric)
    corr = _member(tmp_path, "correlate", "correlate", influxd, nats_server.url, dsn, fabric)
    members.extend([api, corr])
    api.start()
    corr.start()
    api.wait_ready()
    corr.wait_ready("correlate feed: consuming")

    now = time.time_ns() // SECOND
    _post(api, synth.inventory_records(now - 20))
    for t in range(now - 15, now):  # a clean past: delay baselines, no finding
        _post(api, synth.windows(t))
    t = now

    def pace() -> None:  # real time: the correlator steps on new seconds of windows
        nonlocal t
        _post(api, synth.windows(t))
        t += 1
        time.sleep(max(0.0, t - time.time_ns() / SECOND))

    for _ in range(3):
        pace()
    assert _incidents(api) == []

    synth.down.add(cable)  # the link fails: its paths' windows come back empty
    fault_at = time.monotonic()
    while not (found := _incidents(api)):
        pace()
        assert t - now < 15, f"no incident within 12 s of the fault; correlate log:\n{corr.tail()}"
    [incident] = found
    print(f"incident open {time.monotonic() - fault_at:.1f} s after the first faulty windows were posted")
    # what the single process opens for the same agents' input: without the pollers' interface addresses
    # (not on the bus yet, docs/cluster.md) neither can name the cable, and both name the same element
    expected = _single_process(tmp_path, fabric, cable, now)
    assert (incident["kind"], incident["element"], incident["state"]) == (*expected, "open"), expected

    corr.kill(signal.SIGKILL)  # mid-stream: the fault goes on, the API keeps taking windows
    killed_at = time.monotonic()
    for _ in range(3):
        pace()
    corr.start()
    wait_until(lambda: corr.text().count("correlate feed: consuming") == 2, 60,  # the first one's line is there
               what="the restarted correlate member", why=corr.tail)
    restarted_ns = time.time_ns()
    # the restarted member starts with an empty context: the probe paths went to the killed one (the
    # group acknowledged them), so it localizes nothing until the agents' next retrace
    # (probe.trace_interval) sends them again, as here; without it the incident resolved after 2 windows
    _post(api, synth.inventory_records(t))
    for _ in range(4):
        pace()
    # every window posted was taken by the group and acknowledged: none lost with the killed member
    wait_until(lambda: all(v == (0, 0, 0) for v in _group_state(nats_server.url).values()), 30,
               what="every telemetry message acknowledged by the correlate group",
               why=lambda: f"{_group_state(nats_server.url)}\n{corr.tail()}")
    print(f"every message acknowledged {time.monotonic() - killed_at:.1f} s after the kill")
    found = _incidents(api)
    assert [(i["id"], i["kind"], i["element"], i["state"]) for i in found] == [
        (incident["id"], *expected, "open")], found  # not opened again
    # continued: the restarted member (it loads the open incidents) refreshes it with its own windows
    deadline = time.monotonic() + 30
    while _incidents(api)[0]["last_seen_ns"] < restarted_ns:
        pace()
        assert time.monotonic() < deadline, f"the restarted member did not continue the incident:\n{corr.tail()}"
    assert len(_incidents(api)) == 1
    assert "Traceback" not in api.text() + corr.text()
