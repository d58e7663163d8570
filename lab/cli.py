"""`nms lab ...`: build, inspect, break and load the fabric lab (see docs/lab.md)."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lab import agent_procs as agents_mod
from lab import faults as faults_mod
from lab import lab as lab_mod
from lab import paths, sh
from lab import traffic as traffic_mod
from lab.state import DEFAULT_LAB_DIR, LabDir, topology_of
from lab.topology import DEFAULT_MGMT, DEFAULT_PREFIX, DEFAULT_SOUTHBOUND, Spec, format_rate, parse_rate
from nms.config import ConfigError

app = typer.Typer(help="A leaf-spine AI fabric on this machine: namespaces as switches and hosts, "
                       "real snmpd/lldpd, real faults, iperf3 load. Needs root.", no_args_is_help=True)
app.add_typer(agents_mod.cli_app, name="agents")
console = Console()
err = Console(stderr=True)

LabDirOpt = Annotated[str, typer.Option("--lab-dir", envvar="NMS_LAB_DIR",
                                        help="Lab directory (state, config, logs).")]


def handled(fn):
    """Turn lab errors into one red line and exit status 1 instead of a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (sh.LabError, ConfigError, ValueError) as e:
            err.print(f"[red]error:[/red] {e}", highlight=False)
            raise typer.Exit(1) from None
    return wrapper


