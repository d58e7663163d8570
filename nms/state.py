"""Durable service state that is not telemetry: jobs, host agent commands, incidents and actions.

Kept in SQLite in the data directory so it survives restarts whichever telemetry backend is used.
Agent commands: ids come from an AUTOINCREMENT key, so they rise and are never reused, also
across restarts (an agent's `after` cursor stays meaningful); status pending -> delivered ->
done | failed, or pending -> expired. Incidents (correlator.incidents keeps their lifecycle): the
JSON body plus indexed columns, ids from AUTOINCREMENT too, and every event in incident_events
(the history, and the rising ids of the event stream). Actions (correlator.actions keeps their
lifecycle): the same shape, with action_events as the audit log (who, what, why, before/after).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nms.records import Action, ActionEvent, Incident, IncidentEvent, IncidentState, Job

CommandStatus = Literal["pending", "delivered", "done", "failed", "expired"]
_COMMAND_COLUMNS = "id, host, kind, args, issued_ns, by, status, delivered_ns, result_ns, message, details"


class AgentCommand(BaseModel):
    """A command for one host's probe agent, and what became of it."""

    id: int = Field(description="rises with every command; never reused, also across service restarts")
    host: str
    kind: str
    args: dict[str, Any] = Field(default_factory=dict)
    issued_ns: int
    by: str = Field(description="name of the token that issued it")
    status: CommandStatus = Field("pending",
                                  description="pending -> delivered -> done | failed; pending -> expired")
    delivered_ns: int | None = Field(None, description="when an agent's long-poll first received it")
    result_ns: int | None = Field(None, description="when it was done or failed (agent's report), or expired")
    message: str = Field("", description="the agent's result message, or why it expired")
    details: dict[str, Any] | None = Field(None, description="what the agent added to its result")
    envelope: dict[str, Any] | None = Field(None, description="the service's signature (nms.signing), added "
                                                    "when an agent receives it; agents verify it before acting")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> AgentCommand:
        cid, host, kind, args, issued, by, status, delivered, result, message, details = row
        return cls(id=cid, host=host, kind=kind, args=json.loads(args), issued_ns=issued, by=by, status=status,
                   delivered_ns=delivered, result_ns=result, message=message,
                   details=None if details is None else json.loads(details))


_INCIDENT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, dedup_key TEXT NOT NULL, "
    "state TEXT NOT NULL, kind TEXT NOT NULL, element TEXT NOT NULL, opened_ns INTEGER NOT NULL, resolved_ns INTEGER, "
    "body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS incidents_state ON incidents (state, id)",
    "CREATE INDEX IF NOT EXISTS incidents_kind ON incidents (kind, id)",
    "CREATE INDEX IF NOT EXISTS incidents_element ON incidents (element)",
    "CREATE INDEX IF NOT EXISTS incidents_dedup_key ON incidents (dedup_key, state)",
    "CREATE INDEX IF NOT EXISTS incidents_opened ON incidents (opened_ns)",
    "CREATE INDEX IF NOT EXISTS incidents_resolved ON incidents (resolved_ns)",
    "CREATE TABLE IF NOT EXISTS incident_events (id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL, "
    "event TEXT NOT NULL, ts INTEGER NOT NULL, comment TEXT, body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS incident_events_incident ON incident_events (incident_id, id)",
)
# added to databases of earlier versions (their rows: NULL, every incident top-level, as it was)
_INCIDENT_COLUMNS = {"parent_id": "INTEGER"}
_INCIDENT_INDEXES = ("CREATE INDEX IF NOT EXISTS incidents_parent ON incidents (parent_id)",)


_ACTION_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS actions (id INTEGER PRIMARY KEY AUTOINCREMENT, state TEXT NOT NULL, "
    "kind TEXT NOT NULL, element TEXT NOT NULL, incident_id INTEGER, created_ns INTEGER NOT NULL, body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS actions_state ON actions (state, id)",
    "CREATE INDEX IF NOT EXISTS actions_incident ON actions (incident_id, id)",
    "CREATE TABLE IF NOT EXISTS action_events (id INTEGER PRIMARY KEY AUTOINCREMENT, action_id INTEGER NOT NULL, "
    "event TEXT NOT NULL, ts INTEGER NOT NULL, note TEXT NOT NULL DEFAULT '', body TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS action_events_action ON action_events (action_id, id)",
)


