"""`nms`: the service and its command-line client."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from lab.cli import app as lab_app
from nms import __version__
from nms.app.cli.actions import actions_app
from nms.app.cli.agents import agents_app
from nms.app.cli.audits import audit_app
from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.clock import clock as clock_cmd
from nms.app.cli.cluster import app as cluster_app
from nms.app.cli.dashboards import dashboards_app
from nms.app.cli.fabric import collect_app
from nms.app.cli.fabric import devices as devices_cmd
from nms.app.cli.fabric import topology as topology_cmd
from nms.app.cli.incidents import incidents_app
from nms.app.cli.jobs import jobs_app
from nms.app.cli.store import store_app
from nms.config import ConfigError, NmsConfig, detect_model, load_config
from nms.config.models import parse_duration
from nms.store import parse_tag_filters

app = typer.Typer(help="Open network management for AI GPU fabrics.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(token_app, name="token")
app.add_typer(jobs_app, name="jobs")
app.add_typer(agents_app, name="agents")
app.add_typer(incidents_app, name="incidents")
app.add_typer(actions_app, name="actions")
app.add_typer(audit_app, name="audit")
app.add_typer(collect_app, name="collect")
app.add_typer(store_app, name="store")
app.add_typer(dashboards_app, name="dashboards")
app.command("topology")(topology_cmd)
app.command("devices")(devices_cmd)
app.command("clock")(clock_cmd)
console = Console(soft_wrap=True)



def _load(path: Path, model: type = NmsConfig, note: str = ""):
    try:
        return load_config(path, model=model)
    except ConfigError as e:
        err_console.print(f"[red]{e.source}: {len(e.issues)} configuration error(s)[/]{note}")
        for issue in e.issues:
            err_console.print(f"  {issue}", markup=False)
        raise typer.Exit(1) from None


class ConfigKind(str, Enum):
    auto = "auto"
    service = "service"
    agent = "agent"


@config_app.command("check")
def config_check(file: Path = typer.Argument(..., help="YAML configuration file"),
                 kind: ConfigKind = typer.Option(ConfigKind.auto, "--kind", help=(
                     "service (`nms serve`) or agent (`nms-agent`); auto: by the file's top-level keys"))) -> None:
    """Validate a service or host agent configuration file; print every error with its field path and line."""
    from hostprobe.config import AgentConfig, summary

    models = {ConfigKind.service: NmsConfig, ConfigKind.agent: AgentConfig}
    note = ""
    if kind is ConfigKind.auto:
        try:
            text = file.read_text()
        except OSError:
            text = ""  # load_config reports it
        model = detect_model(text, [NmsConfig, AgentConfig])
        if model is AgentConfig:
            note = " (checked as an nms-agent configuration by its top-level keys; --kind service to override)"
    else:
        model = models[kind]
    cfg = _load(file, model, note)
    if isinstance(cfg, AgentConfig):
        console.print(f"[green]ok[/] {file} (nms-agent): {summary(cfg)}", highlight=False)
        return
    fabric = cfg.fabric
    console.print(f"[green]ok[/] {file}: site {cfg.site!r}, store {cfg.store.backend}, "
                  f"{len(fabric.switches)} switches, {len(fabric.hosts)} hosts, {len(fabric.links)} links, "
                  f"{len(cfg.api.tokens)} API tokens"
                  + (f", cluster bus {cfg.cluster.bus.backend} ({len(cfg.cluster.bus.servers)} servers)"
                     if cfg.cluster.bus is not None else ""))


QUIET_LOGGERS = ("apscheduler",)  # two INFO lines per job run (every 2 s): only at log_level debug


def configure_logging(level: str) -> None:
    """`nms serve`'s log: `level` (config log_level) for everything but the scheduler's per-run chatter,
    which shows its warnings and errors (a missed or failed job) unless level is debug."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level.lower() == "debug" else logging.WARNING)


