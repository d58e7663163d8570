"""Audit reports with history: the state store's `audit_reports` and `audit_results` tables (SQLite in
`data_dir`, or the cluster's PostgreSQL: every member and API worker reads one history). Ids rise and
are never reused; only the newest `keep` reports are kept. A process's `<data_dir>/audits.sqlite` of
before is moved in once (`import_file`: its reports in their order, with new ids) and renamed
`*.imported`."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from nms.app.audits.model import AuditReport, AuditResult
from nms.state.db import Database

log = logging.getLogger(__name__)


class AuditHistory:
    def __init__(self, db: Database, keep: int = 1000):
        self._db, self.keep = db, keep

    def add(self, report: AuditReport) -> AuditReport:
        """Store a report; returns it with its id."""
        with self._db.transaction(serial="audits") as db:
            report = self._insert(db, report)
            # the (keep+1)-th newest report and all older ones go (none while there are fewer)
            edge = "SELECT id FROM audit_reports ORDER BY id DESC LIMIT 1 OFFSET ?"
            db.execute(f"DELETE FROM audit_results WHERE report_id <= ({edge})", (self.keep,))
            db.execute(f"DELETE FROM audit_reports WHERE id <= ({edge})", (self.keep,))
        return report

    @staticmethod
    def _insert(db: Database, report: AuditReport) -> AuditReport:
        report_id = db.insert("INSERT INTO audit_reports (trigger, started_ns, finished_ns, findings, body) "
                              "VALUES (?, ?, ?, ?, '')", (report.trigger, report.started_ns, report.finished_ns,
                                                         len(report.findings)))
        report = report.model_copy(update={"id": report_id})
        db.execute("UPDATE audit_reports SET body = ? WHERE id = ?", (report.model_dump_json(), report.id))
        for r in report.results:
            db.execute("INSERT INTO audit_results (report_id, audit, status, findings) VALUES (?, ?, ?, ?)",
                       (report.id, r.audit, r.status, len(r.findings)))
        return report

    def get(self, report_id: int) -> AuditReport | None:
        with self._db.read() as db:
            row = db.execute("SELECT body FROM audit_reports WHERE id = ?", (report_id,)).fetchone()
        return None if row is None else AuditReport.model_validate_json(row[0])

    def list(self, audit: str | None = None, limit: int = 100) -> list[AuditReport]:
        """Newest first; with `audit`, the reports that ran it."""
        sql = "SELECT body FROM audit_reports"
        params: list = []
        if audit is not None:
            sql += " WHERE id IN (SELECT report_id FROM audit_results WHERE audit = ?)"
            params.append(audit)
        with self._db.read() as db:
            rows = db.execute(sql + " ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [AuditReport.model_validate_json(r[0]) for r in rows]

    def last_results(self) -> dict[str, tuple[int, AuditResult]]:
        """Per audit: (report id, its newest result)."""
        with self._db.read() as db:
            rows = db.execute("SELECT audit, MAX(report_id) FROM audit_results GROUP BY audit").fetchall()
        out = {}
        for audit, report_id in rows:
            report = self.get(report_id)
            for r in report.results if report else ():
                if r.audit == audit:
                    out[audit] = (report_id, r)
        return out

    def import_file(self, path: Path) -> int:
        """Move the reports of a process's own history of before (`audits.sqlite`) in, oldest first
        (new ids, so after any already here); the file is renamed `*.imported`. Returns how many."""
        if not path.exists():
            return 0
        old = sqlite3.connect(str(path))
        try:
            bodies = [r[0] for r in old.execute("SELECT body FROM audit_reports ORDER BY id").fetchall()]
        finally:
            old.close()
        with self._db.transaction(serial="audits") as db:
            for body in bodies:
                self._insert(db, AuditReport.model_validate_json(body))
        path.rename(path.with_name(path.name + ".imported"))
        log.info("audit history: %d report(s) of %s moved to the state store (%s); the file is renamed "
                 "%s.imported", len(bodies), path, self._db.where, path.name)
        return len(bodies)
