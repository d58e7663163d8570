"""Incidents in the state store: the JSON body plus indexed columns, and every event in
incident_events (the history, and the rising ids of the event stream). correlator.incidents keeps
their lifecycle; the database keeps at most one open incident per dedup key (migration 2)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from nms.records import Incident, IncidentEvent, IncidentState
from nms.state.db import Database, Dialect
from nms.state.entries import IncidentEventEntry


class IncidentWriter:
    """The incident writes of one transaction (StateStore.incident_batch)."""

    def __init__(self, db: Database):
        self._db = db

    def insert(self, incident: Incident) -> tuple[Incident, bool]:
        """Store a new incident: (it with its id, True); the id passed in is ignored. When an open
        incident of its dedup key exists already (another correlator opened it first), nothing is
        stored: (that incident, False)."""
        new_id = self._db.insert(
            "INSERT INTO incidents (dedup_key, state, kind, element, opened_ns, resolved_ns, body) "
            "VALUES (?, ?, ?, ?, ?, ?, '') ON CONFLICT (dedup_key) WHERE state = 'open' DO NOTHING",
            (incident.dedup_key, incident.state, incident.kind, incident.element, incident.opened_ns,
             incident.resolved_ns))
        if new_id is None:
            # PostgreSQL waited for the other transaction's commit: this statement sees its row
            row = self._db.execute("SELECT body FROM incidents WHERE dedup_key = ? AND state = 'open'",
                                   (incident.dedup_key,)).fetchone()
            if row is None:
                raise RuntimeError(f"incident {incident.dedup_key}: neither inserted nor found open")
            return Incident.model_validate_json(row[0]), False
        # parent_id: written by update below
        incident = incident.model_copy(update={"id": new_id})
        self.update(incident)
        return incident, True

    def update(self, incident: Incident) -> None:
        self._db.execute("UPDATE incidents SET state = ?, kind = ?, resolved_ns = ?, parent_id = ?, body = ? "
                         "WHERE id = ?", (incident.state, incident.kind, incident.resolved_ns, incident.parent_id,
                                          incident.model_dump_json(), incident.id))

    def add_event(self, event: IncidentEvent, comment: str | None = None) -> int:
        """Append to the history; returns the event's id."""
        event_id = self._db.insert("INSERT INTO incident_events (incident_id, event, ts, comment, body) "
                                   "VALUES (?, ?, ?, ?, ?)",
                                   (event.incident.id, event.event, event.ts, comment, event.model_dump_json()))
        assert event_id is not None
        return event_id


def incident_match(dialect: Dialect, table: str, kind: str | None, job: str | None, element: str | None,
                   since_ns: int | None, until_ns: int | None) -> tuple[list[str], list[str | int]]:
    """SQL conditions on the incidents row `table` for list_incidents' filters."""
    where: list[str] = []
    params: list[str | int] = []
    if kind is not None:
        where.append(f"{table}.kind = ?")
        params.append(kind)
    if job is not None:
        where.append(dialect.json_array_has(f"{table}.body", "jobs"))
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


class IncidentTables:
    """The incident half of StateStore."""

    _db: Database

    @contextmanager
    def incident_batch(self) -> Iterator[IncidentWriter]:
        """One transaction of incident writes: all of them are stored, or none."""
        with self._db.transaction(serial="incidents") as db:
            yield IncidentWriter(db)

    def prune_incidents(self, before_ns: int) -> int:
        """Delete incidents resolved before `before_ns`, with their events; returns how many."""
        with self._db.transaction(serial="incidents") as db:
            old = "SELECT id FROM incidents WHERE state = 'resolved' AND resolved_ns < ?"
            db.execute(f"DELETE FROM incident_events WHERE incident_id IN ({old})", (before_ns,))
            return db.execute(
                "DELETE FROM incidents WHERE state = 'resolved' AND resolved_ns < ?", (before_ns,)
            ).rowcount

    def open_incidents_keyed(self, keys: Iterable[str]) -> dict[str, Incident]:
        """The open incidents of these dedup keys as stored (other correlators' writes included)."""
        wanted, out = sorted(set(keys)), {}
        with self._db.read() as db:
            for i in range(0, len(wanted), 500):
                chunk = wanted[i:i + 500]
                rows = db.execute(f"SELECT body FROM incidents WHERE state = 'open' AND dedup_key IN "
                                  f"({', '.join('?' * len(chunk))})", chunk).fetchall()
                for (body,) in rows:
                    incident = Incident.model_validate_json(body)
                    out[incident.dedup_key] = incident
        return out

    def get_incident(self, incident_id: int) -> Incident | None:
        with self._db.read() as db:
            row = db.execute("SELECT body FROM incidents WHERE id = ?", (incident_id,)).fetchone()
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
        dialect = self._db.dialect
        match, match_params = incident_match(dialect, "incidents", kind, job, element, since_ns, until_ns)
        if top_level:
            where.append("parent_id IS NULL")
            if match:
                child, child_params = incident_match(dialect, "c", kind, job, element, since_ns, until_ns)
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
        with self._db.read() as db:
            rows = db.execute(sql, params).fetchall()
        return [Incident.model_validate_json(r[0]) for r in rows]

    def incident_children(self, parent_ids: list[int]) -> dict[int, list[Incident]]:
        """The children of these incidents, by parent id, oldest first."""
        out: dict[int, list[Incident]] = {}
        for start in range(0, len(parent_ids), 500):
            chunk = parent_ids[start:start + 500]
            with self._db.read() as db:
                rows = db.execute(f"SELECT body FROM incidents WHERE parent_id IN ({','.join('?' * len(chunk))}) "
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
        with self._db.read() as db:
            rows = db.execute(sql, (*params, limit)).fetchall()
        return [IncidentEventEntry.from_row(r) for r in (reversed(rows) if newest else rows)]

    def last_incident_event_id(self) -> int:
        """The highest id of a committed incident event (0: none): where a follower of the events starts."""
        with self._db.read() as db:
            row = db.execute("SELECT MAX(id) FROM incident_events").fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def last_incident_event(self, incident_id: int, kinds: tuple[str, ...]) -> IncidentEventEntry | None:
        """The newest event of one incident among `kinds`."""
        with self._db.read() as db:
            row = db.execute(f"SELECT id, comment, body FROM incident_events WHERE incident_id = ? AND event IN "
                             f"({','.join('?' * len(kinds))}) ORDER BY id DESC LIMIT 1",
                             (incident_id, *kinds)).fetchone()
        return None if row is None else IncidentEventEntry.from_row(row)
