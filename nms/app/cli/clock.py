"""`nms clock`: the newest clock solution per host (GET /clock)."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago

console = Console(soft_wrap=True)


def clock(as_json: bool = typer.Option(False, "--json"),
          host: list[str] = typer.Option([], "--host", help="only these hosts (repeatable)"),
          wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Clock offset and drift per host vs fabric time (the mean clock), from the network-effect solve
    (--wide: every column, exact slot times)."""
    status = ApiClient(url, token).call("GET", "/clock", params={"host": host} if host else None)
    if as_json:
        print(json.dumps(status, indent=2))
        return
    if not status["enabled"]:
        console.print("clock sync is disabled in the service's config (clock.enabled)")
        return
    table = ListTable("host", Col("slot start", drop=1), Col("offset", justify="right"),
                      Col("drift", justify="right"), Col("bound", drop=2, justify="right"),
                      Col("age", justify="right"), Col("in last solve", drop=3))
    for h in status["hosts"]:
        table.add_row(h["host"], fmt_time(h["window_start"]) if wide else ago(h["window_start"]),
                      f"{h['offset_ns'] / 1e3:+.3f} us", f"{h['drift_ppb'] / 1e3:+.3f} ppm", f"{h['bound_ns']:.0f} ns",
                      f"{h['age_s']:.1f} s", "yes" if h["in_last_solve"] else "[yellow]no[/]")
    table.print(console, wide, err_console)
    last = status["last_solve"]
    if last is None:
        console.print(f"no solve yet ({status['pending_edges']} edges pending; a {status['window_s']:g} s slot is "
                      f"solved {status['solve_lag_s']:g} s after its end)")
        return
    console.print(f"last solve: slot {fmt_time(last['slot_start_ns'])}, {last['hosts']} hosts in "
                  f"{last['components']} component(s), {last['edges_used']} {last['method']} edges used, "
                  f"{last['edges_dropped']} dropped{': ' + ', '.join(last['dropped']) if last['dropped'] else ''}, "
                  f"{last['duration_s'] * 1e3:.1f} ms" + ("" if last["converged"] else " [red](did not converge)[/]"))
    console.print(f"{status['pending_edges']} edges pending, {status['late_edges']} late, "
                  f"{status['ignored_edges']} ignored since start")
