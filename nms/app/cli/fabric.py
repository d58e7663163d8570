"""`nms topology`, `nms devices` (from the service) and `nms collect <collector> --once` (local)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from nms.app.cli.client import ApiClient, TokenOpt, UrlOpt, err_console, fmt_time
from nms.app.cli.tables import Col, ListTable

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
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}b/s"
    return f"{value:.0f} b/s"


_SI = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def _bytes(value: int | None) -> str:
    """A byte counter in three digits: 14.3 GB (decimal units, like the rates)."""
    if value is None:
        return ""
    for unit, scale in _SI:
        if value >= scale:
            return f"{value / scale:.3g} {unit}B"
    return f"{value} B"


def _count(value: int | None) -> str:
    """A count, exact below 100,000, else in three digits (1.23M)."""
    if value is None:
        return ""
    if value < 100_000:
        return str(value)
    for unit, scale in _SI:
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return str(value)


def _total(*values: int | None) -> int | None:
    return None if all(v is None for v in values) else sum(v or 0 for v in values)


def _ago(ns: int | None, now_ns: int) -> str:
    if not ns:
        return "never"
    s = max(0.0, (now_ns - ns) / 1e9)
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= scale:
            return f"{s / scale:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def _table(*columns: str, title: str | None = None, fold: tuple[str, ...] = (), **kwargs) -> Table:
    """A rich table whose `fold` columns (names, errors) wrap when the terminal is narrow; the others
    (states, numbers, times) keep one line."""
    table = Table(title=title, title_justify="left", **kwargs)
    for name in columns:
        table.add_column(name, overflow="fold", no_wrap=name not in fold)
    return table


WIDE_WRAP = 60  # --wide: columns that may wrap (names, errors) wrap at this width, not the terminal's


def _print_table(table: Table, wide: bool) -> None:
    """Default tables are chosen to fit 80 columns. --wide ones are never squeezed into ellipses: as wide
    as their columns need, beyond the terminal if need be (pipe to `less -S`)."""
    if not wide:
        console.print(table)
        return
    from rich.measure import Measurement

    for column in table.columns:
        if not column.no_wrap and column.max_width is None:
            column.max_width = WIDE_WRAP
    needed = Measurement.get(console, console.options.update(max_width=1 << 16), table).maximum
    if needed <= console.width:
        console.print(table)
    else:
        Console(file=console.file, width=needed, soft_wrap=True, force_terminal=console.is_terminal,
                color_system=console.color_system).print(table)


def _error_notes(errors: list[tuple[str, str, str]]) -> None:
    """Under a default (80-column) table, whose error column holds only the kind: each failing
    device's whole message, wrapped at the terminal's width. (device, collector, message)"""
    import textwrap

    for device, collector, message in errors:
        message = message.removeprefix(f"{device}: ")  # the collectors name the device first
        console.print(textwrap.fill(f"{device} ({collector}): {message}", width=max(console.width, 40),
                                    initial_indent="  ", subsequent_indent="    "), markup=False, highlight=False)


WideOpt = typer.Option(False, "--wide", "-w", help="every column (the default shows those that fit 80 columns)")


def topology(as_json: bool = typer.Option(False, "--json"), problems: bool = typer.Option(
        False, "--problems", help="only missing, miscabled and unexpected cables"),
        wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """The fabric from LLDP, reconciled with the configured inventory (--wide: every column)."""

    topo = ApiClient(url, token).call("GET", "/topology")
    if as_json:
        print(json.dumps(topo, indent=2))
        return
    links = [link for link in topo["links"] if not problems or link["check"] in ("missing", "miscabled", "unexpected")]
    table = ListTable(
        "a",
        "b",
        "check",
        "state",
        Col("rates at", drop=2),
        Col("in", justify="right"),
        Col("out", justify="right"),
        Col("seen by", wrap=not wide, drop=3),
        Col("note", wrap=True, drop=1),
        title="cables",
        title_justify="left",
    )
    for link in links:
        table.add_row(link["a"], link["b"], _styled(link["check"], CHECK_STYLE), _styled(link["state"], STATE_STYLE),
                      link["rate_port"] or "", _bps(link["in_bps"]), _bps(link["out_bps"]),
                      ("," if wide else ", ").join(link["seen_by"]),
                      link["expected"] or ("flapping" if link["flapping"] else ""))
    table.print(console, wide, err_console)
    nodes = ListTable("node", "kind", "role", "configured", "reachable", title="nodes", title_justify="left")
    for n in topo["nodes"]:
        nodes.add_row(n["name"], n["kind"], n["role"] or "", "yes" if n["configured"] else "[yellow]no[/]",
                      "" if n["reachable"] is None else ("yes" if n["reachable"] else "[red]no[/]"))
    nodes.print(console, wide, err_console)
    bad = [link for link in topo["links"] if link["check"] in ("missing", "miscabled", "unexpected")]
    console.print(f"{len(topo['links'])} cables, {len(bad)} with problems")


def devices(as_json: bool = typer.Option(False, "--json", help="everything /devices returns, as JSON"),
            wide: bool = WideOpt, url: str = UrlOpt, token: str | None = TokenOpt) -> None:
    """Collector status per device: state, last success, failures, error, what the last poll left out
    (--wide: address, poll time, polls, exact times, every problem kept)."""
    items = ApiClient(url, token).call("GET", "/devices")
    if as_json:
        print(json.dumps(items, indent=2))
        return
    now = time.time_ns()
    if wide:
        table = _table("device", "collector", "address", "state", "last success", "took", "polls", "failures",
                       "left out", "error", fold=("error",))
    else:  # the error's kind here, its message under the table
        # "via": the collector (its name is short; the header is what 80 columns cannot spare)
        table = _table("device", "via", "state", "last ok", "failures", "left out", "error")
    errors, left_out = [], []
    for d in items:
        count, total = d.get("last_problem_count", 0), d.get("problems", 0)  # an older server has neither
        if count:
            left_out.append(d)
        failing = d["state"] != "ok" and d["last_error"]
        state = _styled(d["state"], STATE_STYLE)
        if wide:
            table.add_row(d["device"], d["collector"], d["address"], state,
                          fmt_time(d["last_success_ns"]) if d["last_success_ns"] else "never",
                          f"{d['last_duration_s']:.2f} s" if d["last_duration_s"] is not None else "",
                          str(d["polls"]), str(d["failures"]), f"{count} ({total} in all)" if total else "",
                          f"{d['last_error_kind']}: {d['last_error']}" if failing else "")
        else:
            table.add_row(d["device"], d["collector"], state, _ago(d["last_success_ns"], now),
                          f"{d['failures']}/{d['polls']}", str(count) if count else "",
                          (d["last_error_kind"] or "") if failing else "")
            if failing:
                errors.append((d["device"], d["collector"], d["last_error"]))
    _print_table(table, wide)
    _error_notes(errors)
    _problem_notes(left_out, shown=None if wide else 3)


def _problem_notes(statuses: list[dict], shown: int | None) -> None:
    """What each device's last poll left out (`shown` of them per device; None: all the status kept)."""
    import textwrap

    if not statuses:
        return
    console.print("left out of the last poll (the rest was kept):")
    for d in statuses:
        problems = d.get("last_problems", [])
        for p in problems[:shown]:
            console.print(textwrap.fill(f"{d['device']} ({d['collector']}): {p['what']}: {p['reason']}",
                                        width=max(console.width, 40), initial_indent="  ", subsequent_indent="    "),
                          markup=False, highlight=False)
        if (more := d.get("last_problem_count", len(problems)) - len(problems[:shown])) > 0:
            console.print(f"    and {more} more (nms devices --json)", markup=False, highlight=False)


