"""`nms jobs`: job metadata on the service."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time

jobs_app = typer.Typer(help="Jobs (hosts, NICs, ranks, start/end) that the correlator joins.", no_args_is_help=True)
console = Console()


@jobs_app.command("list")
def list_jobs(active: bool = typer.Option(False, "--active", help="only jobs running now"),
              host: Optional[str] = typer.Option(None, help="only jobs on this host"),
              as_json: bool = typer.Option(False, "--json"),
              url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
    """List jobs."""
    params: dict = {}
    if active:
        params["active_at"] = time.time_ns()
    if host:
        params["host"] = host
    jobs = ApiClient(url, token).call("GET", "/jobs", params=params)
    if as_json:
        print(json.dumps(jobs, indent=2))
        return
    table = Table("id", "name", "hosts", "ranks", "start", "end")
    for job in jobs:
        table.add_row(job["id"], job["name"], str(len(job["hosts"])), str(len(job["ranks"])),
                      fmt_time(job["start"]), fmt_time(job["end"]) if job["end"] else "running")
    console.print(table)


@jobs_app.command("show")
def show_job(job_id: str, url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
    """Print one job as JSON."""
    print(json.dumps(ApiClient(url, token).call("GET", f"/jobs/{job_id}"), indent=2))


@jobs_app.command("add")
def add_jobs(file: Path = typer.Argument(..., help="JSON file: one job object or a list of them"),
             url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
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
def delete_job(job_id: str, url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
    """Delete a job."""
    ApiClient(url, token).call("DELETE", f"/jobs/{job_id}")
    console.print(f"[green]ok[/] job {job_id} deleted")