class ActionEventEntry(ActionEvent):
    """An action event as the audit log keeps it."""

    id: int = Field(description="rises with every event, never reused")
    note: str = Field("", description="why: the decision's reason in words")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ActionEventEntry:
        eid, note, body = row
        return cls.model_validate({**json.loads(body), "id": eid, "note": note})


class IncidentEventEntry(IncidentEvent):
    """An incident event as the history keeps it."""

    id: int = Field(description="rises with every event, never reused: the `id:` of the event stream")
    comment: str | None = Field(None, description="the acknowledger's comment")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> IncidentEventEntry:
        eid, comment, body = row
        return cls.model_validate({**json.loads(body), "id": eid, "comment": comment})


class IncidentWriter:
    """The incident writes of one transaction (StateStore.incident_batch)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def insert(self, incident: Incident) -> Incident:
        """Store a new incident; returns it with its id (the one passed in is ignored)."""
        cur = self._db.execute("INSERT INTO incidents (dedup_key, state, kind, element, opened_ns, resolved_ns, body) "
                               "VALUES (?, ?, ?, ?, ?, ?, '')", (incident.dedup_key, incident.state, incident.kind,
                                                                 incident.element, incident.opened_ns,
                                                                 incident.resolved_ns))
        # parent_id: written by update below
        incident = incident.model_copy(update={"id": cur.lastrowid})
        self.update(incident)
        return incident

    def update(self, incident: Incident) -> None:
        self._db.execute("UPDATE incidents SET state = ?, kind = ?, resolved_ns = ?, parent_id = ?, body = ? "
                         "WHERE id = ?", (incident.state, incident.kind, incident.resolved_ns, incident.parent_id,
                                          incident.model_dump_json(), incident.id))

    def add_event(self, event: IncidentEvent, comment: str | None = None) -> int:
        """Append to the history; returns the event's id."""
        cur = self._db.execute("INSERT INTO incident_events (incident_id, event, ts, comment, body) "
                               "VALUES (?, ?, ?, ?, ?)",
                               (event.incident.id, event.event, event.ts, comment, event.model_dump_json()))
        return _inserted_id(cur)


def _inserted_id(cur: sqlite3.Cursor) -> int:
    """The row id an INSERT just gave (sqlite3 types lastrowid as optional: None before any INSERT)."""
    if cur.lastrowid is None:
        raise RuntimeError("the INSERT gave no row id")
    return cur.lastrowid


def _incident_match(table: str, kind: str | None, job: str | None, element: str | None, since_ns: int | None,
                    until_ns: int | None) -> tuple[list[str], list[str | int]]:
    """SQL conditions on the incidents row `table` for list_incidents' filters."""
    where: list[str] = []
    params: list[str | int] = []
    if kind is not None:
        where.append(f"{table}.kind = ?")
        params.append(kind)
    if job is not None:
        where.append(f"EXISTS (SELECT 1 FROM json_each({table}.body, '$.jobs') WHERE value = ?)")
        params.append(job)
    if element is not None:
        e = element.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append(f"({table}.element = ? OR " + " OR ".join([f"{table}.element LIKE ? ESCAPE '\\'"] * 4) + ")")
        params += [element, f"{e}:%", f"{e}--%", f"%--{e}", f"%--{e}:%"]
    if since_ns is not None:
        where.append(f"({table}.resolved_ns IS NULL OR {table}.resolved_ns >= ?)")
        params.append(since_ns)
    if until_ns is not None:
        where.append(f"{table}.opened_ns <= ?")
        params.append(until_ns)
    return where, params