def _dump(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


@app.command()
@handled
def up(
    spines: Annotated[int, typer.Option(help="Number of spine switches.")] = 2,
    leaves: Annotated[int, typer.Option(help="Number of leaf switches.")] = 2,
    hosts_per_leaf: Annotated[int, typer.Option(help="Hosts under each leaf.")] = 2,
    link_rate: Annotated[str, typer.Option(help="Shaped rate of every link, e.g. 100M, 1G.")] = "100M",
    mtu: Annotated[int, typer.Option(help="MTU of fabric links.")] = 9000,
    mgmt_subnet: Annotated[str, typer.Option(help="Management network (inside 198.18.0.0/16).")] = DEFAULT_MGMT,
    prefix: Annotated[str, typer.Option(help="Name prefix of namespaces and root interfaces.")] = DEFAULT_PREFIX,
    southbound: Annotated[str, typer.Option(help="What the switches serve the NMS, comma-separated: snmp "
                                                 "(snmpd), gnmi (gNMI target, TLS, port 9339), cli (sshd, port 22).")]
    = ",".join(DEFAULT_SOUTHBOUND),
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Build the lab (idempotent: an identical running lab is only checked)."""
    spec = Spec(spines, leaves, hosts_per_leaf, parse_rate(link_rate), mtu, mgmt_subnet, prefix, southbound)
    lab = LabDir(lab_dir)
    with console.status("building the lab") as status:
        state, built = lab_mod.up(lab, spec, step=lambda msg: status.update(msg))
    info = state["lab"]
    verb = f"built in {info.get('build_seconds', 0):.1f}s" if built else "already up"
    console.print(f"[green]lab {verb}[/green]: {lab_mod.describe(spec)}")
    console.print(f"  config:  {info['config']}   (nms serve --config {info['config']})")
    console.print(f"  state:   {info['state']}   (nms lab status --json)")
    agents = {"snmp": "SNMP v2c/v3", "gnmi": "gNMI (TLS, port 9339)", "cli": "SSH (key, port 22)"}
    console.print(f"  mgmt:    {info['mgmt']['subnet']} on {info['mgmt']['bridge']}, switches answer "
                  f"{' and '.join(agents[s] for s in spec.southbound)} on their mgmt address")


@app.command()
@handled
def down(
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
    prefix: Annotated[str, typer.Option(help="Prefix to clean up when the state file is gone.")] = DEFAULT_PREFIX,
    keep_dir: Annotated[bool, typer.Option(help="Keep the lab directory (logs, state) for a post-mortem.")] = False,
) -> None:
    """Remove every namespace, link, process and file of the lab (also after a crash)."""
    found = lab_mod.down(LabDir(lab_dir), prefix, keep_dir)
    if not found:
        console.print("nothing to remove")
        return
    console.print(f"[green]removed[/green] {len(found.namespaces)} namespaces, {len(found.root_links)} root "
                  f"interfaces, {len(found.pids) + len(found.helper_pids)} processes")


@app.command()
@handled
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the ground truth as JSON.")] = False,
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Nodes, links and faults (with start/end times): the ground truth for scoring detection."""
    state = lab_mod.status(LabDir(lab_dir), live=os.geteuid() == 0)
    if as_json:
        _dump(state)
        return
    info = state["lab"]
    spec = Spec(**info["spec"])
    console.print(f"[bold]{lab_mod.describe(spec)}[/bold] since {info['created_iso']}\n"
                  f"  dir {info['lab_dir']}  config {info['config']}  mgmt {info['mgmt']['subnet']}")
    nodes = Table("node", "role", "mgmt", "services", title="nodes")
    for name, n in state["nodes"].items():
        svc = n.get("services", {k: None for k in n["pids"]})
        nodes.add_row(name, n["role"], n["mgmt_address"],
                      " ".join(f"{k}:{'[green]up[/green]' if v else '[red]down[/red]' if v is False else '?'}"
                               for k, v in svc.items()))
    console.print(nodes)
    active = {}
    for f in (f for f in state["faults"] if f["active"]):
        p = f["params"]  # a switch-down fault holds every link of its switch
        for name in p.get("links", [p["link"]] if "link" in p else []):
            active.setdefault(name, []).append(f"{f['id']}:{f['kind']}")
    links = Table("link", "a", "b", "oper a/b", "faults", title="links")
    for ln in state["links"]:
        oper = ln.get("oper", {})
        links.add_row(ln["name"], f"{ln['a']} {ln['a_address']}", f"{ln['b']} {ln['b_address']}",
                      f"{oper.get('a', '?')}/{oper.get('b', '?')}", " ".join(active.get(ln["name"], [])))
    console.print(links)
    if state["faults"]:
        ft = Table("id", "kind", "target", "parameters", "start", "end", title="faults")
        for f in state["faults"]:
            params = " ".join(f"{k}={v}" for k, v in f["params"].items()
                              if k not in ("link", "links", "a", "b", "host", "pid"))
            ft.add_row(f["id"], f["kind"], f["target"], params, f["start_iso"][11:23],
                       "[yellow]active[/yellow]" if f["active"] else f["end_iso"][11:23])
        console.print(ft)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handled
def exec_(
    node: Annotated[str, typer.Argument(help="Node name, e.g. leaf1 or host3.")],
    cmd: Annotated[list[str], typer.Argument(help="Command to run in the node's namespace (after --).")],
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Run a command inside a node: `nms lab exec leaf1 -- ip route`."""
    sh.require_root()
    state = LabDir(lab_dir).load()
    if node not in state["nodes"]:
        raise sh.LabError(f"no node {node!r}; nodes: {', '.join(state['nodes'])}")
    os.execvp("ip", ["ip", "netns", "exec", state["nodes"][node]["netns"], *cmd])


@app.command()
@handled
def fault(
    kind: Annotated[str, typer.Argument(help=f"One of: {', '.join(faults_mod.KINDS)}.")],
    target: Annotated[str, typer.Argument(help="A link (leaf1-spine2 or leaf1:swp3), a host (host1) or, for "
                                                "switch-down, a switch (spine1).")],
    mode: Annotated[str | None, typer.Option(help="link-down/flap: blackhole (default) or failover.")] = None,
    period: Annotated[float | None, typer.Option(help="flap: seconds per down+up cycle (4).")] = None,
    down_for: Annotated[float | None, typer.Option(help="flap: seconds down per cycle (period/2).")] = None,
    count: Annotated[int | None, typer.Option(help="flap: cycles, 0 = until healed (5).")] = None,
    rate: Annotated[str | None, typer.Option(help="congestion: new rate, e.g. 10M (link rate / 10).")] = None,
    percent: Annotated[float | None, typer.Option(help="loss: percent of frames dropped (5).")] = None,
    from_node: Annotated[str | None, typer.Option("--from", help="loss/congestion/blackhole: sending end.")] = None,
    fraction: Annotated[float | None, typer.Option(help="blackhole: share of flows dropped entirely (0.5).")] = None,
    by: Annotated[str | None, typer.Option(help="blackhole: hash of 'flow' (source address and port, "
                                                "UDP; default) or 'dst' (destination address).")] = None,
    seed: Annotated[int | None, typer.Option(help="blackhole: hash seed (random; recorded).")] = None,
    mtu: Annotated[int | None, typer.Option(help="mtu: the new MTU of one end (1500).")] = None,
    end: Annotated[str | None, typer.Option(help="mtu: which node's end changes.")] = None,
    offset_us: Annotated[float | None, typer.Option(help="clock: offset in microseconds.")] = None,
    drift_ppm: Annotated[float | None, typer.Option(help="clock: drift in ppm (us per s).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fault record as JSON.")] = False,
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Inject a real fault; prints its id for `nms lab heal`."""
    sh.require_root()
    f = faults_mod.inject(LabDir(lab_dir), kind, target, mode=mode, period=period, down_for=down_for,
                          count=count, rate=rate, percent=percent, from_node=from_node, fraction=fraction, by=by,
                          seed=seed, mtu=mtu, end=end,
                          offset_us=offset_us, drift_ppm=drift_ppm)
    if as_json:
        _dump(f)
        return
    params = {k: v for k, v in f["params"].items() if k not in ("a", "b")}
    console.print(f"[yellow]{f['id']}[/yellow] {f['kind']} {f['target']} {json.dumps(params)} since {f['start_iso']}")


@app.command()
@handled
def heal(
    fault_id: Annotated[str | None, typer.Argument(metavar="FAULT", help="Fault id, e.g. f3.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Heal every active fault.")] = False,
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """End a fault (or all) and restore the baseline."""
    sh.require_root()
    if (fault_id is None) == (not all_):
        raise sh.LabError("name one fault id, or pass --all")
    healed = faults_mod.heal(LabDir(lab_dir), fault_id)
    for f in healed:
        console.print(f"[green]healed[/green] {f['id']} {f['kind']} {f['target']} at {f['end_iso']}")
    if not healed:
        console.print("no active faults")


@app.command()
@handled
def traffic(
    pattern: Annotated[str, typer.Argument(help="pairs, all-to-all or incast.")],
    pair: Annotated[list[str] | None, typer.Option(help="pairs: SRC:DST (repeat).")] = None,
    hosts: Annotated[str | None, typer.Option(help="Comma-separated hosts taking part (all).")] = None,
    dst: Annotated[str | None, typer.Option(help="incast: the receiving host (first host).")] = None,
    proto: Annotated[str, typer.Option(help="tcp or udp.")] = "tcp",
    rate: Annotated[str | None, typer.Option(help="Per-flow rate, e.g. 20M (udp: link rate; tcp: unlimited).")] = None,
    duration: Annotated[float, typer.Option(help="Seconds.")] = 5.0,
    sport: Annotated[int, typer.Option(help="First source port; flow i uses sport+i.")] = 40000,
    dport: Annotated[int, typer.Option(help="First destination port; flow i uses dport+i.")] = 5201,
    via: Annotated[str | None, typer.Option(help="Pick source ports that hash every flow onto this spine.")] = None,
    length: Annotated[int | None, typer.Option(help="iperf3 -l (UDP datagram / TCP write size).")] = None,
    burst: Annotated[int | None, typer.Option(help="Send in bursts of this many packets at --rate on "
                                                   "average (iperf3 -b RATE/BURST): queues build.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print per-flow results as JSON.")] = False,
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Run iperf3 flows and report achieved throughput per flow."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task(f"{pattern} {proto}", total=1.0)
        record = traffic_mod.run(
            LabDir(lab_dir), pattern, pairs=pair or [], hosts=hosts.split(",") if hosts else [], dst=dst,
            proto=proto, rate=rate, duration=duration, sport=sport, dport=dport, via=via, length=length, burst=burst,
            tick=lambda x: progress.update(task, completed=x))
    if as_json:
        _dump(record)
        return
    errors = any(r["error"] for r in record["flows"])
    table = Table(title=f"{pattern} {proto} {duration:g}s")
    for col in ["flow", "ports", "spine", "target", "received", "loss%", "retr"] + (["error"] if errors else []):
        table.add_column(col, no_wrap=col != "error")
    fmt = lambda v: f"{format_rate(v)}b/s" if v else "-"  # noqa: E731
    for r in record["flows"]:
        table.add_row(f"{r['src']}>{r['dst']}", f"{r['sport']}>{r['dport']}", r["spine"] or "-",
                      fmt(r["rate_bps"]) if r["rate_bps"] else "max", fmt(r["received_bps"]),
                      f"{r['lost_percent']:.2f}" if r["lost_percent"] is not None else "-",
                      str(r["retransmits"]) if r["retransmits"] is not None else "-",
                      *([r["error"] or ""] if errors else []))
    console.print(table)
    if errors:
        raise typer.Exit(2)


@app.command()
@handled
def path(
    src: Annotated[str, typer.Argument(help="Source host.")],
    dst: Annotated[str, typer.Argument(help="Destination host.")],
    proto: Annotated[str, typer.Option(help="udp or tcp.")] = "udp",
    sport: Annotated[int, typer.Option(help="Source port.")] = 40000,
    dport: Annotated[int, typer.Option(help="Destination port.")] = 33434,
    probe: Annotated[bool, typer.Option(help="Also send 100 UDP datagrams on that path and count arrivals.")] = False,
    lab_dir: LabDirOpt = DEFAULT_LAB_DIR,
) -> None:
    """Show the path the kernel picks for one 5-tuple (and optionally test it)."""
    sh.require_root()
    topo = topology_of(LabDir(lab_dir).load())
    for h in (src, dst):
        if h not in topo.nodes or topo.nodes[h].role != "host":
            raise sh.LabError(f"{h!r} is not a host")
    p = paths.predict(topo, src, dst, proto, sport, dport)
    console.print(" -> ".join(p["hops"]))
    if probe:
        got = paths.udp_probe(topo, src, dst, [sport], dport)[sport]
        console.print(f"probe: {got}/100 datagrams arrived")


if __name__ == "__main__":
    app()
