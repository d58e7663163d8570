"""`nms demo` on the fabric lab: the README's main job.

Builds a 2-spine, 3-leaf, 6-host lab, starts `nms serve` on the embedded store with SNMP polling of
every switch's snmpd, a probe agent on every host and the correlator; registers a training job;
breaks a leaf-spine link for real, shows the incident as it opens (kind, element, evidence, the
job it hurts), heals the link, shows the incident resolve, and tears everything down.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from lab import faults
from lab.stack import LabStack
from nms.app.cli.client import err_console
from nms.app.cli.interrupt import signals_as_ctrl_c

console = Console()

PREFIX, MGMT = "nmsx-", "198.18.242.0/24"  # the demo's own lab: never clashes with `nms lab up`'s default
SERVICE = {"thresholds": {"resolve_after_clean_windows": 3}}
JOB = {"id": "llama-70b-pretrain-42", "name": "llama pretrain", "hosts": ["host1", "host3", "host5"]}


def _wait(what: str, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    err_console.print(f"[red]timed out after {timeout:.0f} s waiting for {what}[/]")
    raise typer.Exit(1)


def _incidents(stack: LabStack, **params) -> list[dict]:
    r = stack.api("GET", "/incidents", params=params)
    r.raise_for_status()
    return r.json()


def _show(incident: dict) -> None:
    table = Table(show_header=False, title=f"incident {incident['id']}: {incident['state']}")
    for key in ("kind", "element", "direction", "severity", "summary", "confidence", "jobs", "evidence"):
        value = incident.get(key)
        if value not in (None, [], {}):
            table.add_row(key, str(value))
    console.print(table)


def run_lab_demo(keep_lab: bool = False) -> None:
    stack = LabStack(PREFIX, MGMT, snmp_interval="1s", service_config=SERVICE, leaves=3)
    console.rule("[bold]fabric-nms demo: the fabric lab, agents, SNMP and the correlator")
    with signals_as_ctrl_c():  # SIGTERM, SIGHUP: the Ctrl-C teardown, the lab removed
        _run(stack, keep_lab)
    console.print("[green]demo done[/]: lab removed")


def _run(stack: LabStack, keep_lab: bool) -> None:
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("lab up: 2 spines, 3 leaves, 6 hosts; service; agents", total=None)
            stack.up()
            progress.update(task, description="agents tracing every ECMP path")
            stack.wait_traced(60)
            progress.update(task, description="a clean fabric: no incident open")
            _wait("a quiet fabric", lambda: not _incidents(stack, state="open"), 60)
        console.print(f"[green]up[/]: service {stack.url}, lab dir {stack.dir.root}, "
                      f"{len(stack.agent_status())} agents probing")
        stack.api("POST", "/jobs", json={**JOB, "start": time.time_ns()}).raise_for_status()
        console.print(f"job {JOB['id']} on {', '.join(JOB['hosts'])}")

        link = stack.topo.find_link("leaf1-spine1")
        fault = faults.inject(stack.dir, "link-down", link.name)
        console.print(f"[bold red]fault injected[/]: link down {link.name} ({link.a} -- {link.b})")
        opened = _wait("the incident", lambda: next(
            (i for i in _incidents(stack, since=fault["start_ns"]) if i["kind"] == "link_down"), None), 30)
        console.print(f"[bold]incident opened {(opened['opened_ns'] - fault['start_ns']) / 1e9:.2f} s after "
                      "the fault[/]")
        _show(opened)
        time.sleep(3)  # let switch evidence (SNMP oper status) arrive
        _show(stack.api("GET", f"/incidents/{opened['id']}").json())

        faults.heal(stack.dir, fault["id"])
        console.print("[bold green]healed[/]: link up")
        resolved = _wait("the incident to resolve", lambda: (
            i := stack.api("GET", f"/incidents/{opened['id']}").json())["state"] == "resolved" and i, 60)
        console.print(f"[bold]incident resolved[/] {(resolved['resolved_ns'] - fault['start_ns']) / 1e9:.1f} s "
                      "after the fault")
        others = [i for i in _incidents(stack, since=fault["start_ns"]) if i["id"] != opened["id"]]
        if others:
            err_console.print(f"[red]other incidents opened: {[(i['kind'], i['element']) for i in others]}[/]")
            raise typer.Exit(1)
        deliveries = stack.api("GET", "/notifications/deliveries").json()
        console.print(f"incident events streamed; {len(deliveries)} notification deliveries (no sinks configured "
                      "in the demo: see docs/notifications.md)")
        if keep_lab:
            console.print(f"[bold]left running[/]: NMS_URL={stack.url} NMS_TOKEN=$(cat {stack.dir.token}) "
                          "nms incidents list; Ctrl-C to tear down")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        with console.status("tearing the lab down"):
            stack.down()
