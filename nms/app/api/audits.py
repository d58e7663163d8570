"""/audits: the fabric audits (nms/app/audits, docs/audits.md): what is configured with each
audit's last result, the report history, one report as JSON, Markdown or HTML, and on-demand runs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import HTMLResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from nms.app.api.deps import AuditsDep, AuditSourceDep
from nms.app.audits import CHECKS
from nms.app.audits.model import AuditReport, AuditResult
from nms.app.audits.report import render
from nms.app.audits.runner import UnknownAudit
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, ErrorDetail, Principal, require
from nms.app.binding import require_unbound

router = APIRouter(prefix="/audits", tags=["audits"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})
ReportId = Annotated[int, Path(ge=1, le=2**63 - 1)]
NOT_FOUND = {404: {"model": ErrorDetail, "description": "no such report or audit"}}


class AuditInfo(BaseModel):
    name: str
    enabled: bool
    schedule: str
    open_incidents: str = Field(description="findings at least this severe open incidents ('never': none)")
    settings: dict
    last_report_id: int | None = None
    last: AuditResult | None = None


class ReportSummary(BaseModel):
    id: int
    trigger: str
    started_ns: int
    finished_ns: int
    audits: dict[str, str] = Field(description="audit -> status")
    findings: int


class RunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="one audit; all enabled audits when absent")


@router.get("", response_model=list[AuditInfo], summary="Audits, their settings and last result",
            dependencies=[Depends(require("read"))])
def list_audits(runner: AuditsDep) -> list[AuditInfo]:
    last = runner.history.last_results()
    out = []
    for name in CHECKS:
        s = runner.config.settings(name)
        report_id, result = last.get(name, (None, None))
        out.append(
            AuditInfo(
                name=name,
                enabled=s.enabled and runner.config.enabled,
                schedule=runner.schedule_text(name),
                open_incidents=runner.incident_level(name),
                settings=s.model_dump(mode="json"),
                last_report_id=report_id,
                last=result,
            )
        )
    return out


@router.get("/reports", response_model=list[ReportSummary], summary="Report history, newest first",
            dependencies=[Depends(require("read"))])
def list_reports(runner: AuditsDep, audit: str | None = Query(None, description="only reports that ran this audit"),
                 limit: int = Query(100, ge=1, le=10_000)) -> list[ReportSummary]:
    return [ReportSummary(id=r.id, trigger=r.trigger, started_ns=r.started_ns, finished_ns=r.finished_ns,
                          audits={x.audit: x.status for x in r.results}, findings=len(r.findings))
            for r in runner.history.list(audit, limit)]


@router.get("/reports/{report_id}", response_model=AuditReport, summary="One report (JSON, Markdown or HTML)",
            responses={**NOT_FOUND, 200: {"content": {"text/markdown": {}, "text/html": {}}}},
            dependencies=[Depends(require("read"))])
def get_report(report_id: ReportId, runner: AuditsDep, format: Literal["json", "md", "html"] = "json"):
    report = runner.history.get(report_id)
    if report is None:
        raise HTTPException(404, f"no audit report {report_id}")
    if format == "md":
        return PlainTextResponse(render(report, "md"), media_type="text/markdown")
    if format == "html":
        return HTMLResponse(render(report, "html"))
    return report


@router.post("/run", response_model=AuditReport, summary="Run one audit, or all enabled ones, now",
             responses=NOT_FOUND)
async def run(runner: AuditsDep, source: AuditSourceDep, body: RunBody | None = None,
              who: Principal = Depends(require_unbound("act"))) -> AuditReport:
    try:
        names = runner.names(body.name if body else None)
    except UnknownAudit as e:
        raise HTTPException(404, str(e)) from None
    return await runner.run_on(source, names, "manual")
