"""Versioned schema of the state store, the same for SQLite and PostgreSQL.

`schema_version` has one row per migration applied. Each migration runs in its own transaction
(PostgreSQL's DDL is transactional; SQLite's too), under the database's write lock (SQLite) or an
advisory lock (PostgreSQL), so processes starting together apply each migration once. Version 1
is the schema of before versions existed: its statements are `IF NOT EXISTS`, and a database of
that time gets what it lacks (incidents.parent_id, added to older ones since). Add a migration at
the end; never edit one that shipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nms.state.db import Database, StateUnavailable

Step = str | Callable[[Database], None]


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    steps: tuple[Step, ...]


class SchemaError(RuntimeError):
    """The database's schema cannot be brought to this version of nms."""


def _incidents_parent_id(db: Database) -> None:
    """Databases from before incident parents: their rows get NULL, every incident top-level, as it was."""
    if "parent_id" not in {row[1] for row in db.execute(db.dialect.columns("incidents")).fetchall()}:
        db.execute("ALTER TABLE incidents ADD COLUMN parent_id {int}".format(**db.dialect.types))


_V1: tuple[Step, ...] = (
    'CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, start {int} NOT NULL, "end" {int}, body TEXT NOT NULL)',
    "CREATE TABLE IF NOT EXISTS agent_commands (id {id}, host TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL, "
    "issued_ns {int} NOT NULL, by TEXT NOT NULL, status TEXT NOT NULL, delivered_ns {int}, result_ns {int}, "
    "message TEXT NOT NULL DEFAULT '', details TEXT)",
    "CREATE INDEX IF NOT EXISTS agent_commands_host ON agent_commands (host, id)",
    "CREATE INDEX IF NOT EXISTS agent_commands_status ON agent_commands (status, issued_ns)",
    "CREATE TABLE IF NOT EXISTS incidents (id {id}, dedup_key TEXT NOT NULL, state TEXT NOT NULL, kind TEXT NOT NULL, "
    "element TEXT NOT NULL, opened_ns {int} NOT NULL, resolved_ns {int}, body TEXT NOT NULL, parent_id {int})",
    _incidents_parent_id,
    "CREATE INDEX IF NOT EXISTS incidents_state ON incidents (state, id)",
    "CREATE INDEX IF NOT EXISTS incidents_kind ON incidents (kind, id)",
    "CREATE INDEX IF NOT EXISTS incidents_element ON incidents (element)",
    "CREATE INDEX IF NOT EXISTS incidents_dedup_key ON incidents (dedup_key, state)",
    "CREATE INDEX IF NOT EXISTS incidents_opened ON incidents (opened_ns)",
    "CREATE INDEX IF NOT EXISTS incidents_resolved ON incidents (resolved_ns)",
    "CREATE INDEX IF NOT EXISTS incidents_parent ON incidents (parent_id)",
    "CREATE TABLE IF NOT EXISTS incident_events (id {id}, incident_id {int} NOT NULL, event TEXT NOT NULL, "
    "ts {int} NOT NULL, comment TEXT, body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS incident_events_incident ON incident_events (incident_id, id)",
    "CREATE TABLE IF NOT EXISTS actions (id {id}, state TEXT NOT NULL, kind TEXT NOT NULL, element TEXT NOT NULL, "
    "incident_id {int}, created_ns {int} NOT NULL, body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS actions_state ON actions (state, id)",
    "CREATE INDEX IF NOT EXISTS actions_incident ON actions (incident_id, id)",
    "CREATE TABLE IF NOT EXISTS action_events (id {id}, action_id {int} NOT NULL, event TEXT NOT NULL, "
    "ts {int} NOT NULL, note TEXT NOT NULL DEFAULT '', body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS action_events_action ON action_events (action_id, id)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, agent commands, incidents and actions (the schema before versions)", _V1),
    # Two correlators cannot open one element's incident twice: the loser of the race gets the
    # winner's incident (IncidentWriter.insert).
    Migration(2, "at most one open incident per dedup key", (
        "CREATE UNIQUE INDEX IF NOT EXISTS incidents_open_dedup_key ON incidents (dedup_key) WHERE state = 'open'",)),
    # The notification outbox (nms/app/notify/outbox.py), before in each process's notifications.sqlite: shared,
    # so a member that dies leaves its pending deliveries to the others (claimed_by/until: who sends one now).
    Migration(3, "the notification outbox, shared by the members", (
        "CREATE TABLE IF NOT EXISTS deliveries (id {id}, dedup TEXT NOT NULL UNIQUE, incident_id {int} NOT NULL, "
        "event TEXT NOT NULL, sink TEXT NOT NULL, sink_kind TEXT NOT NULL, state TEXT NOT NULL, "
        "attempts {int} NOT NULL DEFAULT 0, created_ns {int} NOT NULL, last_attempt_ns {int}, next_attempt_ns {int}, "
        "delivered_ns {int}, last_status {int}, last_error TEXT, body TEXT NOT NULL, claimed_by TEXT, "
        "claimed_until {int})",
        "CREATE INDEX IF NOT EXISTS deliveries_chain ON deliveries (state, sink, incident_id, id)",
        "CREATE INDEX IF NOT EXISTS deliveries_incident ON deliveries (incident_id, id)")),
    # The audit history (nms/app/audits/history.py), before in each process's audits.sqlite.
    Migration(4, "the audit history, shared by the members", (
        "CREATE TABLE IF NOT EXISTS audit_reports (id {id}, trigger TEXT NOT NULL, started_ns {int} NOT NULL, "
        "finished_ns {int} NOT NULL, findings {int} NOT NULL, body TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS audit_results (report_id {int} NOT NULL, audit TEXT NOT NULL, "
        "status TEXT NOT NULL, findings {int} NOT NULL, PRIMARY KEY (audit, report_id))")),
    # Host agents' registrations (nms/app/agent_registry.py), before in each API process's memory only.
    Migration(5, "host agents' registrations, shared by the members", (
        "CREATE TABLE IF NOT EXISTS agents (host TEXT PRIMARY KEY, last_seen_ns {int} NOT NULL, body TEXT NOT NULL)",)),
    # NCCL jobs' slowdowns (correlator/jobs_nccl.py), before in the correlating process's memory only.
    Migration(6, "NCCL jobs' slowdowns, shared by the members", (
        "CREATE TABLE IF NOT EXISTS job_slowdowns (job_id TEXT PRIMARY KEY, updated_ns {int} NOT NULL, "
        "body TEXT NOT NULL)",)),
)
LATEST = MIGRATIONS[-1].version


def schema_version(db: Database) -> int:
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def migrate(db: Database, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply the migrations the database lacks, in order; returns their versions."""
    with db.transaction(serial="migrate"):
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version {int} PRIMARY KEY, applied_ns {int} NOT NULL, "
                   "description TEXT NOT NULL)".format(**db.dialect.types))
    applied = []
    for m in migrations:
        with db.transaction(serial="migrate"):
            current = schema_version(db)
            if current > migrations[-1].version:
                raise SchemaError(f"state store: the database has schema version {current}, newer than this nms "
                                  f"knows ({migrations[-1].version}): upgrade nms, or use another database")
            if m.version <= current:
                continue
            try:
                for step in m.steps:
                    if isinstance(step, str):
                        db.execute(step.format(**db.dialect.types))
                    else:
                        step(db)
            except StateUnavailable:
                raise
            except Exception as e:
                raise SchemaError(f"state store: migration {m.version} ({m.description}) failed: {e}") from e
            db.execute("INSERT INTO schema_version (version, applied_ns, description) VALUES (?, ?, ?)",
                       (m.version, time.time_ns(), m.description))
            applied.append(m.version)
    return applied
