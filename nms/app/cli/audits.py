"""`nms audit`: list the fabric audits, run them now, print a report (Markdown, JSON or HTML)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago, severity

audit_app = typer.Typer(help="Fabric audits: cabling, MTU, speed, errors, ECMP balance, clock, drift, probe coverage.",
                        no_args_is_help=True)
console = Console(soft_wrap=True)
SEVERITY_STYLE = {"critical": "bold red", "major": "red", "minor": "yellow", "warning": "cyan"}


def _result_text(result: dict | None) -> str:
    if result is None:
        return "never run"
    if result["status"] == "findings":
        return f"[red]{len(result['findings'])} finding(s)[/]"
    if result["status"] == "no_data":
        return f"[dim]not enough data: {result['reason']}[/]"
    return "[green]clean[/]" if result["status"] == "clean" else f"[red]error: {result['reason']}[/]"


def print_report(report: dict, wide: bool = False) -> None:
    table = ListTable("audit", Col("result", wrap=True), Col("checked", justify="right"))
    for r in report["results"]:
        table.add_row(r["audit"], _result_text(r), str(r["checked"]))
    table.print(console, wide)
    findings = [f for r in report["results"] for f in r["findings"]]
    if findings:
        t = ListTable("audit", "severity" if wide else "sev", "element", Col("finding", wrap=True),
                      Col("remediation", wrap=True, drop=1))
        for f in findings:
            t.add_row(f["audit"], severity(f["severity"], SEVERITY_STYLE, wide), f["element"], escape(f["message"]),
                      escape(f["remediation"]))
        t.print(console, wide, err_console)
    err_console.print(f"report {report['id']}: {len(findings)} finding(s)")


@audit_app.command("list")
def list_audits(as_json: bool = typer.Option(False, "--json", help="print JSON"),
                wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """The audits, their schedule and last result (--wide: every column)."""
    audits = ApiClient(url, token).call("GET", "/audits")
    if as_json:
        print(json.dumps(audits, indent=2))
        return
    table = ListTable("audit", Col("enabled", drop=2), Col("schedule", wrap=True), Col("incidents at", drop=3),
                      Col("last report", drop=1), Col("last result", wrap=True))
    for a in audits:
        table.add_row(a["name"], "yes" if a["enabled"] else "no", a["schedule"], a["open_incidents"],
                      str(a["last_report_id"] or ""), _result_text(a["last"]))
    table.print(console, wide, err_console)


@audit_app.command("run")
def run(name: str | None = typer.Argument(None, help="one audit (default: every enabled one)"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Run audits now; exit status 3 when something was found."""
    report = ApiClient(url, token, timeout=120).call("POST", "/audits/run", json={"name": name} if name else {})
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, wide)
    if any(r["findings"] for r in report["results"]):
        raise typer.Exit(3)


@audit_app.command("report")
def report(report_id: int | None = typer.Argument(None, help="report id (default: the newest)"),
           fmt: str = typer.Option("md", "--format", help="md, json or html"),
           audit: str | None = typer.Option(None, help="without an id: the newest report that ran this audit"),
           list_: bool = typer.Option(False, "--list", help="list the report history instead"),
           wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Print one report as Markdown, JSON or HTML (or the history with --list)."""
    if fmt not in ("md", "json", "html"):
        err_console.print(f"[red]error:[/] --format must be md, json or html, not {fmt!r}")
        raise typer.Exit(2)
    client = ApiClient(url, token)
    if list_ or report_id is None:
        params = {"limit": 1000 if list_ else 1, **({"audit": audit} if audit else {})}
        reports = client.call("GET", "/audits/reports", params=params)
        if list_:
            table = ListTable("id", "trigger", "started", Col("audits", wrap=not wide),
                              Col("findings", justify="right"))
            for r in reports:
                table.add_row(str(r["id"]), r["trigger"], fmt_time(r["started_ns"]) if wide else ago(r["started_ns"]),
                              ("," if wide else ", ").join(r["audits"]), str(r["findings"]))
            table.print(console, wide, err_console)
            return
        if not reports:
            err_console.print("no audit report yet: run one with `nms audit run`")
            raise typer.Exit(1)
        report_id = reports[0]["id"]
    print(client.call_text(f"/audits/reports/{report_id}?format={fmt}"), end="")