@app.command()
def serve(config: Path = typer.Option(..., "--config", "-c", help="YAML configuration file"),
          role: str = typer.Option("all", "--role", help=(
              "what this process runs, comma-combinable: api, poll, correlate, write (needs cluster.bus), "
              "or all (with no bus configured: the single process). See docs/cluster.md"))) -> None:
    """Run the service: REST API and scheduler in one process (Ctrl-C stops it cleanly), or some of its
    roles as a member of a cluster."""
    import uvicorn

    from nms.app.api import create_app
    from nms.app.roles import parse_roles

    cfg = _load(config)
    try:
        roles = parse_roles(role, cfg.cluster.bus is not None)
    except ValueError as e:
        err_console.print(f"[red]error:[/] {e}", markup=True, highlight=False)
        raise typer.Exit(2) from None
    configure_logging(cfg.log_level)
    service = _service(cfg, roles)
    if "api" not in roles:
        _serve_headless(service)
        return
    if not cfg.api.tokens:
        err_console.print("[yellow]warning:[/] no API tokens configured: every authenticated endpoint "
                          "will answer 401 (see `nms token create`)")
    tls = cfg.api.tls
    app = create_app(service)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.api.host, port=cfg.api.port, log_level=cfg.log_level,
                                           ssl_certfile=str(tls.cert) if tls else None,
                                           ssl_keyfile=str(tls.key) if tls else None, server_header=False))
    app.state.server = server  # long-polls (GET /agents/{host}/commands) end when it is stopping
    if not cfg.api.listen:
        server.run()
        return
    # api.listen: the same server on more addresses (uvicorn binds one host itself)
    server.run(sockets=[_listen_socket(host, cfg.api.port) for host in dict.fromkeys([cfg.api.host, *cfg.api.listen])])


def _service(cfg, roles):
    """The Service, or exit 1 with a clear line when its state store cannot be opened (PostgreSQL
    unreachable: the error names the DSN's host, never its password; a schema newer than this nms)."""
    from nms.app.service import Service
    from nms.state import SchemaError, StateUnavailable

    try:
        return Service(cfg, roles=roles)
    except (StateUnavailable, SchemaError) as e:
        err_console.print(f"[red]error:[/] state.{cfg.state.backend}: {e}", highlight=False)
        raise typer.Exit(1) from None


def _serve_headless(service) -> None:
    """A member without the API (poll, correlate, write): start, run until SIGTERM or Ctrl-C, stop cleanly."""
    import asyncio
    import signal

    from nms.bus import BusError

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await service.start()
            await stop.wait()
        finally:
            await service.stop()

    try:
        asyncio.run(run())
    except BusError as e:
        err_console.print(f"[red]error:[/] telemetry bus: {e}", highlight=False)
        raise typer.Exit(1) from None


def _listen_socket(host: str, port: int):
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        err_console.print(f"[red]error:[/] cannot listen on {host}:{port}: {e.strerror}")
        raise typer.Exit(1) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@app.command()
def version(url: str | None = typer.Option(None, "--url", envvar="NMS_URL",
                                              help="also ask this service for its version"),
            token: str | None = TokenOpt) -> None:
    """Print the version (and the service's, with --url)."""
    console.print(f"nms {__version__}")
    if url:
        info = ApiClient(url, token).call("GET", "/version")
        console.print(f"service {info['version']} at {url} (store {info['store_backend']}, "
                      f"up {info['uptime_s']:.0f} s)")


@token_app.command("create")
def token_create(name: str = typer.Option(..., help="token name (shown in logs and errors)"),
                 scopes: str | None = typer.Option(
                     None, help="comma-separated: read,ingest,act,admin (default: read; ingest with --host)"),
                 host: str | None = typer.Option(
                     None, help="bind the token to this host of fabric.hosts (an agent's token): it may use only "
                                "/agents/HOST/... and ingest only HOST's records")) -> None:
    """Make a new random token; print it once, and the config entry that stores only its hash."""
    from pydantic import ValidationError

    from nms.app.auth import SCOPES, hash_token, new_token
    from nms.config.models import TokenConfig

    if scopes is None:
        scopes = "ingest" if host else "read"
    wanted = [s.strip() for s in scopes.split(",") if s.strip()]
    bad = [s for s in wanted if s not in SCOPES]
    if bad or not wanted:
        err_console.print(f"[red]error:[/] unknown scopes {bad}; choose from {', '.join(SCOPES)}")
        raise typer.Exit(2)
    token = new_token()
    try:
        TokenConfig(name=name, scopes=wanted, host=host, hash=hash_token(token))
    except ValidationError as e:
        err_console.print("[red]error:[/] " + "; ".join(f"{'.'.join(map(str, err['loc'])) or 'token'}: {err['msg']}"
                                                       for err in e.errors(include_input=False)), highlight=False)
        raise typer.Exit(2) from None
    console.print(f"token (shown once, keep it secret): {token}")
    console.print("config entry (api.tokens):")
    console.print(f"  - name: {name}\n    scopes: [{', '.join(wanted)}]" + (f"\n    host: {host}" if host else "")
                  + f"\n    hash: {hash_token(token)}", highlight=False, markup=False)


