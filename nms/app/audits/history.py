"""Audit reports with history: SQLite beside the service state (`<data_dir>/audits.sqlite`).
Ids rise and are never reused; only the newest `keep` reports are kept."""

from __future__ import annotations

import threading
from pathlib import Path

from nms.app.audits.model import AuditReport, AuditResult
from nms.state import open_sqlite


class AuditHistory:
    def __init__(self, path: Path, keep: int = 1000):
        self.keep = keep
        self._lock = threading.Lock()
        self._db = open_sqlite(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS audit_reports (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "trigger TEXT NOT NULL, started_ns INTEGER NOT NULL, finished_ns INTEGER NOT NULL, "
                         "findings INTEGER NOT NULL, body TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS audit_results (report_id INTEGER NOT NULL, audit TEXT NOT NULL, "
                         "status TEXT NOT NULL, findings INTEGER NOT NULL, PRIMARY KEY (audit, report_id))")

    def add(self, report: AuditReport) -> AuditReport:
        """Store a report; returns it with its id."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute("INSERT INTO audit_reports (trigger, started_ns, finished_ns, findings, body) "
                                       "VALUES (?, ?, ?, ?, '')", (report.trigger, report.started_ns,
                                                                   report.finished_ns, len(report.findings)))
                report = report.model_copy(update={"id": cur.lastrowid})
                self._db.execute(
                    "UPDATE audit_reports SET body = ? WHERE id = ?", (report.model_dump_json(), report.id)
                )
                self._db.executemany("INSERT INTO audit_results VALUES (?, ?, ?, ?)",
                                     [(report.id, r.audit, r.status, len(r.findings)) for r in report.results])
                old = "SELECT id FROM audit_reports ORDER BY id DESC LIMIT -1 OFFSET ?"
                self._db.execute(f"DELETE FROM audit_results WHERE report_id IN ({old})", (self.keep,))
                self._db.execute(f"DELETE FROM audit_reports WHERE id IN ({old})", (self.keep,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return report

    def get(self, report_id: int) -> AuditReport | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM audit_reports WHERE id = ?", (report_id,)).fetchone()
        return None if row is None else AuditReport.model_validate_json(row[0])

    def list(self, audit: str | None = None, limit: int = 100) -> list[AuditReport]:
        """Newest first; with `audit`, the reports that ran it."""
        sql = "SELECT body FROM audit_reports"
        params: list = []
        if audit is not None:
            sql += " WHERE id IN (SELECT report_id FROM audit_results WHERE audit = ?)"
            params.append(audit)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [AuditReport.model_validate_json(r[0]) for r in rows]

    def last_results(self) -> dict[str, tuple[int, AuditResult]]:
        """Per audit: (report id, its newest result)."""
        with self._lock:
            rows = self._db.execute("SELECT audit, MAX(report_id) FROM audit_results GROUP BY audit").fetchall()
        out = {}
        for audit, report_id in rows:
            report = self.get(report_id)
            for r in report.results if report else ():
                if r.audit == audit:
                    out[audit] = (report_id, r)
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
