"""The durable outbox of notification deliveries: the `deliveries` table of the state store (SQLite
by default, PostgreSQL in a cluster: nms/state), so every member of a cluster sees one outbox.

One row per (incident event, sink). `dedup` is unique: opened / acknowledged / resolved of one
incident are queued once per sink however often they are submitted (also across restarts and by
several members); updated events are keyed by the incident's update count and time, so each real
update is sent. The row keeps the event (JSON) and never a rendered request: secrets are added at
send time.

A member sends a delivery only after claiming it (`claimed_by`, `claimed_until`): two members never
send one attempt twice, and the deliveries of a member that died are sent by another once its claim
lapsed. Before the outbox was shared, each process kept `<data_dir>/notifications.sqlite`: its rows
are moved in once (`import_file`), the file renamed `*.imported`.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from nms.records import IncidentEvent, NotificationDelivery
from nms.state.db import Database

log = logging.getLogger(__name__)

_COLUMNS = ("id, incident_id, event, sink, sink_kind, state, attempts, created_ns, last_attempt_ns, "
            "next_attempt_ns, delivered_ns, last_status, last_error")
_FIELDS = [c.strip() for c in _COLUMNS.split(",")]
_MOVED = [f for f in _FIELDS if f != "id"] + ["dedup", "body"]  # what import_file keeps of an old row


def dedup_key(event: IncidentEvent, sink: str) -> str:
    inc = event.incident
    if event.event == "updated":
        return f"{inc.id}|updated|{inc.updates}|{inc.updated_ns}|{sink}"
    return f"{inc.id}|{event.event}|{sink}"


def _row(row: tuple) -> NotificationDelivery:
    return NotificationDelivery(**dict(zip(_FIELDS, row)))


class Outbox:
    """The deliveries of the state database `db`, as seen by the member `member` (its claims)."""

    def __init__(self, db: Database, member: str):
        self._db, self.member = db, member

    @property
    def shared(self) -> bool:
        """Several processes use it (a PostgreSQL state store), each with its own sinks configured."""
        return self._db.dialect.name == "postgresql"

    def add(self, event: IncidentEvent, sinks: list[tuple[str, str, bool]], now_ns: int) -> list[int]:
        """Queue `event` for each (sink name, sink kind, accepted by the sink's filters). A sink whose
        filters reject the event still gets it when it already has a delivery of this incident (a
        resolve follows its trigger even if the severity dropped). Returns the new delivery ids."""
        inc = event.incident
        body = event.model_dump_json()
        new = []
        with self._db.transaction(serial="outbox") as db:
            for name, kind, accepted in sinks:
                if not accepted and (event.event == "opened" or db.execute(
                        "SELECT 1 FROM deliveries WHERE incident_id = ? AND sink = ? LIMIT 1",
                        (inc.id, name)).fetchone() is None):
                    continue
                added = db.insert(
                    "INSERT INTO deliveries (dedup, incident_id, event, sink, sink_kind, state, created_ns, "
                    "next_attempt_ns, body) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?) ON CONFLICT (dedup) DO NOTHING",
                    (dedup_key(event, name), inc.id, event.event, name, kind, now_ns, now_ns, body))
                if added is not None:
                    new.append(added)
        return new

    def heads(self, now_ns: int) -> list[tuple[NotificationDelivery, str]]:
        """The oldest pending delivery of every (sink, incident) chain, with its event JSON, unless
        another member's claim on it holds: only a chain's head may be sent, so a resolve never
        overtakes its trigger."""
        with self._db.read() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS}, body FROM deliveries WHERE id IN (SELECT MIN(id) FROM deliveries "
                "WHERE state = 'pending' GROUP BY sink, incident_id) "
                "AND (claimed_until IS NULL OR claimed_until < ? OR claimed_by = ?) ORDER BY id",
                (now_ns, self.member)).fetchall()
        return [(_row(r[:-1]), r[-1]) for r in rows]

    def claim(self, delivery_id: int, now_ns: int, until_ns: int) -> bool:
        """Take the pending delivery for an attempt until `until_ns`; False when another member holds it."""
        with self._db.transaction(serial="outbox") as db:
            cur = db.execute(
                "UPDATE deliveries SET claimed_by = ?, claimed_until = ? WHERE id = ? AND state = 'pending' "
                "AND (claimed_until IS NULL OR claimed_until < ? OR claimed_by = ?)",
                (self.member, until_ns, delivery_id, now_ns, self.member))
            return cur.rowcount == 1

    def record(self, delivery_id: int, *, state: str, attempts: int, last_attempt_ns: int,
               next_attempt_ns: int | None, delivered_ns: int | None, last_status: int | None,
               last_error: str | None) -> None:
        """An attempt's outcome; the claim is let go."""
        with self._db.transaction(serial="outbox") as db:
            db.execute(
                "UPDATE deliveries SET state = ?, attempts = ?, last_attempt_ns = ?, next_attempt_ns = ?, "
                "delivered_ns = ?, last_status = ?, last_error = ?, claimed_by = NULL, claimed_until = NULL "
                "WHERE id = ?",
                (state, attempts, last_attempt_ns, next_attempt_ns, delivered_ns, last_status, last_error,
                 delivery_id))

    def fail_unknown_sinks(self, sinks: set[str]) -> int:
        """Pending deliveries of sinks that are no longer configured become failed (visible, not stuck)."""
        marks = ",".join("?" * len(sinks)) or "NULL"
        with self._db.transaction(serial="outbox") as db:
            cur = db.execute(
                f"UPDATE deliveries SET state = 'failed', next_attempt_ns = NULL, last_error = "
                f"'sink no longer configured' WHERE state = 'pending' AND sink NOT IN ({marks})", sorted(sinks))
            return cur.rowcount

    def prune(self, before_ns: int) -> int:
        """Forget finished deliveries created before `before_ns`."""
        with self._db.transaction(serial="outbox") as db:
            cur = db.execute("DELETE FROM deliveries WHERE state != 'pending' AND created_ns < ?", (before_ns,))
            return cur.rowcount

    def list(self, incident_id: int | None = None, state: str | None = None, sink: str | None = None,
             limit: int = 100) -> list[NotificationDelivery]:
        """Newest first."""
        where, params = [], []
        for column, value in (("incident_id", incident_id), ("state", state), ("sink", sink)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {_COLUMNS} FROM deliveries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._db.read() as db:
            rows = db.execute(sql, [*params, limit]).fetchall()
        return [_row(r) for r in rows]

    def counts(self) -> dict[tuple[str, str], int]:
        """(sink, state) -> number of deliveries."""
        with self._db.read() as db:
            rows = db.execute("SELECT sink, state, COUNT(*) FROM deliveries GROUP BY sink, state").fetchall()
        return {(sink, state): int(n) for sink, state, n in rows}

    def import_file(self, path: Path) -> int:
        """Move the rows of a process's own outbox of before (`notifications.sqlite`) in, in their order
        (a delivery already here by its dedup key is kept as it is); the file is renamed `*.imported`.
        Returns how many rows were moved."""
        if not path.exists():
            return 0
        old = sqlite3.connect(str(path))
        try:
            rows = old.execute(f"SELECT {', '.join(_MOVED)} FROM deliveries ORDER BY id").fetchall()
        finally:
            old.close()
        moved = 0
        insert = (f"INSERT INTO deliveries ({', '.join(_MOVED)}) VALUES ({', '.join('?' * len(_MOVED))}) "
                  "ON CONFLICT (dedup) DO NOTHING")
        with self._db.transaction(serial="outbox") as db:
            for row in rows:
                moved += db.insert(insert, row) is not None
        path.rename(path.with_name(path.name + ".imported"))
        log.info("notification outbox: %d of %d deliveries of %s moved to the state store (%s); the file is "
                 "renamed %s.imported", moved, len(rows), path, self._db.where, path.name)
        return moved
