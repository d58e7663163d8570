"""Durable service state that is not telemetry: jobs, host agent commands, incidents and actions.

In SQLite in the data directory by default (`<data_dir>/state.sqlite`), or in PostgreSQL
(`state.backend: postgresql`) for several processes to share: the same SQL (nms.state.db), the same
versioned schema (nms.state.migrations). Agent commands: ids come from an identity key, so they rise
and are never reused, also across restarts (an agent's `after` cursor stays meaningful); status
pending -> delivered -> done | failed, or pending -> expired. Incidents: nms.state.incidents.
Actions (correlator.actions keeps their lifecycle): the JSON body plus indexed columns, with
action_events as the audit log (who, what, why, before/after).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from nms.records import Action, ActionEvent, Job
from nms.state.db import Database, sqlite_database
from nms.state.entries import COMMAND_COLUMNS, ActionEventEntry, AgentCommand
from nms.state.incidents import IncidentTables
from nms.state.migrations import migrate

if TYPE_CHECKING:
    from nms.config.models import StateConfig

log = logging.getLogger(__name__)


class StateStore(IncidentTables):
    """`StateStore(path)`: SQLite; `StateStore(dsn=...)`: PostgreSQL (StateUnavailable when it
    cannot be reached). The schema is brought up to date on open."""

    def __init__(self, path: Path | None = None, *, dsn: str | None = None, connect_timeout: float = 10.0):
        if (path is None) == (dsn is None):
            raise ValueError("StateStore: give a SQLite path or a PostgreSQL dsn")
        if dsn is not None:
            from nms.state.postgres import postgres_database  # psycopg only where it is used

            self._db: Database = postgres_database(dsn, connect_timeout)
        else:
            assert path is not None
            self._db = sqlite_database(path)
        try:
            migrate(self._db)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open(cls, config: StateConfig, data_dir: Path) -> StateStore:
        """The store `state:` configures: `<data_dir>/state.sqlite`, or PostgreSQL at `state.dsn`."""
        if config.backend == "postgresql":
            assert config.dsn is not None  # StateConfig checks it
            store = cls(dsn=config.dsn.get_secret_value(), connect_timeout=config.connect_timeout)
            log.info("state store: PostgreSQL at %s", store.where)
            return store
        return cls(data_dir / "state.sqlite")

    @property
    def database(self) -> Database:
        """The connection, for the tables kept beside the store's own (the notification outbox)."""
        return self._db

    @property
    def where(self) -> str:
        """The SQLite file, or `postgresql://user@host:port/dbname` (never the password)."""
        return self._db.where

    @property
    def backend(self) -> str:
        return self._db.dialect.name

    def put_job(self, job: Job) -> bool:
        """Insert or replace a job; True when it was new."""
        return self.update_job(job.id, lambda _: job)

    def update_job(self, job_id: str, change: Callable[[Job | None], Job]) -> bool:
        """Stores change(the stored job, or None) read and written in one transaction, serialized
        across processes: writers merging into the same job never write over each other's merge.
        True when the job was new."""
        with self._db.transaction(serial="jobs") as db:
            row = db.execute("SELECT body FROM jobs WHERE id = ?", (job_id,)).fetchone()
            job = change(None if row is None else Job.model_validate(json.loads(row[0])))
            db.execute('INSERT INTO jobs (id, start, "end", body) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE '
                       'SET start = excluded.start, "end" = excluded."end", body = excluded.body',
                       (job.id, job.start, job.end, job.model_dump_json()))
        return row is None

    def get_job(self, job_id: str) -> Job | None:
        with self._db.read() as db:
            row = db.execute("SELECT body FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else Job.model_validate(json.loads(row[0]))

    def list_jobs(self, active_at: int | None = None, host: str | None = None, limit: int = 1000) -> list[Job]:
        sql, params = "SELECT body FROM jobs", []
        if active_at is not None:
            sql += ' WHERE start <= ? AND ("end" IS NULL OR "end" >= ?)'
            params += [active_at, active_at]
        sql += " ORDER BY start DESC, id"
        with self._db.read() as db:
            rows = db.execute(sql, params).fetchall()
        jobs = [Job.model_validate(json.loads(r[0])) for r in rows]
        if host is not None:
            jobs = [j for j in jobs if host in j.hosts]
        return jobs[:limit]

    def delete_job(self, job_id: str) -> bool:
        with self._db.read() as db:
            cur = db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return cur.rowcount > 0

    # --- host agent commands --------------------------------------------------------------------

    def add_commands(self, hosts: list[str], kind: str, args: dict[str, Any], by: str, now_ns: int,
                     pending_max: int = 100, keep: int = 1000) -> list[AgentCommand]:
        """One pending command per host. Per host, pending commands beyond the newest `pending_max`
        expire at once (an agent that never polls does not grow the service), and only the newest
        `keep` commands are kept."""
        out = []
        with self._db.transaction(serial="agent_commands") as db:
            for host in hosts:
                command_id = db.insert("INSERT INTO agent_commands (host, kind, args, issued_ns, by, status) "
                                       "VALUES (?, ?, ?, ?, ?, 'pending')", (host, kind, json.dumps(args), now_ns, by))
                assert command_id is not None
                out.append(AgentCommand(id=command_id, host=host, kind=kind, args=args, issued_ns=now_ns, by=by))
                db.execute("UPDATE agent_commands SET status = 'expired', result_ns = ?, message = ? "
                           "WHERE host = ? AND status = 'pending' AND id NOT IN (SELECT id FROM agent_commands "
                           "WHERE host = ? AND status = 'pending' ORDER BY id DESC LIMIT ?)",
                           (now_ns, f"dropped: more than {pending_max} commands pending for this host",
                            host, host, pending_max))
                db.execute("DELETE FROM agent_commands WHERE host = ? AND id NOT IN "
                           "(SELECT id FROM agent_commands WHERE host = ? ORDER BY id DESC LIMIT ?)",
                           (host, host, keep))
        return out

    def put_agent(self, host: str, body: str, last_seen_ns: int) -> None:
        """A host agent's registration (JSON)."""
        with self._db.transaction() as db:
            db.execute("INSERT INTO agents (host, last_seen_ns, body) VALUES (?, ?, ?) ON CONFLICT (host) "
                       "DO UPDATE SET last_seen_ns = excluded.last_seen_ns, body = excluded.body",
                       (host, last_seen_ns, body))

    def put_agents_seen(self, seen: dict[str, int]) -> None:
        """Registered agents' newer last_seen_ns, by host."""
        if not seen:
            return
        with self._db.transaction() as db:
            for host, ts in seen.items():
                db.execute("UPDATE agents SET last_seen_ns = ? WHERE host = ? AND last_seen_ns < ?", (ts, host, ts))

    def put_slowdowns(self, bodies: dict[str, str], now_ns: int) -> None:
        """Jobs' slowdowns (JSON: {"active": [...], "cleared": [...]}), by job id."""
        with self._db.transaction() as db:
            for job_id, body in bodies.items():
                db.execute("INSERT INTO job_slowdowns (job_id, updated_ns, body) VALUES (?, ?, ?) ON CONFLICT (job_id) "
                           "DO UPDATE SET updated_ns = excluded.updated_ns, body = excluded.body",
                           (job_id, now_ns, body))

    def slowdowns(self, job_id: str) -> str | None:
        with self._db.read() as db:
            row = db.execute("SELECT body FROM job_slowdowns WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def agents(self) -> list[tuple[int, str]]:
        """Every registration: (last_seen_ns, body JSON)."""
        with self._db.read() as db:
            return [(int(ts), body) for ts, body in db.execute("SELECT last_seen_ns, body FROM agents").fetchall()]

    def command_hosts_after(self, after: int | None) -> tuple[int, set[str]]:
        """(the newest committed command id, the hosts of the commands after `after`); with None, no hosts:
        where a follower of the commands starts. Ids commit in order (the serial lock of add_commands)."""
        with self._db.read() as db:
            if after is None:
                row = db.execute("SELECT MAX(id) FROM agent_commands").fetchone()
                return (0 if row is None or row[0] is None else int(row[0])), set()
            rows = db.execute("SELECT id, host FROM agent_commands WHERE id > ? ORDER BY id", (after,)).fetchall()
        return (int(rows[-1][0]) if rows else after), {host for _, host in rows}

    def expire_commands(self, now_ns: int, ttl_ns: int) -> int:
        """Pending commands issued more than `ttl_ns` ago expire; returns how many did."""
        with self._db.read() as db:
            cur = db.execute(
                "UPDATE agent_commands SET status = 'expired', result_ns = issued_ns + ?, message = ? "
                "WHERE status = 'pending' AND issued_ns < ?",
                (ttl_ns, f"no agent received it within {ttl_ns / 1e9:g} s", now_ns - ttl_ns))
        return cur.rowcount

    def deliver_commands(self, host: str, after: int, now_ns: int, ttl_ns: int, limit: int = 100) -> list[AgentCommand]:
        """Commands for `host` with id > `after` that are pending, or delivered but not finished and
        younger than the TTL (the agent's cursor, not the delivery, acknowledges them: an answer lost
        on the way is sent again). Pending ones become delivered; older ones are left for
        `expire_commands` (run when commands are listed)."""
        with self._db.transaction() as db:
            rows = db.execute(f"SELECT {COMMAND_COLUMNS} FROM agent_commands WHERE host = ? AND id > ? "
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
        with self._db.transaction() as db:
            cur = db.execute("UPDATE agent_commands SET status = ?, result_ns = ?, message = ?, details = ?, "
                             "delivered_ns = COALESCE(delivered_ns, ?) "
                             "WHERE id = ? AND status IN ('pending', 'delivered')",
                             (status, now_ns, message, None if details is None else json.dumps(details), now_ns,
                              command_id))
            row = db.execute(f"SELECT {COMMAND_COLUMNS} FROM agent_commands WHERE id = ?", (command_id,)).fetchone()
        return (None if row is None else AgentCommand.from_row(row)), cur.rowcount > 0

    def get_command(self, command_id: int) -> AgentCommand | None:
        with self._db.read() as db:
            row = db.execute(f"SELECT {COMMAND_COLUMNS} FROM agent_commands WHERE id = ?",
                                   (command_id,)).fetchone()
        return None if row is None else AgentCommand.from_row(row)

    def list_commands(self, host: str | None = None, status: str | None = None, limit: int = 100) -> list[AgentCommand]:
        """Newest first."""
        where, params = [], []
        for column, value in (("host", host), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {COMMAND_COLUMNS} FROM agent_commands"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        with self._db.read() as db:
            rows = db.execute(sql, (*params, limit)).fetchall()
        return [AgentCommand.from_row(r) for r in rows]

    def last_command_id(self) -> int:
        """The highest command id ever given out (0: none yet)."""
        with self._db.read() as db:
            row = db.execute(db.dialect.last_id("agent_commands")).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    # --- actions ------------------------------------------------------------------------------

    def insert_action(self, action: Action, event: ActionEvent | None = None, note: str = "") -> Action:
        """Store a new action (the id passed in is ignored), with its first event; returns it with its id."""
        with self._db.transaction(serial="actions") as db:
            action_id = db.insert("INSERT INTO actions (state, kind, element, incident_id, created_ns, body) "
                                  "VALUES (?, ?, ?, ?, ?, '')", (action.state, action.kind, action.element,
                                                                 action.incident_id, action.created_ns))
            action = action.model_copy(update={"id": action_id})
            db.execute("UPDATE actions SET body = ? WHERE id = ?", (action.model_dump_json(), action.id))
            if event is not None:
                self._add_action_event(db, event.model_copy(update={"action": action}), note)
        return action

    def update_action(self, action: Action, event: ActionEvent | None = None, note: str = "") -> None:
        """Store an action's new state and, in the same transaction, the event that changed it."""
        with self._db.transaction(serial="actions") as db:
            db.execute("UPDATE actions SET state = ?, body = ? WHERE id = ?",
                       (action.state, action.model_dump_json(), action.id))
            if event is not None:
                self._add_action_event(db, event, note)

    @staticmethod
    def _add_action_event(db: Database, event: ActionEvent, note: str) -> None:
        db.execute("INSERT INTO action_events (action_id, event, ts, note, body) VALUES (?, ?, ?, ?, ?)",
                   (event.action.id, event.event, event.ts, note, event.model_dump_json()))

    def get_action(self, action_id: int) -> Action | None:
        with self._db.read() as db:
            row = db.execute("SELECT body FROM actions WHERE id = ?", (action_id,)).fetchone()
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
        with self._db.read() as db:
            rows = db.execute(sql, params).fetchall()
        return [Action.model_validate_json(r[0]) for r in rows]

    def action_events(self, action_id: int | None = None, after: int = 0, limit: int = 1000) -> list[ActionEventEntry]:
        """The audit log (of one action, or all) with id > `after`, oldest first."""
        sql, params = "SELECT id, note, body FROM action_events WHERE id > ?", [after]
        if action_id is not None:
            sql += " AND action_id = ?"
            params.append(action_id)
        sql += " ORDER BY id LIMIT ?"
        with self._db.read() as db:
            rows = db.execute(sql, (*params, limit)).fetchall()
        return [ActionEventEntry.from_row(r) for r in rows]

    def close(self) -> None:
        self._db.close()