JsonOpt = typer.Option(False, "--json", help=(
    "everything as one JSON object: devices (status), facts, interfaces (every counter), lldp, addresses"))
ConfigOpt = typer.Option(..., "--config", "-c", help="YAML configuration file")
OnceOpt = typer.Option(True, "--once", help="one poll cycle, then exit (the only mode)")
DeviceOpt = typer.Option([], "--device", "-d", help="only these devices (repeatable)")


@collect_app.command("snmp")
def collect_snmp(config: Path = ConfigOpt, once: bool = OnceOpt, device: list[str] = DeviceOpt,
                 wide: bool = WideOpt, as_json: bool = JsonOpt) -> None:
    """Poll the configured switches once over SNMP and print what came back (nothing is stored).

    The default tables fit an 80-column terminal: per port the oper status, speed, bytes in/out and
    errors/discards (in + out); --wide adds MTU, packets and each direction's raw counters."""
    _collect_once("snmp", "over SNMP", config, device, wide, as_json)


@collect_app.command("ufm")
def collect_ufm(config: Path = ConfigOpt, once: bool = OnceOpt, device: list[str] = DeviceOpt,
                wide: bool = WideOpt, as_json: bool = JsonOpt) -> None:
    """Poll the configured UFM servers once and print the switches, ports and links they report
    (nothing is stored). Same tables as `collect snmp`; what each poll left out follows."""
    _collect_once("ufm", "from UFM", config, device, wide, as_json)


