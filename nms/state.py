"""Durable service state that is not telemetry (jobs now; incidents and actions later).

Kept in SQLite in the data directory so it survives restarts whichever telemetry backend is used.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from nms.records import Job


class StateStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, start INTEGER NOT NULL, end INTEGER, body TEXT NOT NULL)")

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

    def close(self) -> None:
        with self._lock:
            self._db.close()