def _parse_time(value: str, now_ns: int) -> int:
    """'now', a duration ago ('15m'), ns since the epoch, or RFC 3339."""
    if value == "now":
        return now_ns
    if value.isdigit():
        return int(value)
    try:
        return now_ns - int(parse_duration(value) * 1e9)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: use now, a duration like 15m, ns, or RFC 3339") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * 10**9 + dt.microsecond * 1000


def _tag_filters(tags: list[str]) -> dict[str, list[str]]:
    try:
        return parse_tag_filters(tags)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


@app.command()
def query(measurement: str = typer.Argument(..., help="e.g. port_rates, probe_window"),
          start: str = typer.Option("15m", help="start: duration ago (15m), ns, or RFC 3339"),
          end: str = typer.Option("now", help="end (exclusive)"),
          tag: list[str] = typer.Option([], "--tag", "-t", help="key=value filter (repeatable)"),
          field: list[str] = typer.Option([], "--field", "-f", help="field to show (repeatable)"),
          window: str | None = typer.Option(None, help="aggregation window, e.g. 10s (needs --agg, --field)"),
          agg: str | None = typer.Option(None, help="mean, min, max, sum, count, first, last"),
          latest: bool = typer.Option(False, "--latest", help="only the newest row of each series"),
          limit: int = typer.Option(10_000, help="rows per series"),
          as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
          url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Read telemetry from the service (works the same on either store backend)."""
    client = ApiClient(url, token)
    with console.status(f"querying {measurement}..."):
        if latest:
            params = {"measurement": measurement, "tag": [f"{k}={v}" for k, vs in _tag_filters(tag).items()
                                                          for v in vs], "field": field}
            result = client.call("GET", "/telemetry/latest", params=params)
        else:
            now = time.time_ns()
            body = {"measurement": measurement, "start": _parse_time(start, now), "end": _parse_time(end, now),
                    "tags": _tag_filters(tag), "fields": field or None, "limit": limit}
            if window or agg:
                body.update(window_ns=int(parse_duration(window or "0") * 1e9) or None, agg=agg)
            result = client.call("POST", "/telemetry/query", json=body)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    if not result["series"]:
        err_console.print("no data")
        raise typer.Exit(0)
    for series in result["series"]:
        tags = ", ".join(f"{k}={v}" for k, v in series["tags"].items()) or "(no tags)"
        table = Table(title=f"{series['measurement']} {tags}", title_justify="left")
        for col in series["columns"]:
            table.add_column(col, justify="left" if col == "time" else "right")
        for row in series["values"]:
            table.add_row(fmt_time(row[0]), *("" if v is None else str(v) for v in row[1:]))
        console.print(table)


@app.command()
def demo(api_only: bool = typer.Option(False, "--api-only", help="the API walk-through on synthetic telemetry, "
                                                                  "no lab (needs no root)"),
         minutes: int = typer.Option(5, min=1, max=60, help="--api-only: minutes of synthetic telemetry"),
         keep_running: bool = typer.Option(False, "--keep-running", help="leave the service (and lab) up afterwards")
         ) -> None:
    """The README's main job: the fabric lab with agents, SNMP and the correlator, a real link failure and
    its incident (needs root); --api-only, or without root, the service's API on synthetic telemetry."""
    if not api_only and os.geteuid() != 0:
        err_console.print("[yellow]the lab demo needs root (network namespaces): running the API-only demo; "
                          "`sudo nms demo` runs the full one[/]")
        api_only = True
    if api_only:
        from nms.app.cli.demo import run_demo

        run_demo(minutes, keep_running)
    else:
        from nms.app.cli.demo_lab import run_lab_demo

        run_lab_demo(keep_running)


app.add_typer(lab_app, name="lab")
app.add_typer(cluster_app, name="cluster")


def main() -> None:
    app()