@collect_app.command("gnmi")
def collect_gnmi(config: Path = ConfigOpt, once: bool = OnceOpt, device: list[str] = DeviceOpt,
                 wide: bool = WideOpt, as_json: bool = JsonOpt) -> None:
    """Read the configured gNMI targets once (Subscribe ONCE) and print what came back (nothing is
    stored). The service streams instead (docs/gnmi.md)."""
    _collect_once("gnmi", "over gNMI", config, device, wide, as_json)


@collect_app.command("cli")
def collect_cli(config: Path = ConfigOpt, once: bool = OnceOpt, device: list[str] = DeviceOpt,
                wide: bool = WideOpt, as_json: bool = JsonOpt) -> None:
    """Log in to the configured switches over SSH once and print what their command line showed
    (nothing is stored; the configuration is read but not shown). What a poll left out follows."""
    _collect_once("cli", "over SSH", config, device, wide, as_json)


def _collect_once(name: str, how: str, config: Path, device: list[str], wide: bool, as_json: bool) -> None:
    from nms.app.cli import _load
    from nms.app.polling import Poller, load_collectors

    cfg = _load(config)
    logging.getLogger("nms.app.polling").setLevel(logging.ERROR)  # failures are in the table below
    logging.getLogger(f"collectors.{name}").setLevel(logging.ERROR)  # so are a poll's problems
    switches = [s for s in cfg.fabric.switches
                if name in s.collectors and (not device or s.name in device)]
    if not switches:
        err_console.print(f"[red]error:[/] no device with collectors.{name} settings"
                          + (f" among {', '.join(device)}" if device else ""))
        raise typer.Exit(2)
    cfg = cfg.model_copy(update={"fabric": cfg.fabric.model_copy(update={"switches": switches, "links": [],
                                                                           "hosts": []})})
    collectors = {k: v for k, v in load_collectors(cfg).items() if k == name}
    poller = Poller(cfg, _NullStore(), registry=None, collectors=collectors)

    async def run():
        try:
            return await poller.poll_all()
        finally:
            await poller.close()

    started = time.perf_counter()
    with console.status(f"polling {len(switches)} device(s) {how}..."):
        statuses = asyncio.run(run())
    took = time.perf_counter() - started
    if as_json:  # each device's problems are in its status (last_problems)
        print(json.dumps(_cycle_json(poller, statuses), indent=2))
    else:
        _print_cycle(poller, statuses, wide)
        _problem_notes([d.model_dump(mode="json") for d in statuses if d.last_problem_count], shown=None)
    failed = [s for s in statuses if s.state != "ok"]
    err_console.print(f"{len(statuses) - len(failed)}/{len(statuses)} devices ok in {took:.2f} s")
    if failed:
        raise typer.Exit(1)


