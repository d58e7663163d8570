"""`nms jobs`: job metadata on the service."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable, WideOpt, ago

jobs_app = typer.Typer(help="Jobs (hosts, NICs, ranks, start/end) that the correlator joins.", no_args_is_help=True)
console = Console()


@jobs_app.command("list")
def list_jobs(active: bool = typer.Option(False, "--active", help="only jobs running now"),
              host: str | None = typer.Option(None, help="only jobs on this host"),
              as_json: bool = typer.Option(False, "--json"),
              wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """List jobs (--wide: exact start and end times)."""
    params: dict = {}
    if active:
        params["active_at"] = time.time_ns()
    if host:
        params["host"] = host
    jobs = ApiClient(url, token).call("GET", "/jobs", params=params)
    if as_json:
        print(json.dumps(jobs, indent=2))
        return
    table = ListTable("id", Col("name", wrap=True, drop=1), Col("hosts", drop=3, justify="right"),
                      Col("ranks", drop=4, justify="right"), "start", "end")
    now = time.time_ns()
    when = (lambda ns: fmt_time(ns)) if wide else (lambda ns: ago(ns, now))  # noqa: E731
    for job in jobs:
        table.add_row(job["id"], job["name"], str(len(job["hosts"])), str(len(job["ranks"])),
                      when(job["start"]), when(job["end"]) if job["end"] else "running")
    table.print(console, wide, err_console)


@jobs_app.command("show")
def show_job(job_id: str, last: int = typer.Option(20, "--last", min=1, max=10_000, help="collectives to list"),
             as_json: bool = typer.Option(False, "--json", help="everything below as one JSON object"),
             url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """One job: ranks and hosts, its recent collectives (duration, bus bandwidth), slowdowns, incidents."""
    client = ApiClient(url, token)
    job = client.call("GET", f"/jobs/{job_id}")
    collectives = client.call("GET", f"/jobs/{job_id}/collectives", params={"limit": last})
    slowdowns = client.call("GET", f"/jobs/{job_id}/slowdowns")
    incidents = client.call("GET", "/incidents", params={"job": job_id, "limit": 50})
    if as_json:
        print(json.dumps({"job": job, "collectives": collectives, "slowdowns": slowdowns, "incidents": incidents},
                         indent=2))
        return
    console.print(f"[bold]job {job['id']}[/] {job['name']}  source={job['labels'].get('source', 'api')}  "
                  f"start {fmt_time(job['start'])}  {'end ' + fmt_time(job['end']) if job['end'] else 'running'}")
    console.print(f"hosts: {', '.join(job['hosts']) or '-'}")
    ranks = Table("comm", "rank", "host", "nic", "peers", "QPs", title="ranks")
    for r in job["ranks"]:
        ranks.add_row(r.get("comm_id") or "-", str(r["rank"]), r["host"], r.get("nic") or "-",
                      ",".join(map(str, r.get("peers", []))) or "-", _qps(r.get("qps", [])))
    console.print(ranks)
    timeline = Table("start", "comm", "op", "size", "seq", "duration", "busbw GB/s", "baseline", "",
                     title=f"collectives (last {last})")
    for c in collectives:
        base = c.get("baseline_busbw_gbps")
        timeline.add_row(fmt_time(c["start_ns"]), c["comm_id"], c["op"], c["size_bucket"], str(c["seq"]),
                         f"{c['duration_ns'] / 1e6:.3f} ms", f"{c['busbw_gbps']:.3f}",
                         f"{base:.3f}" if base is not None else "-", "[red]SLOW[/]" if c.get("slow") else "")
    console.print(timeline)
    slow = Table("state", "comm", "op", "size", "since", "busbw / baseline", "slow collectives", title="slowdowns")
    for state, items in (("[red]active[/]", slowdowns["active"]), ("cleared", slowdowns["cleared"])):
        for s in items:
            slow.add_row(state, s["comm_id"], s["op"], s["size_bucket"], fmt_time(s["since_ns"]),
                         f"{s['busbw_gbps']:.3f} / {s['baseline_busbw_gbps']:.3f} ({s['ratio']:.0%})",
                         ",".join(map(str, s["slow_collectives"][-8:])))
    console.print(slow)
    linked = Table("id", "state", "kind", "element", "summary", title="incidents")
    for i in incidents:
        linked.add_row(str(i["id"]), i["state"], i["kind"], i["element"], i["summary"])
    console.print(linked)


def _qps(qps: list[int]) -> str:
    text = ",".join(hex(q) for q in qps[:6])
    return (text + f" (+{len(qps) - 6})" if len(qps) > 6 else text) or "-"


@jobs_app.command("add")
def add_jobs(file: Path = typer.Argument(..., help="JSON file: one job object or a list of them"),
             url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Create or replace jobs from a JSON file (a progress bar shows large imports)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        err_console.print(f"[red]error:[/] cannot read {file}: {e}")
        raise typer.Exit(2) from None
    jobs = data if isinstance(data, list) else [data]
    client = ApiClient(url, token)
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("uploading jobs", total=len(jobs))
        for job in jobs:
            client.call("POST", "/jobs", json=job)
            progress.advance(task)
    console.print(f"[green]ok[/] {len(jobs)} job(s) stored")


@jobs_app.command("delete")
def delete_job(job_id: str, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Delete a job."""
    ApiClient(url, token).call("DELETE", f"/jobs/{job_id}")
    console.print(f"[green]ok[/] job {job_id} deleted")
