"""`nms incidents`: list, show and acknowledge incidents; follow the live event stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import typer
from rich.console import Console
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago
from nms.app.cli.tables import severity as short_severity
from nms.config.models import parse_duration

incidents_app = typer.Typer(help="Incidents: what the correlator found, open until N clean windows.",
                            no_args_is_help=True)
console = Console(soft_wrap=True)
SEVERITY_STYLE = {"critical": "bold red", "major": "red", "minor": "yellow", "warning": "cyan"}


def fmt_span(ns: int) -> str:
    s = max(0, ns) // 10**9
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _since(value: str) -> str | int:
    """ns, a duration ago ('1h'), or RFC 3339 (passed on for the service to check)."""
    if value.isdigit():
        return int(value)
    try:
        return time.time_ns() - int(parse_duration(value) * 1e9)
    except ValueError:
        return value


def _age(incident: dict) -> str:
    if incident["resolved_ns"] is not None:
        return f"lasted {fmt_span(incident['resolved_ns'] - incident['opened_ns'])}"
    return f"{fmt_span(time.time_ns() - incident['opened_ns'])} ago"


def _severity(value: str) -> str:
    return f"[{SEVERITY_STYLE.get(value, '')}]{value}[/]"


@incidents_app.command("list")
def list_incidents(state: str | None = typer.Option(None, help="open or resolved"),
                   kind: str | None = typer.Option(None, help="e.g. link_down, congestion"),
                   job: str | None = typer.Option(None, help="only incidents that affect this job"),
                   element: str | None = typer.Option(None, help="an element, a port (dev:port) or a device"),
                   since: str | None = typer.Option(None, help="active since: a duration ago (1h), ns or RFC 3339"),
                   limit: int = typer.Option(1000, min=1),
                   flat: bool = typer.Option(False, "--flat", help="every incident on its own row, children too"),
                   as_json: bool = typer.Option(False, "--json", help="print JSON"),
                   wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """List incidents, newest first (at 80 columns: id, state, kind, element, severity, opened; --wide: every
    column, exact times). The incidents a failure explains (a dead switch's links) are listed under it,
    indented (└ id)."""
    params: dict = {"limit": limit, "flat": flat}
    for name, value in (("state", state), ("kind", kind), ("job", job), ("element", element)):
        if value:
            params[name] = value
    if since:
        params["since"] = _since(since)
    incidents = ApiClient(url, token).call("GET", "/incidents", params=params)
    if as_json:
        print(json.dumps(incidents, indent=2))
        return
    table = ListTable("id", "state", "kind", "element", "severity" if wide else "sev", Col("opened", drop=1),
                      Col("age", drop=2), Col("jobs", wrap=not wide, drop=3), Col("ack", drop=4))
    now = time.time_ns()
    rows = [(str(i["id"]), i) for i in incidents]
    if not flat:
        rows = [row for i in incidents for row in [(str(i["id"]), i)]
                + [(f"└ {c['id']}", c) for c in i.get("child_incidents", [])]]
    for shown, i in rows:
        table.add_row(shown, i["state"], i["kind"], i["element"],
                      short_severity(i["severity"], SEVERITY_STYLE, wide),
                      fmt_time(i["opened_ns"]) if wide else ago(i["opened_ns"], now), _age(i),
                      ("," if wide else ", ").join(i["jobs"]), i["acknowledged_by"] or "")
    table.print(console, wide, err_console)
    children = len(rows) - len(incidents)
    err_console.print(f"{len(incidents)} incident(s)" + (f", {children} under them" if children else ""))


@incidents_app.command("show")
def show_incident(incident_id: int = typer.Argument(..., help="incident id"),
                  as_json: bool = typer.Option(False, "--json", help="print the incident and its events as JSON"),
                  url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """One incident: what, where, evidence, affected paths and jobs, and its history."""
    client = ApiClient(url, token)
    i = client.call("GET", f"/incidents/{incident_id}")
    events = client.call("GET", f"/incidents/{incident_id}/events")
    if as_json:
        print(json.dumps({"incident": i, "events": events}, indent=2))
        return
    console.print(f"[bold]incident {i['id']}[/] {i['state']}: {i['kind']} on {i['element_kind']} {i['element']}",
                  highlight=False)
    rows = [("severity", _severity(i["severity"])), ("summary", i["summary"]),
            ("direction", i["direction"] or ""), ("confidence", f"{i['confidence']:.2f}"),
            ("opened", f"{fmt_time(i['opened_ns'])} ({_age(i)})"), ("last seen", fmt_time(i["last_seen_ns"])),
            ("resolved", fmt_time(i["resolved_ns"]) if i["resolved_ns"] is not None else ""),
            ("updates", str(i["updates"])), ("clean windows", str(i["clean_windows"])),
            ("parent", f"incident {i['parent_id']} (this one is explained by it)" if i.get("parent_id") else ""),
            ("jobs", ", ".join(i["jobs"])),
            ("acknowledged", f"by {i['acknowledged_by']} at {fmt_time(i['acknowledged_ns'])}"
             if i["acknowledged_ns"] is not None else "")]
    details = Table(show_header=False, box=None)
    for name, value in rows:
        details.add_row(name, value)
    console.print(details)
    console.print(f"paths ({len(i['paths'])}): " + ", ".join(i["paths"][:10])
                  + (" ..." if len(i["paths"]) > 10 else ""), highlight=False, markup=False)
    console.print("evidence:")
    console.print_json(json.dumps(i["evidence"]))
    if i.get("explains"):
        console.print(f"explains ({len(i['explains'])}): " + ", ".join(i["explains"][:20])
                      + (" ..." if len(i["explains"]) > 20 else ""), highlight=False, markup=False)
    if i.get("child_incidents"):
        kids = Table("id", "state", "kind", "element", "adopted", title="children (no notifications of their own)",
                     title_justify="left")
        for c in i["child_incidents"]:
            kids.add_row(str(c["id"]), c["state"], c["kind"], c["element"],
                         fmt_time(c["adopted_ns"]) if c.get("adopted_ns") is not None else "")
        console.print(kids)
    history = Table("event id", "event", "time", "severity", "note", title="events", title_justify="left")
    for e in events:
        note = (f"by {e['incident']['acknowledged_by']}" + (f": {e['comment']}" if e["comment"] else "")
                if e["event"] == "acknowledged" else e["incident"]["summary"])
        history.add_row(str(e["id"]), e["event"], fmt_time(e["ts"]), e["incident"]["severity"], note)
    console.print(history)


@incidents_app.command("ack")
def ack_incident(incident_id: int = typer.Argument(..., help="incident id"),
                 comment: str | None = typer.Option(None, help="kept with the acknowledgement"),
                 url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Acknowledge an incident (the first acknowledgement counts)."""
    i = ApiClient(url, token).call("POST", f"/incidents/{incident_id}/ack",
                                   json={"comment": comment} if comment else None)
    console.print(f"[green]ok[/] incident {i['id']} acknowledged by {i['acknowledged_by']} "
                  f"at {fmt_time(i['acknowledged_ns'])}", highlight=False)


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, str | None, str]]:
    """Server-Sent Events -> (event, id, data); comments skipped."""
    event, event_id, data = "message", None, []
    for line in lines:
        if not line:
            if data:
                yield event, event_id, "\n".join(data)
            event, event_id, data = "message", None, []
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "id":
            event_id = value
        elif field == "data":
            data.append(value)