def _cycle_json(poller, statuses) -> dict:
    """One poll cycle, every field of every record (`collect ... --once --json`)."""
    recent = poller.recent
    dump = lambda r: r.model_dump(mode="json")  # noqa: E731
    return {
        "devices": [dump(d) for d in statuses],
        "facts": [dump(f) for _, f in sorted(recent.facts.items())],
        "interfaces": [dump(s) for _, s in sorted(recent.samples.items())],
        "lldp": [dump(n) for _, items in sorted(recent.neighbors.items()) for n in items],
        "addresses": [dump(a) for _, items in sorted(recent.addresses.items()) for a in items],
    }


def _print_cycle(poller, statuses, wide: bool = False) -> None:
    """The tables of one poll cycle (any collector's): interfaces, LLDP neighbours, devices."""
    samples = sorted(poller.recent.samples.items())
    if wide:
        table = _table("device", "port", "oper", "speed", "mtu", "in octets", "out octets", "in pkts", "out pkts",
                       "in err", "out err", "in disc", "out disc", title="interfaces")
        for (dev, port), s in samples:
            table.add_row(dev, port, _styled(s.oper_status or "", STATE_STYLE), _bps(s.speed_bps or None),
                          str(s.mtu or ""), *(str(v) if v is not None else "" for v in (
                              s.in_octets, s.out_octets, s.in_pkts, s.out_pkts, s.in_errors, s.out_errors,
                              s.in_discards, s.out_discards)))
    else:
        # what a person reads first, in 80 columns: is it up, how fast, is traffic flowing, is anything lost
        table = _table("device", "port", "oper", "speed", "in", "out", "errors", "discards",
                       title="interfaces (counters: bytes; errors and discards in + out)",
                       fold=("device", "port"))
        for (dev, port), s in samples:
            table.add_row(dev, port, _styled(s.oper_status or "", STATE_STYLE), _bps(s.speed_bps or None),
                          _bytes(s.in_octets), _bytes(s.out_octets), _count(_total(s.in_errors, s.out_errors)),
                          _count(_total(s.in_discards, s.out_discards)))
    for column in table.columns[3:]:
        column.justify = "right"
    _print_table(table, wide)
    lldp = _table("device", "port", "neighbor", "neighbor port", title="LLDP neighbours",
                  fold=("device", "port", "neighbor", "neighbor port"))
    for dev, items in sorted(poller.recent.neighbors.items()):
        for n in items:
            lldp.add_row(dev, n.port, n.remote_name or "", n.remote_port or "")
    if lldp.rows:
        _print_table(lldp, wide)
    if wide:
        status = _table("device", "address", "state", "took", "objects", "left out", "error", title="devices",
                        fold=("error",))
    else:  # the error's kind here, its message under the table
        status = _table("device", "state", "took", "objects", "left out", "error", title="devices")
    errors = []
    for d in statuses:
        facts = poller.recent.facts.get(d.device)
        failing = d.last_error and d.state != "ok"
        row = [d.device, d.address, _styled(d.state, STATE_STYLE),
               f"{d.last_duration_s:.2f} s" if d.last_duration_s is not None else "",
               str(facts.interfaces) + " ifs" if facts and d.state == "ok" else "",
               str(d.last_problem_count) if d.last_problem_count else "",
               f"{d.last_error_kind}: {d.last_error}" if failing else ""]
        if not wide:
            del row[1]
            row[-1] = (d.last_error_kind or "") if failing else ""
            if failing:
                errors.append((d.device, d.collector, d.last_error))
        status.add_row(*row)
    _print_table(status, wide)
    _error_notes(errors)


class _NullStore:
    """`collect --once` prints; it stores nothing."""

    def write(self, points):
        from nms.store import WriteResult

        return WriteResult(accepted=len(points))