def open_sqlite(path: Path) -> sqlite3.Connection:
    """An SQLite database for service state: autocommit (explicit transactions), WAL, any thread."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


class StateStore:
    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = open_sqlite(path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs "
            "(id TEXT PRIMARY KEY, start INTEGER NOT NULL, end INTEGER, body TEXT NOT NULL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS agent_commands (id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL, "
            "kind TEXT NOT NULL, args TEXT NOT NULL, issued_ns INTEGER NOT NULL, by TEXT NOT NULL, "
            "status TEXT NOT NULL, delivered_ns INTEGER, result_ns INTEGER, message TEXT NOT NULL DEFAULT '', "
            "details TEXT)")
        self._db.execute("CREATE INDEX IF NOT EXISTS agent_commands_host ON agent_commands (host, id)")
        self._db.execute("CREATE INDEX IF NOT EXISTS agent_commands_status ON agent_commands (status, issued_ns)")
        for statement in _INCIDENT_SCHEMA + _ACTION_SCHEMA:
            self._db.execute(statement)
        self._migrate()

    def _migrate(self) -> None:
        """Bring an older database's tables up to date (columns added since); idempotent."""
        with self._transaction() as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(incidents)")}
            for column, sql_type in _INCIDENT_COLUMNS.items():
                if column not in have:
                    db.execute(f"ALTER TABLE incidents ADD COLUMN {column} {sql_type}")
            for statement in _INCIDENT_INDEXES:
                db.execute(statement)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def put_job(self, job: Job) -> bool:
        """Insert or replace a job; True when it was new."""
        with self._lock:
            existed = self._db.execute("SELECT 1 FROM jobs WHERE id = ?", (job.id,)).fetchone() is not None
            self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?)",
                             (job.id, job.start, job.end, job.model_dump_json()))
        return not existed

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else Job.model_validate(json.loads(row[0]))

    def list_jobs(self, active_at: int | None = None, host: str | None = None, limit: int = 1000) -> list[Job]:
        sql, params = "SELECT body FROM jobs", []
        if active_at is not None:
            sql += " WHERE start <= ? AND (end IS NULL OR end >= ?)"
            params += [active_at, active_at]
        sql += " ORDER BY start DESC, id"
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        jobs = [Job.model_validate(json.loads(r[0])) for r in rows]
        if host is not None:
            jobs = [j for j in jobs if host in j.hosts]
        return jobs[:limit]

    def delete_job(self, job_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return cur.rowcount > 0

    # --- host agent commands --------------------------------------------------------------------

    def add_commands(self, hosts: list[str], kind: str, args: dict[str, Any], by: str, now_ns: int,
                     pending_max: int = 100, keep: int = 1000) -> list[AgentCommand]:
        """One pending command per host. Per host, pending commands beyond the newest `pending_max`
        expire at once (an agent that never polls does not grow the service), and only the newest
        `keep` commands are kept."""
        out = []
        with self._transaction() as db:
            for host in hosts:
                cur = db.execute("INSERT INTO agent_commands (host, kind, args, issued_ns, by, status) "
                                 "VALUES (?, ?, ?, ?, ?, 'pending')", (host, kind, json.dumps(args), now_ns, by))
                out.append(AgentCommand(id=_inserted_id(cur), host=host, kind=kind, args=args, issued_ns=now_ns, by=by))
                db.execute("UPDATE agent_commands SET status = 'expired', result_ns = ?, message = ? "
                           "WHERE host = ? AND status = 'pending' AND id NOT IN (SELECT id FROM agent_commands "
                           "WHERE host = ? AND status = 'pending' ORDER BY id DESC LIMIT ?)",
                           (now_ns, f"dropped: more than {pending_max} commands pending for this host",
                            host, host, pending_max))
                db.execute("DELETE FROM agent_commands WHERE host = ? AND id NOT IN "
                           "(SELECT id FROM agent_commands WHERE host = ? ORDER BY id DESC LIMIT ?)",
                           (host, host, keep))
        return out

    def expire_commands(self, now_ns: int, ttl_ns: int) -> int:
        """Pending commands issued more than `ttl_ns` ago expire; returns how many did."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE agent_commands SET status = 'expired', result_ns = issued_ns + ?, message = ? "
                "WHERE status = 'pending' AND issued_ns < ?",
                (ttl_ns, f"no agent received it within {ttl_ns / 1e9:g} s", now_ns - ttl_ns))
        return cur.rowcount

    def deliver_commands(self, host: str, after: int, now_ns: int, ttl_ns: int, limit: int = 100) -> list[AgentCommand]:
        """Commands for `host` with id > `after` that are pending, or delivered but not finished and
        younger than the TTL (the agent's cursor, not the delivery, acknowledges them: an answer lost
        on the way is sent again). Pending ones become delivered; older ones are left for
        `expire_commands` (run when commands are listed)."""
        with self._transaction() as db:
            rows = db.execute(f"SELECT {_COMMAND_COLUMNS} FROM agent_commands WHERE host = ? AND id > ? "
                              "AND status IN ('pending', 'delivered') AND issued_ns >= ? ORDER BY id LIMIT ?",
                              (host, after, now_ns - ttl_ns, limit)).fetchall()
            fresh = [r[0] for r in rows if r[6] == "pending"]
            if fresh:
                db.execute(f"UPDATE agent_commands SET status = 'delivered', delivered_ns = ? "
                           f"WHERE id IN ({','.join('?' * len(fresh))})", (now_ns, *fresh))
        out = [AgentCommand.from_row(r) for r in rows]
        return [c.model_copy(update={"status": "delivered", "delivered_ns": now_ns}) if c.status == "pending" else c
                for c in out]

    def finish_command(self, command_id: int, status: Literal["done", "failed"], message: str,
                       details: dict[str, Any] | None, now_ns: int) -> tuple[AgentCommand | None, bool]:
        """Record an agent's result. Returns (the command or None if unknown, whether it changed):
        a command already done, failed or expired keeps its first outcome."""
        with self._transaction() as db:
            cur = db.execute("UPDATE agent_commands SET status = ?, result_ns = ?, message = ?, details = ?, "
                             "delivered_ns = COALESCE(delivered_ns, ?) "
                             "WHERE id = ? AND status IN ('pending', 'delivered')",
                             (status, now_ns, message, None if details is None else json.dumps(details), now_ns,
                              command_id))
            row = db.execute(f"SELECT {_COMMAND_COLUMNS} FROM agent_commands WHERE id = ?", (command_id,)).fetchone()
        return (None if row is None else AgentCommand.from_row(row)), cur.rowcount > 0

    def get_command(self, command_id: int) -> AgentCommand | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COMMAND_COLUMNS} FROM agent_commands WHERE id = ?",
                                   (command_id,)).fetchone()
        return None if row is None else AgentCommand.from_row(row)

    def list_commands(self, host: str | None = None, status: str | None = None, limit: int = 100) -> list[AgentCommand]:
        """Newest first."""
        where, params = [], []
        for column, value in (("host", host), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {_COMMAND_COLUMNS} FROM agent_commands"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, (*params, limit)).fetchall()
        return [AgentCommand.from_row(r) for r in rows]

    def last_command_id(self) -> int:
        """The highest command id ever given out (0: none yet)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'agent_commands'").fetchone()
        return 0 if row is None else row[0]

    # --- incidents ------------------------------------------------------------------------------

    @contextmanager
    def incident_batch(self) -> Iterator[IncidentWriter]:
        """One transaction of incident writes: all of them are stored, or none."""
        with self._transaction() as db:
            yield IncidentWriter(db)

    def prune_incidents(self, before_ns: int) -> int:
        """Delete incidents resolved before `before_ns`, with their events; returns how many."""
        with self._transaction() as db:
            old = "SELECT id FROM incidents WHERE state = 'resolved' AND resolved_ns < ?"
            db.execute(f"DELETE FROM incident_events WHERE incident_id IN ({old})", (before_ns,))
            return db.execute(
                "DELETE FROM incidents WHERE state = 'resolved' AND resolved_ns < ?", (before_ns,)
            ).rowcount

    def get_incident(self, incident_id: int) -> Incident | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else Incident.model_validate_json(row[0])

    def list_incidents(self, state: IncidentState | None = None, kind: str | None = None, job: str | None = None,
                       element: str | None = None, since_ns: int | None = None, until_ns: int | None = None,
                       limit: int | None = 1000, top_level: bool = False) -> list[Incident]:
        """Newest first. `element` matches the element itself, a link with that end, and whatever
        belongs to that device (`leaf1` matches `leaf1:swp1--spine1:swp2`); since/until keep the
        incidents whose active span (opened .. resolved, or now while open) overlaps the range.
        `top_level`: parents and lone incidents only, those that match or have a child that matches
        (kind, job, element, since, until; `state` is the top-level incident's)."""
        where: list[str] = []
        params: list[str | int] = []
        if state is not None:
            where.append("state = ?")
            params.append(state)
        match, match_params = _incident_match("incidents", kind, job, element, since_ns, until_ns)
        if top_level:
            where.append("parent_id IS NULL")
            if match:
                child, child_params = _incident_match("c", kind, job, element, since_ns, until_ns)
                where.append(f"(({' AND '.join(match)}) OR EXISTS (SELECT 1 FROM incidents c "
                             f"WHERE c.parent_id = incidents.id AND {' AND '.join(child)}))")
                params += match_params + child_params
        else:
            where += match
            params += match_params
        sql = "SELECT body FROM incidents" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [Incident.model_validate_json(r[0]) for r in rows]

    def incident_children(self, parent_ids: list[int]) -> dict[int, list[Incident]]:
        """The children of these incidents, by parent id, oldest first."""
        out: dict[int, list[Incident]] = {}
        for start in range(0, len(parent_ids), 500):
            chunk = parent_ids[start:start + 500]
            with self._lock:
                rows = self._db.execute(f"SELECT body FROM incidents WHERE parent_id IN ({','.join('?' * len(chunk))}) "
                                        "ORDER BY id", chunk).fetchall()
            for (body,) in rows:
                child = Incident.model_validate_json(body)
                out.setdefault(child.parent_id or 0, []).append(child)
        return out

    def incident_events(self, incident_id: int | None = None, after: int = 0, limit: int = 1000,
                        newest: bool = False) -> list[IncidentEventEntry]:
        """Events with id > `after` (of one incident, or all), oldest first: the first `limit` of
        them, or with `newest` the last `limit`."""
        sql, params = "SELECT id, comment, body FROM incident_events WHERE id > ?", [after]
        if incident_id is not None:
            sql += " AND incident_id = ?"
            params.append(incident_id)
        sql += f" ORDER BY id {'DESC' if newest else 'ASC'} LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, (*params, limit)).fetchall()
        return [IncidentEventEntry.from_row(r) for r in (reversed(rows) if newest else rows)]

    def last_incident_event(self, incident_id: int, kinds: tuple[str, ...]) -> IncidentEventEntry | None:
        """The newest event of one incident among `kinds`."""
        with self._lock:
            row = self._db.execute(f"SELECT id, comment, body FROM incident_events WHERE incident_id = ? AND event IN "
                                   f"({','.join('?' * len(kinds))}) ORDER BY id DESC LIMIT 1",
                                   (incident_id, *kinds)).fetchone()
        return None if row is None else IncidentEventEntry.from_row(row)

    # --- actions ------------------------------------------------------------------------------

    def insert_action(self, action: Action, event: ActionEvent | None = None, note: str = "") -> Action:
        """Store a new action (the id passed in is ignored), with its first event; returns it with its id."""
        with self._transaction() as db:
            cur = db.execute("INSERT INTO actions (state, kind, element, incident_id, created_ns, body) "
                             "VALUES (?, ?, ?, ?, ?, '')", (action.state, action.kind, action.element,
                                                            action.incident_id, action.created_ns))
            action = action.model_copy(update={"id": cur.lastrowid})
            db.execute("UPDATE actions SET body = ? WHERE id = ?", (action.model_dump_json(), action.id))
            if event is not None:
                self._add_action_event(db, event.model_copy(update={"action": action}), note)
        return action

    def update_action(self, action: Action, event: ActionEvent | None = None, note: str = "") -> None:
        """Store an action's new state and, in the same transaction, the event that changed it."""
        with self._transaction() as db:
            db.execute("UPDATE actions SET state = ?, body = ? WHERE id = ?",
                       (action.state, action.model_dump_json(), action.id))
            if event is not None:
                self._add_action_event(db, event, note)

    @staticmethod
    def _add_action_event(db: sqlite3.Connection, event: ActionEvent, note: str) -> None:
        db.execute("INSERT INTO action_events (action_id, event, ts, note, body) VALUES (?, ?, ?, ?, ?)",
                   (event.action.id, event.event, event.ts, note, event.model_dump_json()))

    def get_action(self, action_id: int) -> Action | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM actions WHERE id = ?", (action_id,)).fetchone()
        return None if row is None else Action.model_validate_json(row[0])

    def list_actions(self, state: str | None = None, kind: str | None = None, incident_id: int | None = None,
                     element: str | None = None, states: tuple[str, ...] | None = None,
                     limit: int | None = 1000) -> list[Action]:
        """Newest first; `states`: any of these."""
        where, params = [], []
        for column, value in (("state", state), ("kind", kind), ("incident_id", incident_id),
                              ("element", element)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params += list(states)
        sql = "SELECT body FROM actions" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [Action.model_validate_json(r[0]) for r in rows]

    def action_events(self, action_id: int | None = None, after: int = 0, limit: int = 1000) -> list[ActionEventEntry]:
        """The audit log (of one action, or all) with id > `after`, oldest first."""
        sql, params = "SELECT id, note, body FROM action_events WHERE id > ?", [after]
        if action_id is not None:
            sql += " AND action_id = ?"
            params.append(action_id)
        sql += " ORDER BY id LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, (*params, limit)).fetchall()
        return [ActionEventEntry.from_row(r) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
