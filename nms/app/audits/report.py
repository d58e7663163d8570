"""A report as Markdown, JSON or HTML (`nms audit report --format`, GET /audits/reports/{id}?format=)."""

from __future__ import annotations

import html
from datetime import UTC, datetime

from nms.app.audits.model import AuditReport

FORMATS = ("json", "md", "html")


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")


def _status(r) -> str:
    return {"clean": "clean", "findings": f"{len(r.findings)} finding(s)", "no_data": f"not enough data: {r.reason}",
            "error": f"error: {r.reason}"}[r.status]


def markdown(report: AuditReport) -> str:
    out = [f"# Fabric audit report {report.id}", "",
           f"{report.trigger} run, {_when(report.started_ns)}, {len(report.findings)} finding(s)", "",
           "| audit | result | checked |", "|---|---|---|"]
    out += [f"| {r.audit} | {_status(r)} | {r.checked} |" for r in report.results]
    for r in report.results:
        if not r.findings and not r.notes:
            continue
        out += ["", f"## {r.audit}", ""]
        out += [f"- **{f.severity}** `{f.element}`: {f.message}  \n  Remediation: {f.remediation}" for f in r.findings]
        out += [f"- note: {n}" for n in r.notes]
    return "\n".join(out) + "\n"


def html_page(report: AuditReport) -> str:
    e = html.escape
    rows = "".join(f"<tr><td>{e(r.audit)}</td><td>{e(_status(r))}</td><td>{r.checked}</td></tr>"
                   for r in report.results)
    findings = "".join(f"<tr><td>{e(f.audit)}</td><td>{e(f.severity)}</td><td><code>{e(f.element)}</code></td>"
                       f"<td>{e(f.message)}</td><td>{e(f.remediation)}</td></tr>" for f in report.findings)
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Fabric audit report {report.id}</title>"
            f"</head><body><h1>Fabric audit report {report.id}</h1><p>{e(report.trigger)} run, "
            f"{_when(report.started_ns)}, {len(report.findings)} finding(s)</p>"
            f"<table border=\"1\"><tr><th>audit</th><th>result</th><th>checked</th></tr>{rows}</table>"
            f"<h2>Findings</h2><table border=\"1\"><tr><th>audit</th><th>severity</th><th>element</th>"
            f"<th>finding</th><th>remediation</th></tr>{findings}</table></body></html>\n")


def render(report: AuditReport, fmt: str) -> str:
    if fmt == "md":
        return markdown(report)
    if fmt == "html":
        return html_page(report)
    return report.model_dump_json(indent=2)
