"""`nms cluster up|down|status`: a cluster of roles on this machine (nms/app/cluster_launcher.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from nms.app import cluster_launcher as launcher

app = typer.Typer(help="A cluster on this machine, loopback only, for trying it and for tests: nats-server "
                       "(JetStream; 1 node or 3), PostgreSQL, influxd and `nms serve` members per role "
                       "(docs/cluster.md).",
                  no_args_is_help=True)
console = Console()
err = Console(stderr=True)

DirOpt = Annotated[str, typer.Option("--dir", envvar="NMS_CLUSTER_DIR",
                                     help="The cluster's directory (state, configs, secrets, data, logs).")]


def _fail(e: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def _table(rows: list[dict]) -> Table:
    table = Table()
    for column, key in (("member", "name"), ("role", "role"), ("pid", "pid"), ("state", "state")):
        # never shortened: on a narrow terminal the url and health fold instead
        table.add_column(column, no_wrap=True, min_width=max([len(column)] + [len(str(r[key])) for r in rows]))
    table.add_column("url", overflow="fold")
    table.add_column("health", overflow="fold")
    for r in rows:
        colour = "green" if r["state"] == "alive" else "red"
        table.add_row(r["name"], r["role"], str(r["pid"]), f"[{colour}]{r['state']}[/{colour}]", r["url"],
                      r["health"])
    return table


@app.command()
def up(api: Annotated[int, typer.Option("--api", help="API members (each on its own loopback port).")] = 1,
       poll: Annotated[int, typer.Option("--poll", help="poll members (they share the switches).")] = 1,
       correlate: Annotated[int, typer.Option("--correlate", help="correlate members.")] = 1,
       write: Annotated[int, typer.Option("--write", help="write members (bus -> InfluxDB).")] = 1,
       config: Annotated[Path | None, typer.Option("--config", help="Base config each member's is derived from "
                                                                     "(default: a built-in one, no switches).")] = None,
       nats_nodes: Annotated[int, typer.Option("--nats-nodes", help="nats-server nodes: 1, or a 3-node JetStream "
                                                                    "cluster (streams with replicas 3).")] = 1,
       dir: DirOpt = launcher.DEFAULT_DIR,
       timeout: Annotated[float, typer.Option(help="Seconds to wait for each member to answer.")] = 90.0) -> None:
    """Start the cluster and wait until every member answers."""
    try:
        with console.status("starting the cluster") as progress:
            launcher.up(dir, {"api": api, "poll": poll, "correlate": correlate, "write": write}, config, timeout,
                        step=lambda msg: progress.update(msg), nats_nodes=nats_nodes)
        rows = launcher.status(dir)
    except launcher.ClusterError as e:
        raise _fail(e) from None
    console.print(_table(rows))
    root = launcher.ClusterDir(dir)
    console.print(f"cluster up in {root.root}: API token in {root.secrets / 'api-token'}, ingest token in "
                  f"{root.secrets / 'ingest-token'}; `nms cluster status --dir {root.root}`", highlight=False)


@app.command()
def status(dir: DirOpt = launcher.DEFAULT_DIR,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False) -> None:
    """Each member alive or dead and its health (API members: /health; others: their log's last line).
    Exit status 1 when a member is dead."""
    try:
        rows = launcher.status(dir)
    except launcher.ClusterError as e:
        raise _fail(e) from None
    if as_json:
        sys.stdout.write(json.dumps({"dir": str(launcher.ClusterDir(dir).root), "members": rows}, indent=2) + "\n")
    else:
        console.print(_table(rows))
    if any(r["state"] != "alive" for r in rows):
        raise typer.Exit(1)


@app.command()
def down(dir: DirOpt = launcher.DEFAULT_DIR,
         purge: Annotated[bool, typer.Option("--purge", help="Also remove the directory (data, logs, secrets).")]
         = False) -> None:
    """Stop every member (SIGTERM, SIGKILL after 15 s); the directory stays unless --purge."""
    try:
        results = launcher.down(dir, purge)
    except launcher.ClusterError as e:
        raise _fail(e) from None
    for name, result in results.items():
        console.print(f"{name}: {result}", highlight=False, soft_wrap=True)
