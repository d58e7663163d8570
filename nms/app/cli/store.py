"""`nms store`: the telemetry store's health and counters, and the points it quarantined
(GET /store, POST /store/quarantine/replay)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, fmt_time

console = Console(soft_wrap=True)
store_app = typer.Typer(help="The telemetry store: health, counters, quarantined points.", no_args_is_help=True)


@store_app.command("status")
def status(as_json: bool = typer.Option(False, "--json"),
           limit: int = typer.Option(5, "--limit", "-n", help="quarantined points shown"),
           url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Backend, health, write counters and the newest quarantined points; exits 1 when unhealthy."""
    state = ApiClient(url, token).call("GET", "/store", params={"limit": limit})
    if as_json:
        print(json.dumps(state, indent=2))
    else:
        _print(state)
    if not state["health"].get("ok"):
        raise typer.Exit(1)


def _print(state: dict) -> None:
    health = state["health"]
    console.print(f"store {state['backend']}: " + ("[green]ok[/]" if health.get("ok") else "[red]unavailable[/]")
                  + (f" (last error: {health['last_error']})" if health.get("last_error") else ""))
    table = Table("counter", "value")
    for key, value in sorted(state["stats"].items()):
        table.add_row(key.replace("_", " "), f"{value:g}")
    console.print(table)
    quarantine = health.get("quarantine")
    if quarantine is None:
        return
    if not quarantine["points"]:
        console.print("quarantine: empty")
        return
    console.print(f"[yellow]quarantine: {quarantine['points']} points[/] ({quarantine['bytes']} bytes in "
                  f"{quarantine['path']}; {quarantine['dropped']} dropped to stay within its size). "
                  f"Fix the cause, then `nms store replay`.")
    console.print(f"last reason: {quarantine['last_reason']}")
    for entry in state["quarantined"]:
        console.print(f"  {fmt_time(entry['ts'])}  {entry['line'][:100]}\n    {entry['reason']}")


@store_app.command("replay")
def replay(url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Send the quarantined points again (admin scope). Points still refused return to the quarantine."""
    n = ApiClient(url, token).call("POST", "/store/quarantine/replay")["replayed"]
    console.print(f"{n} quarantined points queued for writing again")
