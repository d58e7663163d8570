"""`nms agents`: host probe agents and their commands, on the service."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.markup import escape

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago

agents_app = typer.Typer(help="Host probe agents (nms-agent): who is registered, commands and their results.",
                         no_args_is_help=True)
console = Console(soft_wrap=True)
STATUS_STYLE = {"pending": "dim", "delivered": "yellow", "done": "green", "failed": "red", "expired": "red"}
FINISHED = ("done", "failed", "expired")


def _status(value: str) -> str:
    return f"[{STATUS_STYLE[value]}]{value}[/]" if value in STATUS_STYLE else value


def _print_commands(commands: list[dict], wide: bool = False) -> None:
    table = ListTable("id", "host", "kind", Col("args", wrap=True, drop=2), "status", Col("issued", drop=1),
                      Col("by", drop=3), Col("result", wrap=True))
    now = time.time_ns()
    for c in commands:
        table.add_row(str(c["id"]), c["host"], c["kind"], escape(json.dumps(c["args"])) if c["args"] else "",
                      _status(c["status"]), fmt_time(c["issued_ns"]) if wide else ago(c["issued_ns"], now),
                      escape(c["by"]), escape(c["message"]))
    table.print(console, wide, err_console)


@agents_app.command("list")
def list_agents(as_json: bool = typer.Option(False, "--json"), wide: bool = WideOpt, url: str = UrlOpt,
                token: str | None = TokenOpt) -> None:
    """Agents registered with this run of the service (--wide: every column, exact times)."""
    agents = ApiClient(url, token).call("GET", "/agents")
    if as_json:
        print(json.dumps(agents, indent=2))
        return
    table = ListTable("host", Col("version", drop=2), Col("transport", drop=3), Col("NICs", wrap=True, drop=4),
                      Col("peers", drop=5, justify="right"), Col("registered", drop=6), "last seen",
                      Col("token", drop=1))
    now = time.time_ns()
    when = (lambda ns: fmt_time(ns)) if wide else (lambda ns: ago(ns, now))  # noqa: E731
    for a in sorted(agents, key=lambda a: a["host"]):
        nics = ", ".join(f"{n['name']}={n['address']}" for n in a["nics"])
        table.add_row(a["host"], a["version"], a["transport"], nics, str(a["peers"]), when(a["registered_ns"]),
                      when(a["last_seen_ns"]), a["token"])
    table.print(console, wide, err_console)
    console.print(f"{len(agents)} agents")


@agents_app.command("commands")
def list_commands(host: str | None = typer.Option(None, help="only this host's commands"),
                  status: str | None = typer.Option(None, help="pending, delivered, done, failed or expired"),
                  limit: int = typer.Option(100, min=1, max=10_000, help="newest this many"),
                  as_json: bool = typer.Option(False, "--json"), wide: bool = WideOpt, url: str = UrlOpt,
                  token: str | None = TokenOpt) -> None:
    """Commands sent to agents, newest first, with their status and result (--wide: every column)."""
    params = {k: v for k, v in {"host": host, "status": status, "limit": limit}.items() if v is not None}
    commands = ApiClient(url, token).call("GET", "/agents/commands", params=params)
    if as_json:
        print(json.dumps(commands, indent=2))
        return
    _print_commands(commands, wide)


@agents_app.command("show")
def show_command(host: str, command_id: int, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Print one command (status, result message and details) as JSON."""
    print(json.dumps(ApiClient(url, token).call("GET", f"/agents/{host}/commands/{command_id}"), indent=2))


@agents_app.command("send")
def send(hosts: str = typer.Argument(..., help="host, or comma-separated hosts"),
         kind: str = typer.Argument(..., help="reprobe_paths, set_rate or refresh_peers"),
         rate: float | None = typer.Option(None, help="set_rate: exchanges/s per path"),
         wait: float = typer.Option(0.0, help="seconds to wait for the agents' results (0: do not wait)"),
         url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Send agents a command; with --wait, show what they did (exit 1 if one failed or none answered)."""
    client = ApiClient(url, token)
    body: dict = {"kind": kind, "args": {} if rate is None else {"rate": rate}}
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if len(names) == 1:
        sent = [client.call("POST", f"/agents/{names[0]}/commands", json=body)]
    else:
        sent = client.call("POST", "/agents/commands", json={**body, "hosts": names})
    if wait <= 0:
        for c in sent:
            console.print(f"command {c['id']} to {c['host']}: {c['status']}")
        return
    deadline = time.monotonic() + wait
    with console.status(f"waiting up to {wait:g} s for {len(sent)} result(s)..."):
        while True:
            sent = [c if c["status"] in FINISHED else client.call("GET", f"/agents/{c['host']}/commands/{c['id']}")
                    for c in sent]
            if all(c["status"] in FINISHED for c in sent) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    _print_commands(sent)
    if any(c["status"] != "done" for c in sent):
        err_console.print("[red]not every agent carried the command out[/]")
        raise typer.Exit(1)
