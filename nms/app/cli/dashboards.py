"""`nms dashboards`: the shipped Chronograf dashboards and the stored schema they read."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console
from nms.app.cli.tables import Col, ListTable, WideOpt
from nms.app.dashboards import catalog

dashboards_app = typer.Typer(help="Chronograf dashboards for the InfluxDB store, and the stored schema.",
                             no_args_is_help=True)


class SchemaFormat(str, Enum):
    markdown = "markdown"
    json = "json"


@dashboards_app.command("list")
def list_dashboards(wide: bool = WideOpt) -> None:
    """The shipped dashboards: name, title, what they show."""
    table = ListTable("name", Col("title", wrap=True), Col("cells", justify="right"), Col("about", wrap=True))
    for name in catalog.names():
        doc = catalog.load(name)
        table.add_row(name, doc["dashboard"]["name"], str(len(doc["dashboard"]["cells"])),
                      doc["meta"].get("nms", {}).get("description", ""))
    table.print(Console(soft_wrap=True), wide)


@dashboards_app.command("export")
def export(
    name: str | None = typer.Argument(None, help="one dashboard (default: all)"),
    directory: Path = typer.Option(Path("."), "--dir", help="where the JSON files go"),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help=("service config: database, retention policy and downsampling tiers from store.influxdb"),
    ),
    database: str | None = typer.Option(None, "--database", help="InfluxDB database (default: config, else nms)"),
    retention_policy: str | None = typer.Option(
        None, "--retention-policy", help=("raw data's retention policy (default: config, else autogen)")
    ),
    hosts: str | None = typer.Option(None, "--hosts", help="job view: comma-separated hosts of the job"),
    job: str | None = typer.Option(None, "--job", help="job view: a job id; its hosts come from the service"),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
) -> None:
    """Write importable Chronograf dashboard files (Chronograf: Dashboards > Import Dashboard)."""
    influx = None
    if config is not None:
        from nms.app.cli import _load
        influx = _load(config).store.influxdb
    tiers = [t.retention_policy for t in influx.downsampling.tiers] if influx and influx.downsampling.enabled else []
    job_hosts = [h for h in hosts.split(",") if h] if hosts else None
    if job and job_hosts is None:
        job_hosts = ApiClient(url, token).call("GET", f"/jobs/{job}")["hosts"]
    try:
        chosen = [catalog.load(name) and name] if name else catalog.names()
    except KeyError as e:
        err_console.print(f"[red]error:[/] {e.args[0]}")
        raise typer.Exit(1) from None
    directory.mkdir(parents=True, exist_ok=True)
    for item in chosen:
        doc = catalog.export(item, database=database or (influx.database if influx else "nms"),
                             raw_rp=retention_policy or (influx.retention_policy if influx else None) or "autogen",
                             tiers=tiers, job_hosts=job_hosts, job=job)
        path = directory / f"nms-{item}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(path)


@dashboards_app.command("schema")
def schema(fmt: SchemaFormat = typer.Option(SchemaFormat.markdown, "--format", help="markdown or json")) -> None:
    """Every stored measurement: tags, time attribute, fields and their types (docs/schema.md)."""
    from nms.app.dashboards import schema as stored

    print(stored.as_markdown() if fmt is SchemaFormat.markdown else stored.as_json(), end="")
