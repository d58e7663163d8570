"""`nms actions`: list and show actions with their audit log; request, approve, reject, roll back."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago

actions_app = typer.Typer(help="Actions: what the controller did (or proposes) about incidents.", no_args_is_help=True)
console = Console(soft_wrap=True)
STATE_STYLE = {"applied": "green", "failed": "bold red", "awaiting_approval": "yellow", "rolled_back": "cyan",
               "expired": "dim", "rejected": "dim"}


def _state(action: dict) -> str:
    text = action["state"] + (" (dry run)" if action["dry_run"] else "")
    style = STATE_STYLE.get(action["state"])
    return f"[{style}]{text}[/]" if style else text


def _print(action: dict, verb: str) -> None:
    console.print(f"action {action['id']} {verb}: {_state(action)}" +
                  (f" - {escape(action['result'])}" if action.get("result") else ""), highlight=False)


@actions_app.command("list")
def list_actions(state: str | None = typer.Option(None, help="e.g. awaiting_approval, applied"),
                 kind: str | None = typer.Option(None, help="host_reroute, drain_link or isolate_port"),
                 incident: int | None = typer.Option(None, help="only actions for this incident"),
                 limit: int = typer.Option(1000, min=1),
                 as_json: bool = typer.Option(False, "--json", help="print JSON"),
                 wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """List actions, newest first (--wide: every column, exact times)."""
    params: dict = {"limit": limit}
    for name, value in (("state", state), ("kind", kind), ("incident_id", incident)):
        if value is not None:
            params[name] = value
    actions = ApiClient(url, token).call("GET", "/actions", params=params)
    if as_json:
        print(json.dumps(actions, indent=2))
        return
    table = ListTable("id", Col("state", wrap=not wide), "kind", "element", Col("targets", wrap=not wide, drop=3),
                      Col("incident", drop=2), Col("by", drop=5), Col("created", drop=1), Col("expires", drop=4))
    now = time.time_ns()
    when = (lambda ns: fmt_time(ns)) if wide else (lambda ns: ago(ns, now))  # noqa: E731
    for a in actions:
        table.add_row(str(a["id"]), _state(a), a["kind"], a["element"], ("," if wide else ", ").join(a["targets"]),
                      str(a["incident_id"] or ""), escape(a["approved_by"] or a["requested_by"]),
                      when(a["created_ns"]), when(a["expires_ns"]) if a["expires_ns"] else "")
    table.print(console, wide, err_console)
    err_console.print(f"{len(actions)} action(s)")


@actions_app.command("show")
def show_action(action_id: int = typer.Argument(..., help="action id"),
                as_json: bool = typer.Option(False, "--json", help="print the action and its audit log as JSON"),
                url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """One action: what, why, before/after, and its audit log."""
    client = ApiClient(url, token)
    a = client.call("GET", f"/actions/{action_id}")
    events = client.call("GET", f"/actions/{action_id}/events")
    if as_json:
        print(json.dumps({"action": a, "events": events}, indent=2))
        return
    console.print(f"[bold]action {a['id']}[/] {_state(a)}: {a['kind']} off {a['element']}", highlight=False)
    details = Table(show_header=False, box=None)
    for name, value in (("targets", ", ".join(a["targets"])), ("incident", str(a["incident_id"] or "")),
                        ("reason", escape(a["reason"])), ("requested by", a["requested_by"]),
                        ("approved by", a["approved_by"] or ""), ("created", fmt_time(a["created_ns"])),
                        ("applied", fmt_time(a["applied_ns"]) if a["applied_ns"] else ""),
                        ("expires", fmt_time(a["expires_ns"]) if a["expires_ns"] else ""),
                        ("reverted", fmt_time(a["reverted_ns"]) if a["reverted_ns"] else ""),
                        ("result", escape(a["result"] or ""))):
        details.add_row(name, value)
    console.print(details)
    for name in ("params", "before", "after"):
        console.print(f"{name}:")
        console.print_json(json.dumps(a[name]))
    log = Table("event id", "event", "time", "by", "why", title="audit log", title_justify="left")
    for e in events:
        log.add_row(str(e["id"]), e["event"], fmt_time(e["ts"]), escape(e["by"]), escape(e["note"]))
    console.print(log)


@actions_app.command("request")
def request_action(incident: int | None = typer.Option(None, help="plan for this incident"),
                   element: str | None = typer.Option(None, help="a link dev:port--dev:port"),
                   kind: str | None = typer.Option(None, help="host_reroute, drain_link or isolate_port"),
                   dry_run: bool = typer.Option(False, "--dry-run", help="record the proposal, send nothing"),
                   url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Request actions (needs an act token, which counts as the approval)."""
    body = {k: v for k, v in (("incident_id", incident), ("element", element), ("kind", kind)) if v is not None}
    for a in ApiClient(url, token).call("POST", "/actions", json=body | {"dry_run": dry_run}):
        _print(a, "requested")


@actions_app.command("approve")
def approve(action_id: int = typer.Argument(..., help="action id"),
            url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Approve an action awaiting approval; it is applied at once."""
    _print(ApiClient(url, token).call("POST", f"/actions/{action_id}/approve"), "approved")


@actions_app.command("reject")
def reject(action_id: int = typer.Argument(..., help="action id"),
           reason: str = typer.Option("", help="kept in the audit log"),
           url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Reject a proposal."""
    _print(ApiClient(url, token).call("POST", f"/actions/{action_id}/reject", json={"reason": reason}), "rejected")


@actions_app.command("rollback")
def rollback(action_id: int = typer.Argument(..., help="action id"),
             reason: str = typer.Option("", help="kept in the audit log"),
             url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Undo an applied action."""
    _print(ApiClient(url, token).call("POST", f"/actions/{action_id}/rollback", json={"reason": reason}),
           "rolled back")
