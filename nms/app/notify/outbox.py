"""The durable outbox of notification deliveries (SQLite, `<data_dir>/notifications.sqlite`).

One row per (incident event, sink). `dedup` is unique: opened / acknowledged / resolved of one
incident are queued once per sink however often they are submitted (also across restarts);
updated events are keyed by the incident's update count and time, so each real update is sent.
The row keeps the event (JSON) and never a rendered request: secrets are added at send time.
"""

from __future__ import annotations

import threading
from pathlib import Path

from nms.records import IncidentEvent, NotificationDelivery
from nms.state import open_sqlite

_COLUMNS = ("id, incident_id, event, sink, sink_kind, state, attempts, created_ns, last_attempt_ns, "
            "next_attempt_ns, delivered_ns, last_status, last_error")
_FIELDS = [c.strip() for c in _COLUMNS.split(",")]


def dedup_key(event: IncidentEvent, sink: str) -> str:
    inc = event.incident
    if event.event == "updated":
        return f"{inc.id}|updated|{inc.updates}|{inc.updated_ns}|{sink}"
    return f"{inc.id}|{event.event}|{sink}"


def _row(row: tuple) -> NotificationDelivery:
    return NotificationDelivery(**dict(zip(_FIELDS, row)))


class Outbox:
    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = open_sqlite(path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS deliveries (id INTEGER PRIMARY KEY AUTOINCREMENT, dedup TEXT NOT NULL UNIQUE, "
            "incident_id INTEGER NOT NULL, event TEXT NOT NULL, sink TEXT NOT NULL, sink_kind TEXT NOT NULL, "
            "state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created_ns INTEGER NOT NULL, "
            "last_attempt_ns INTEGER, next_attempt_ns INTEGER, delivered_ns INTEGER, last_status INTEGER, "
            "last_error TEXT, body TEXT NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS deliveries_chain ON deliveries (state, sink, incident_id, id)")
        self._db.execute("CREATE INDEX IF NOT EXISTS deliveries_incident ON deliveries (incident_id, id)")

    def add(self, event: IncidentEvent, sinks: list[tuple[str, str, bool]], now_ns: int) -> list[int]:
        """Queue `event` for each (sink name, sink kind, accepted by the sink's filters). A sink whose
        filters reject the event still gets it when it already has a delivery of this incident (a
        resolve follows its trigger even if the severity dropped). Returns the new delivery ids."""
        inc = event.incident
        body = event.model_dump_json()
        new = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for name, kind, accepted in sinks:
                    if not accepted and (event.event == "opened" or self._db.execute(
                            "SELECT 1 FROM deliveries WHERE incident_id = ? AND sink = ? LIMIT 1",
                            (inc.id, name)).fetchone() is None):
                        continue
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO deliveries (dedup, incident_id, event, sink, sink_kind, state, "
                        "created_ns, next_attempt_ns, body) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                        (dedup_key(event, name), inc.id, event.event, name, kind, now_ns, now_ns, body),
                    )
                    if cur.rowcount:
                        new.append(cur.lastrowid)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return new

    def heads(self) -> list[tuple[NotificationDelivery, str]]:
        """The oldest pending delivery of every (sink, incident) chain, with its event JSON: only a
        chain's head may be sent, so a resolve never overtakes its trigger."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS}, body FROM deliveries WHERE id IN (SELECT MIN(id) FROM deliveries "
                "WHERE state = 'pending' GROUP BY sink, incident_id) ORDER BY id").fetchall()
        return [(_row(r[:-1]), r[-1]) for r in rows]

    def record(self, delivery_id: int, *, state: str, attempts: int, last_attempt_ns: int,
               next_attempt_ns: int | None, delivered_ns: int | None, last_status: int | None,
               last_error: str | None) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE deliveries SET state = ?, attempts = ?, last_attempt_ns = ?, next_attempt_ns = ?, "
                "delivered_ns = ?, last_status = ?, last_error = ? WHERE id = ?",
                (state, attempts, last_attempt_ns, next_attempt_ns, delivered_ns, last_status, last_error,
                 delivery_id))

    def fail_unknown_sinks(self, sinks: set[str]) -> int:
        """Pending deliveries of sinks that are no longer configured become failed (visible, not stuck)."""
        marks = ",".join("?" * len(sinks)) or "NULL"
        with self._lock:
            cur = self._db.execute(
                f"UPDATE deliveries SET state = 'failed', next_attempt_ns = NULL, last_error = "
                f"'sink no longer configured' WHERE state = 'pending' AND sink NOT IN ({marks})", sorted(sinks))
        return cur.rowcount

    def prune(self, before_ns: int) -> int:
        """Forget finished deliveries created before `before_ns`."""
        with self._lock:
            cur = self._db.execute("DELETE FROM deliveries WHERE state != 'pending' AND created_ns < ?", (before_ns,))
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
        with self._lock:
            rows = self._db.execute(sql, [*params, limit]).fetchall()
        return [_row(r) for r in rows]

    def counts(self) -> dict[tuple[str, str], int]:
        """(sink, state) -> number of deliveries."""
        with self._lock:
            rows = self._db.execute("SELECT sink, state, COUNT(*) FROM deliveries GROUP BY sink, state").fetchall()
        return {(sink, state): n for sink, state, n in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()
