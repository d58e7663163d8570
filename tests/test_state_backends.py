"""The state store's versioned schema and its PostgreSQL backend: databases made before schema
versions open, migrations apply once, the database itself keeps one open incident per dedup key
(also when two connections race), an unreachable or stopped PostgreSQL is a clear error that never
shows the password, and `state:` config errors name the field.

The behaviour of the store itself runs on both backends in the existing tests (test_incidents.py,
test_incident_parents.py, test_action_state.py, test_action_manager.py, test_agent_commands.py:
the `open_state` fixture of tests/_postgres.py).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest
from _influx import free_port
from typer.testing import CliRunner

from correlator.incidents import IncidentManager
from nms.app.service import Service
from nms.config.loader import ConfigError, parse_config
from nms.records import Finding, Incident
from nms.state import SchemaError, StateStore, StateUnavailable
from nms.state.migrations import LATEST, MIGRATIONS, Migration, migrate
from tests._fabric_synth import Synth
from tests.helpers import api_client, auth, make_config, wait_until

T0 = 1_700_000_000_000_000_000
W = 10**9
MAIN_DUMP = Path(__file__).parent / "data" / "state_e1a35d3.sql"  # made by main's nms/state.py, see its header


def finding(element: str = "leaf1:swp1--spine1:swp1", kind: str = "link_down") -> Finding:
    return Finding(ts=T0, kind=kind, element=element, element_kind="link", severity="major", confidence=0.9,
                   summary=f"{kind} on {element}", paths=["h1:eth0>h2:eth0/0"])


def versions(state: StateStore) -> list[int]:
    with state._db.read() as db:
        return [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]


def test_a_database_made_before_schema_versions_opens_and_continues(tmp_path):
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(MAIN_DUMP.read_text())
    state = StateStore(path)
    assert versions(state) == [1, 2, 3, 4, 5, 6] == [m.version for m in MIGRATIONS]
    # what main stored is all there: 3 incidents (one resolved), their events, a job, an action, a command
    assert [(i.id, i.state) for i in state.list_incidents()] == [(3, "open"), (2, "open"), (1, "resolved")]
    assert [e.event for e in state.incident_events(incident_id=1)] == ["opened", "resolved"]
    assert state.get_job("train-1").hosts == ["h1-1"] and state.last_command_id() == 1
    assert [e.note for e in state.action_events(1)] == ["policy auto"]
    # and it goes on: ids keep rising, the open incidents continue, a second open one per element is refused
    m = IncidentManager(state, resolve_after=2)
    [nic] = [i for i in m.open_incidents() if i.kind == "nic_down"]
    assert state.add_commands(["h1-1"], "reprobe_paths", {}, "t", T0)[0].id == 2
    [opened] = m.apply([finding()], T0 + 10 * W)
    assert opened.event == "opened" and opened.incident.id == 4
    with pytest.raises(sqlite3.IntegrityError), state._db.transaction() as db:
        db.execute("INSERT INTO incidents (dedup_key, state, kind, element, opened_ns, body) "
                   "VALUES (?, 'open', 'nic_down', 'h1-1:eth0', 1, '{}')", (nic.dedup_key,))
    state.close()
    state = StateStore(path)
    assert versions(state) == [1, 2, 3, 4, 5, 6]  # nothing applied twice
    state.close()


def test_an_old_file_with_two_open_incidents_of_one_element_is_refused_naming_why(tmp_path):
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(MAIN_DUMP.read_text())
        db.execute("INSERT INTO incidents (dedup_key, state, kind, element, opened_ns, body) "
                   "SELECT dedup_key, 'open', kind, element, opened_ns, body FROM incidents WHERE id = 3")
    with pytest.raises(SchemaError, match=r"migration 2 \(at most one open incident per dedup key\) failed: "
                                          r"UNIQUE constraint failed: incidents.dedup_key"):
        StateStore(path)
    with sqlite3.connect(path) as db:  # version 1 kept, nothing lost
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
        assert db.execute("SELECT count(*) FROM incidents").fetchone() == (4,)


def test_migrations_apply_once_in_order_and_a_newer_schema_is_refused(open_state):
    state = open_state()
    assert versions(state) == list(range(1, LATEST + 1))
    extra = Migration(LATEST + 1, "a test column", ("ALTER TABLE jobs ADD COLUMN note TEXT",))
    assert migrate(state._db, MIGRATIONS + (extra,)) == [LATEST + 1]
    assert migrate(state._db, MIGRATIONS + (extra,)) == []
    state.close()
    with pytest.raises(SchemaError, match=rf"schema version {LATEST + 1}, newer than this nms knows \({LATEST}\)"):
        open_state()


def test_the_database_keeps_one_open_incident_per_dedup_key(open_state):
    state = open_state()
    with state.incident_batch() as batch:
        first, new = batch.insert(Incident.model_validate(
            {"id": 0, "dedup_key": "link:a--b", "kind": "link_down", "element": "a--b", "element_kind": "link",
             "severity": "major", "summary": "down", "confidence": 1, "opened_ns": T0, "updated_ns": T0,
             "last_seen_ns": T0}))
        assert new
        again, new = batch.insert(first.model_copy(update={"kind": "flapping", "opened_ns": T0 + W}))
        assert not new and again == first  # the open one, unchanged
        batch.update(first.model_copy(update={"state": "resolved", "resolved_ns": T0 + W}))
        reopened, new = batch.insert(first.model_copy(update={"opened_ns": T0 + 2 * W}))
        assert new and reopened.id > first.id  # once resolved, the element can open a new one
    unique = (sqlite3.IntegrityError, psycopg.errors.UniqueViolation)
    with pytest.raises(unique), state._db.transaction() as db:  # the index, not the code, refuses it
        db.execute("INSERT INTO incidents (dedup_key, state, kind, element, opened_ns, body) "
                   "VALUES ('link:a--b', 'open', 'link_down', 'a--b', 1, '{}')")
    assert [(i.id, i.state) for i in state.list_incidents()] == [(reopened.id, "open"), (first.id, "resolved")]
    state.close()


def test_two_correlators_racing_open_each_incident_once(open_state, caplog):
    """Two managers on two connections apply the same findings at the same instant, 12 windows."""
    caplog.set_level("INFO", logger="correlator.incidents")
    a, b = open_state(), open_state()
    managers = [IncidentManager(a, resolve_after=2), IncidentManager(b, resolve_after=2)]
    events: list[list] = [[], []]
    for n in range(12):
        barrier = threading.Barrier(2)
        found = [finding(element=f"leaf{n}:swp1--spine1:swp{n}"), finding(element=f"h{n}:eth0", kind="nic_down")]

        def run(i: int, barrier: threading.Barrier, found: list[Finding], window_ns: int) -> None:
            barrier.wait()
            events[i] += managers[i].apply(found, window_ns)

        threads = [threading.Thread(target=run, args=(i, barrier, found, T0 + n * W)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    stored = a.list_incidents(limit=None)
    assert len(stored) == 24 and len({i.dedup_key for i in stored}) == 24
    opened = [e for side in events for e in side if e.event == "opened"]
    assert sorted(e.incident.id for e in opened) == sorted(i.id for i in stored)  # each opened once, by one side
    assert {i.id for i in managers[0].open_incidents()} == {i.id for i in managers[1].open_incidents()}
    assert caplog.text.count("was opened by another correlator: continued") == 24  # the loser of each
    a.close()
    b.close()


def test_two_writers_merging_into_one_job_lose_neither_merge(open_state):
    """update_job reads and writes in one serialized transaction: two connections adding a host each,
    20 times at once, leave all 40 (the jobs the NCCL plugin builds are merged this way)."""
    from nms.records import Job

    stores = [open_state(), open_state()]
    stores[0].put_job(Job(id="train-1", hosts=[], start=T0))
    barrier = threading.Barrier(2)

    def add_hosts(i: int) -> None:
        barrier.wait()
        for n in range(20):
            host = f"h{i}-{n}"
            stores[i].update_job("train-1", lambda job, h=host: job.model_copy(update={"hosts": job.hosts + [h]}))

    threads = [threading.Thread(target=add_hosts, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(stores[1].get_job("train-1").hosts) == sorted(f"h{i}-{n}" for i in (0, 1) for n in range(20))
    for s in stores:
        s.close()


def test_the_loser_of_an_insert_race_on_postgresql_gets_the_winners_incident(postgres_server, postgres_database):
    """Without the store's own lock: the second INSERT waits on the unique index until the first
    transaction commits, then finds its row."""
    dsn = postgres_database()
    a, b = StateStore(dsn=dsn), StateStore(dsn=dsn)
    incident = Incident.model_validate(
        {"id": 0, "dedup_key": "device:spine1", "kind": "device_down", "element": "spine1", "element_kind": "device",
         "severity": "critical", "summary": "down", "confidence": 1, "opened_ns": T0, "updated_ns": T0,
         "last_seen_ns": T0})
    from nms.state import IncidentWriter
    got: list = []
    with a._db.transaction() as db:
        won, new = IncidentWriter(db).insert(incident)
        assert new

        def lose() -> None:
            with b._db.transaction() as db_b:
                got.append(IncidentWriter(db_b).insert(incident.model_copy(update={"opened_ns": T0 + W})))

        loser = threading.Thread(target=lose)
        loser.start()
        with psycopg.connect(dsn, autocommit=True) as watch:  # until b's INSERT waits on a's row
            wait_until(lambda: watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                             "AND query LIKE 'INSERT INTO incidents%'").fetchone()[0] == 1,
                       30, step=0.05, what="the second INSERT waiting on the first")
    loser.join(30)
    assert got == [(won, False)]
    assert [i.id for i in b.list_incidents()] == [won.id]
    a.close()
    b.close()


def test_the_service_keeps_its_state_in_the_configured_postgresql(tmp_path, postgres_database):
    dsn = postgres_database()
    cfg = make_config(tmp_path / "data", state={"backend": "postgresql", "dsn": dsn})
    with api_client(cfg) as c:
        service = c.app.state.service
        assert service.state.backend == "postgresql"
        [opened] = service.incidents.apply([finding()], T0)
        r = c.get(f"/incidents/{opened.incident.id}", headers=auth("read"))
        assert r.status_code == 200 and r.json()["element"] == "leaf1:swp1--spine1:swp1"
    assert not (tmp_path / "data" / "state.sqlite").exists()
    other = StateStore(dsn=dsn)  # another process's view: the same incident
    assert [(i.id, i.state) for i in other.list_incidents()] == [(opened.incident.id, "open")]
    other.close()


def test_an_unreachable_postgresql_is_a_clear_error_without_the_password(tmp_path):
    port = free_port()  # nothing listens there
    dsn = f"postgresql://nms:s3cret-pw@127.0.0.1:{port}/nms"
    with pytest.raises(StateUnavailable) as e:
        StateStore(dsn=dsn, connect_timeout=2)
    assert f"cannot connect to PostgreSQL at postgresql://nms@127.0.0.1:{port}/nms" in str(e.value)
    assert "s3cret-pw" not in str(e.value) and "refused" in str(e.value)
    # nms serve says so and exits 1
    from nms.app.cli import app as cli

    config = tmp_path / "nms.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nstate: {{backend: postgresql, dsn: '${{NMS_TEST_DSN}}'}}\n")
    out = CliRunner().invoke(cli, ["serve", "--config", str(config)], env={"NMS_TEST_DSN": dsn})
    assert out.exit_code == 1, out.output
    assert f"127.0.0.1:{port}" in out.output and "s3cret-pw" not in out.output


def test_a_postgresql_outage_mid_run_fails_the_writes_and_the_store_reconnects(postgres_server, postgres_database):
    state = StateStore(dsn=postgres_database())
    m = IncidentManager(state, resolve_after=2)
    assert [e.event for e in m.apply([finding()], T0)] == ["opened"]
    postgres_server.stop()
    try:
        with pytest.raises(StateUnavailable, match=r"^state store at postgresql://nms@"):
            m.apply([finding(), finding(element="h1:eth0", kind="nic_down")], T0 + W)
        with pytest.raises(StateUnavailable, match="cannot connect to PostgreSQL"):  # the next use tries again
            state.list_incidents()
        assert len(m.open_incidents()) == 1  # nothing half-applied: the memory follows commits only
    finally:
        postgres_server.start()
    events = m.apply([finding(), finding(element="h1:eth0", kind="nic_down")], T0 + 2 * W)  # connects again
    assert [e.event for e in events] == ["opened"] and len(state.list_incidents(state="open")) == 2
    state.close()


def test_state_config_errors_name_the_field(tmp_path, monkeypatch):
    def issues(state: dict) -> list[str]:
        with pytest.raises(ConfigError) as e:
            make_config(tmp_path, state=state)
        return [f"{i.path}: {i.message}" for i in e.value.issues]

    [missing] = issues({"backend": "postgresql"})
    assert missing.startswith("state") and "backend postgresql needs dsn" in missing
    [bad] = issues({"backend": "postgresql", "dsn": "host=db1 password=hunter2-secret bogus"})
    assert bad.startswith("state.dsn: ") and "not a PostgreSQL connection string" in bad and "hunter2" not in bad
    assert issues({"backend": "mysql"})[0].startswith("state.backend")
    assert "only for backend postgresql" in issues({"dsn": "host=db1"})[0]
    monkeypatch.setenv("NMS_STATE_DSN", "postgresql://nms:hunter2-secret@db1:5432/nms")
    cfg = parse_config(f"data_dir: {tmp_path}\nstate: {{backend: postgresql, dsn: '${{NMS_STATE_DSN}}'}}\n")
    assert cfg.state.dsn.get_secret_value().endswith("@db1:5432/nms")
    assert "hunter2" not in repr(cfg.state) and "hunter2" not in cfg.model_dump_json()
    assert make_config(tmp_path).state.backend == "sqlite"  # the default: <data_dir>/state.sqlite


def test_during_a_postgresql_outage_the_api_answers_503_and_the_correlator_logs_it_once(
        tmp_path, postgres_server, postgres_database, caplog):
    """Reads of state answer 503 with the reason (never the password) and a Retry-After; the
    correlator loop logs one warning when the outage starts and one info when it ends, no traceback
    per step; after PostgreSQL is back the same read answers 200."""
    dsn = postgres_database() + " password=s3cret-pw"  # trust authentication: accepted, never needed
    caplog.set_level("INFO", logger="nms.app.service")
    cfg = make_config(tmp_path / "data", state={"backend": "postgresql", "dsn": dsn}, correlator={"interval": "0.5s"})
    with api_client(cfg) as c:
        service = c.app.state.service
        [opened] = service.incidents.apply([finding()], T0)
        runs = service.metrics.scheduler_runs

        def steps(outcome: str) -> float:
            return runs.labels("correlate", outcome)._value.get()

        assert c.get("/incidents", headers=auth("read")).status_code == 200
        postgres_server.stop()
        try:
            r = c.get("/incidents", headers=auth("read"))
            assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
            detail = r.json()["detail"]
            # "state store at <db>: <lost connection>", or "state store: cannot connect to PostgreSQL at
            # <db>: ..." when a correlator step met the outage first
            assert detail.startswith("state store unavailable: state store") and detail.endswith("; retry later")
            assert f"postgresql://nms@{postgres_server.dir}:5432/" in detail, detail
            assert "s3cret-pw" not in r.text
            errors = steps("error")
            wait_until(lambda: steps("error") >= errors + 3, 30, what="three correlator steps during the outage")
        finally:
            postgres_server.start()
        wait_until(lambda: c.get("/incidents", headers=auth("read")).status_code == 200, 30,
                   what="the incidents read answering again")  # the store connects again on its next use
        r = c.get("/incidents", headers=auth("read"))
        assert r.status_code == 200 and [i["id"] for i in r.json()] == [opened.incident.id], r.text
        ok = steps("ok")
        wait_until(lambda: steps("ok") > ok, 30, what="a correlator step after the outage")
    logged = [(rec.levelname, rec.getMessage()) for rec in caplog.records
              if "scheduled job correlate" in rec.getMessage()]
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert "postgresql://nms@" in logged[0][1] and "s3cret-pw" not in logged[0][1]
    assert "the state store is back after" in logged[1][1]
    assert not [rec for rec in caplog.records if rec.exc_info]  # no traceback, from any logger


def test_passwords_are_taken_out_of_state_errors_given_to_clients():
    error = StateUnavailable("state store at postgresql://nms@db1:5432/nms: dsn 'host=db1 password=hunter2 "
                             "user=nms' and postgresql://nms:hunter3@db2/nms failed")
    assert error.reason == ("state store at postgresql://nms@db1:5432/nms: dsn 'host=db1 password=*** user=nms' "
                            "and postgresql://nms:***@db2/nms failed")


def test_windows_judged_while_postgresql_is_down_are_written_when_it_returns(
        tmp_path, postgres_server, postgres_database):
    """A link fails and heals while PostgreSQL is down (the synthetic fabric of
    tests/test_correlation_service.py, stepped per second as the service does): the correlator judges
    each window meanwhile and keeps its findings (nms/app/correlation.py); once PostgreSQL answers the
    windows are written in order, so the failure has its incident, opened at the failure and resolved
    after the heal, both before PostgreSQL came back. Before, nothing of it was ever written."""
    synth = Synth()
    cable = "--".join(sorted(synth.up_link(2, 1).split("->")))
    cfg = make_config(tmp_path, fabric=synth.fabric.model_dump(mode="json", exclude_none=True),
                      polling={"enabled": False}, thresholds={"resolve_after_clean_windows": 2},
                      state={"backend": "postgresql", "dsn": postgres_database()})
    service = Service(cfg)
    now = time.time_ns() // W
    fails, heals, back = now + 2, now + 6, now + 14

    def second(t: int) -> list:
        service.on_ingest("probe_windows", synth.windows(t))
        return service.correlation.step((t + 1) * W)
    try:
        service.correlation.add(synth.inventory_records(now - 20, with_paths=False), "test")  # the poller's part
        paths = [r for r in synth.inventory_records(now - 20) if r.measurement == "probe_path"]
        service.on_ingest("probe_paths", paths)
        for t in range(now - 15, now):  # a clean past: delay baselines, no finding
            assert second(t) == []
        postgres_server.stop()
        refused = 0
        try:
            for t in range(now, back):
                if t == fails:
                    synth.down.add(cable)
                elif t == heals:
                    synth.down.clear()
                try:
                    assert second(t) == []
                except StateUnavailable:
                    refused += 1
        finally:
            postgres_server.start()
        assert refused >= heals - fails  # every window with the failure in it (and the clean ones after)
        events = second(back)
        assert [(e.event, e.incident.kind, e.incident.element) for e in events] == [
            ("opened", "link_down", cable), ("resolved", "link_down", cable)], events
        opened, resolved = (e.ts // W for e in events)
        assert fails < opened <= fails + 3 and heals < resolved < back, (fails, opened, heals, resolved, back)
        [stored] = service.state.list_incidents()
        assert stored.state == "resolved" and stored.opened_ns // W == opened and stored.resolved_ns // W == resolved
        assert second(back + 1) == []  # nothing left waiting, nothing written twice
    finally:
        service.store.close()
        service.state.close()