def _line(event: str, event_id: str | None, incident: dict) -> str:
    ack = f" (ack {incident['acknowledged_by']})" if incident.get("acknowledged_by") else ""
    under = f" (under #{incident['parent_id']})" if incident.get("parent_id") else ""
    return (f"{event:<12} #{incident['id']:<5} {incident['severity']:<8} {incident['kind']} {incident['element']}: "
            f"{incident['summary']}{under}{ack}" + (f"  [event {event_id}]" if event_id else ""))


def _follow(url: str, token: str | None, params: dict, seen: dict, as_json: bool) -> None:
    """Print the stream's events until it ends; `seen` keeps whether it connected and the last event id."""
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if seen["last_id"] is not None:
        headers["Last-Event-ID"] = seen["last_id"]
    timeout = httpx.Timeout(10.0, read=60.0)  # the service sends a keep-alive every 15 s
    with httpx.stream("GET", url.rstrip("/") + "/incidents/stream", params=params, headers=headers,
                      timeout=timeout) as response:
        if response.status_code >= 400:
            response.read()
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            err_console.print(f"[red]error:[/] GET /incidents/stream: HTTP {response.status_code}: {detail}")
            raise typer.Exit(1)
        seen["connected"] = True
        for event, event_id, data in _sse(response.iter_lines()):
            body = json.loads(data)
            if event == "snapshot":
                body = {"event": "snapshot", "incident": body}
            if as_json:
                print(json.dumps(body if event_id is None else {"id": int(event_id), **body}), flush=True)
            else:
                ts = fmt_time(body.get("ts") or body["incident"]["updated_ns"])
                print(f"{ts} {_line(event, event_id, body['incident'])}", flush=True)
            seen["last_id"] = event_id or seen["last_id"]


@incidents_app.command("watch")
def watch(open_first: bool = typer.Option(False, "--open", help="first print the incidents open now"),
          as_json: bool = typer.Option(False, "--json", help="one JSON object per event"),
          url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Follow incident events as they happen (Ctrl-C stops); reconnects and resumes where it left off."""
    seen: dict = {"connected": False, "last_id": None}
    delay = 1.0
    try:
        while True:
            try:
                _follow(url, token, {"state": "open"} if open_first and not seen["connected"] else {}, seen, as_json)
                err_console.print("stream ended; reconnecting")
                delay = 1.0
            except httpx.HTTPError as e:
                if not seen["connected"]:
                    err_console.print(f"[red]error:[/] cannot reach the service at {url}: {e}")
                    raise typer.Exit(2) from None
                err_console.print(f"stream lost ({e}); reconnecting in {delay:.0f} s")
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    except KeyboardInterrupt:
        pass
