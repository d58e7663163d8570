"""`nms topology`, `nms devices` (from the service) and `nms collect <collector> --once` (local)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time

console = Console(soft_wrap=True)
collect_app = typer.Typer(help="Run a switch collector from this process (no service needed).",
                          no_args_is_help=True)
CHECK_STYLE = {"ok": "green", "discovered": "green", "missing": "red", "miscabled": "red", "unexpected": "yellow",
               "unverified": "dim"}
STATE_STYLE = {"up": "green", "down": "red", "degraded": "yellow", "unknown": "dim", "ok": "green", "error": "red",
               "backoff": "yellow", "pending": "dim"}


def _styled(value: str, styles: dict[str, str]) -> str:
    style = styles.get(value)
    return f"[{style}]{value}[/]" if style else value


def _bps(value: float | None) -> str:
    if value is None:
        return ""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}b/s"
    return f"{value:.0f} b/s"


def topology(as_json: bool = typer.Option(False, "--json"), problems: bool = typer.Option(
        False, "--problems", help="only missing, miscabled and unexpected cables"),
        url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
    """The fabric from LLDP, reconciled with the configured inventory."""
    topo = ApiClient(url, token).call("GET", "/topology")
    if as_json:
        print(json.dumps(topo, indent=2))
        return
    links = [link for link in topo["links"] if not problems or link["check"] in ("missing", "miscabled", "unexpected")]
    table = Table("a", "b", "check", "state", "rates at", "in", "out", "seen by", "note", title="cables",
                  title_justify="left")
    for link in links:
        table.add_row(link["a"], link["b"], _styled(link["check"], CHECK_STYLE), _styled(link["state"], STATE_STYLE),
                      link["rate_port"] or "", _bps(link["in_bps"]), _bps(link["out_bps"]), ",".join(link["seen_by"]),
                      link["expected"] or ("flapping" if link["flapping"] else ""))
    console.print(table)
    nodes = Table("node", "kind", "role", "configured", "reachable", title="nodes", title_justify="left")
    for n in topo["nodes"]:
        nodes.add_row(n["name"], n["kind"], n["role"] or "", "yes" if n["configured"] else "[yellow]no[/]",
                      "" if n["reachable"] is None else ("yes" if n["reachable"] else "[red]no[/]"))
    console.print(nodes)
    bad = [link for link in topo["links"] if link["check"] in ("missing", "miscabled", "unexpected")]
    console.print(f"{len(topo['links'])} cables, {len(bad)} with problems")


def devices(as_json: bool = typer.Option(False, "--json"), url: str = UrlOpt,
            token: Optional[str] = TokenOpt) -> None:
    """Collector status per device: last poll, duration, errors, backoff."""
    items = ApiClient(url, token).call("GET", "/devices")
    if as_json:
        print(json.dumps(items, indent=2))
        return
    table = Table("device", "collector", "address", "state", "last success", "took", "polls", "failures", "error")
    for d in items:
        table.add_row(d["device"], d["collector"], d["address"], _styled(d["state"], STATE_STYLE),
                      fmt_time(d["last_success_ns"]) if d["last_success_ns"] else "never",
                      f"{d['last_duration_s']:.2f} s" if d["last_duration_s"] is not None else "",
                      str(d["polls"]), str(d["failures"]),
                      f"{d['last_error_kind']}: {d['last_error']}" if d["state"] != "ok" and d["last_error"] else "")
    console.print(table)


@collect_app.command("snmp")
def collect_snmp(config: Path = typer.Option(..., "--config", "-c", help="YAML configuration file"),
                 once: bool = typer.Option(True, "--once", help="one poll cycle, then exit (the only mode)"),
                 device: list[str] = typer.Option([], "--device", "-d", help="only these switches (repeatable)"),
                 as_json: bool = typer.Option(False, "--json", help="print the records as JSON lines")) -> None:
    """Poll the configured switches once over SNMP and print what came back (nothing is stored)."""
    from nms.app.cli import _load
    from nms.app.polling import Poller, load_collectors

    cfg = _load(config)
    logging.getLogger("nms.app.polling").setLevel(logging.ERROR)  # failures are in the table below
    switches = [s for s in cfg.fabric.switches if s.collectors.snmp is not None and (not device or s.name in device)]
    if not switches:
        err_console.print("[red]error:[/] no switch with collectors.snmp settings"
                          + (f" among {', '.join(device)}" if device else ""))
        raise typer.Exit(2)
    cfg = cfg.model_copy(update={"fabric": cfg.fabric.model_copy(update={"switches": switches, "links": [],
                                                                           "hosts": []})})
    collectors = {k: v for k, v in load_collectors(cfg).items() if k == "snmp"}
    poller = Poller(cfg, _NullStore(), registry=None, collectors=collectors)

    async def run():
        try:
            return await poller.poll_all()
        finally:
            await poller.close()

    started = time.perf_counter()
    with console.status(f"polling {len(switches)} switch(es) over SNMP..."):
        statuses = asyncio.run(run())
    took = time.perf_counter() - started
    if as_json:
        for sample in poller.recent.samples.values():
            print(sample.model_dump_json())
        for items in poller.recent.neighbors.values():
            for n in items:
                print(n.model_dump_json())
    else:
        _print_cycle(poller, statuses)
    failed = [s for s in statuses if s.state != "ok"]
    err_console.print(f"{len(statuses) - len(failed)}/{len(statuses)} devices ok in {took:.2f} s")
    if failed:
        raise typer.Exit(1)


def _print_cycle(poller, statuses) -> None:
    table = Table("device", "port", "oper", "speed", "mtu", "in octets", "out octets", "in pkts", "out pkts",
                  "in err", "out err", "in disc", "out disc", title="interfaces", title_justify="left")
    for (dev, port), s in sorted(poller.recent.samples.items()):
        table.add_row(dev, port, _styled(s.oper_status or "", STATE_STYLE), _bps(s.speed_bps) if s.speed_bps else "",
                      str(s.mtu or ""), *(str(v) if v is not None else "" for v in (
                          s.in_octets, s.out_octets, s.in_pkts, s.out_pkts, s.in_errors, s.out_errors,
                          s.in_discards, s.out_discards)))
    console.print(table)
    lldp = Table("device", "port", "neighbor", "neighbor port", title="LLDP neighbours", title_justify="left")
    for dev, items in sorted(poller.recent.neighbors.items()):
        for n in items:
            lldp.add_row(dev, n.port, n.remote_name or "", n.remote_port or "")
    if lldp.rows:
        console.print(lldp)
    status = Table("device", "address", "state", "took", "objects", "error", title="devices", title_justify="left")
    for d in statuses:
        facts = poller.recent.facts.get(d.device)
        status.add_row(d.device, d.address, _styled(d.state, STATE_STYLE),
                       f"{d.last_duration_s:.2f} s" if d.last_duration_s is not None else "",
                       str(facts.interfaces) + " ifs" if facts and d.state == "ok" else "",
                       f"{d.last_error_kind}: {d.last_error}" if d.last_error and d.state != "ok" else "")
    console.print(status)


class _NullStore:
    """`collect --once` prints; it stores nothing."""

    def write(self, points):
        from nms.store import WriteResult

        return WriteResult(accepted=len(points))
