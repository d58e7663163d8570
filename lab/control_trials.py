"""The act loop on the lab (the harness of bench/traffic_control.py and of
tests/lab/test_actions_lab.py): a job's paced UDP flows on a 2-spine, 3-leaf lab, a congestion fault
on leaf1's uplink to spine1, and per trial the job's goodput and the time from the fault to each
steered flow's move, with the action engine acting (control) or only proposing (ecmp).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lab import faults, paths
from lab.agent_procs import agents_dir
from lab.correlator_trials import SERVICE, incidents, link_element, wait_quiet  # noqa: F401  (link_element: the tests')
from lab.jobtraffic import Flow, JobTraffic
from lab.mesh import MeshLab

RATE = 8_000_000  # offered per flow
CUT = "6mbit"
LINK, FROM = "leaf1-spine1", "leaf1"
SOURCES, DESTS = ("host1", "host2"), ("host3", "host4")
ACTIONS = {"enabled": True, "dry_run": True, "hold": "5s",
           "policies": {"host_reroute": {"policy": "auto"}}}


def new_lab(prefix: str, mgmt: str, gnmi_interval: str | None = None, actions: dict | None = None) -> MeshLab:
    """`gnmi_interval`: also poll the switches over gNMI (the switch actuators' southbound)."""
    return MeshLab(prefix, mgmt, snmp_interval="1s", gnmi_interval=gnmi_interval,
                   service_config={**SERVICE, "actions": actions or ACTIONS}, leaves=3, hosts_per_leaf=2)


def job_flows(topo, rate: int = RATE) -> list[Flow]:
    """Per (source, destination) pair one flow via each spine."""
    flows, used = [], set()
    for src in SOURCES:
        for dst in DESTS:
            for spine in ("spine1", "spine2"):
                sport = paths.sport_via(topo, src, dst, spine, "udp", 4791, 40000, avoid=used)
                used.add(sport)
                flows.append(Flow(len(flows), src, dst, topo.host_port(src).ip, topo.host_port(dst).ip, sport, rate))
    return flows


def via_cut(topo, flows: list[Flow]) -> set[int]:
    """The flows the kernel hashes over leaf1 -> spine1."""
    return {f.id for f in flows if paths.predict(topo, f.src, f.dst, "udp", f.sport, 4791)["spine"] == "spine1"}


def start_job(mesh: MeshLab, flows: list[Flow], duration: float) -> JobTraffic:
    table = {h: agents_dir(mesh.dir) / h / "steering.json" for h in SOURCES}
    return JobTraffic(mesh.topo, flows, Path(tempfile.mkdtemp(prefix="nms-job-")), steering=table).start(duration)


def wait_mapped(mesh: MeshLab, timeout: float = 60.0) -> dict:
    """Until every agent's port map answers for all its peers (hostprobe/steer.py)."""
    peers = len(mesh.topo.by_role("host")) - 1
    ok = wait_for(lambda: all(a.get("stats", {}).get("steer_map") == peers for a in mesh.agent_status().values()),
                  timeout, 0.5)
    status = mesh.agent_status()
    if not ok:
        raise TimeoutError(
            f"port maps not warm: { {h: a.get('stats', {}).get('steer_map') for h, a in status.items()} }"
        )
    return status


def reconfigure(mesh: MeshLab, changes: dict) -> None:
    """Restart the service with `changes` merged into its config (nested dicts merged), as an
    operator turning acting on would."""
    def merge(into: dict, change: dict) -> None:
        for key, value in change.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
    mesh.stop_service()
    config = yaml.safe_load(mesh.config.read_text())
    merge(config, changes)
    mesh.config.write_text(yaml.safe_dump(config))
    started = time.time_ns()
    mesh.start_service()
    mesh.wait_service_ready(started)


def set_dry_run(mesh: MeshLab, dry_run: bool) -> None:
    """Restart the service with actions in dry run or not (nothing happens when it is so already)."""
    if yaml.safe_load(mesh.config.read_text()).get("actions", {}).get("dry_run") != dry_run:
        reconfigure(mesh, {"actions": {"dry_run": dry_run}})


def wait_for(cond, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step)
    return cond()


@dataclass
class Trial:
    mode: str
    aggregate_bps: float  # the job's goodput, all flows, over the window
    slowest_bps: float
    per_flow: dict[int, float]
    incident: dict | None  # the first incident on the cut link
    detected_s: float | None  # fault -> that incident opened
    start_ns: int = 0  # the fault injected
    moved_s: dict[int, float] = field(default_factory=dict)  # flow over the cut link -> fault -> its move
    actions: list[dict] = field(default_factory=list)  # this trial's actions, as the API shows them


def trial(mesh: MeshLab, job: JobTraffic, flows: list[Flow], mode: str, observe: float = 10.0,
          window: float = 4.0) -> Trial:
    element = link_element(mesh.topo.find_link(LINK))
    home = {f.id: f.sport for f in flows}
    first_action = max((a["id"] for a in mesh.api("GET", "/actions").json()), default=0)
    start = time.time_ns()
    fault = faults.inject(mesh.dir, "congestion", LINK, rate=CUT, from_node=FROM)
    try:
        time.sleep(observe)
        end = time.time_ns()
        per_flow = job.goodput(end - int(window * 1e9), end)
        # the actions as they stood during the fault (after the heal, the incident resolves and a
        # dry run's proposals are withdrawn, at a time that depends on the machine's speed)
        acts = [a for a in mesh.api("GET", "/actions").json() if a["id"] > first_action]
    finally:
        faults.heal(mesh.dir, fault["id"])
    opened = [i for i in incidents(mesh, since=start) if i["element"] == element and i["opened_ns"] >= start]
    inc = min(opened, key=lambda i: i["opened_ns"]) if opened else None
    moved: dict[int, float] = {}
    cut = via_cut(mesh.topo, flows)
    for m in job.moves():
        if m["t_ns"] > start and m["sport"] != home[m["flow"]] and m["flow"] in cut and m["flow"] not in moved:
            moved[m["flow"]] = (m["t_ns"] - start) / 1e9
    return Trial(mode, sum(per_flow.values()), min(per_flow.values()), per_flow, inc,
                 (inc["opened_ns"] - start) / 1e9 if inc else None, start, moved, acts)


def settle(mesh: MeshLab, job: JobTraffic, flows: list[Flow], timeout: float = 90.0) -> bool:
    """Until no incident is open, no action is live, and every flow sends from its own port again."""
    home = {f.id: f.sport for f in flows}

    def back() -> bool:
        last: dict[int, int] = {}
        for m in job.moves():
            last[m["flow"]] = m["sport"]
        live = [a for a in mesh.api("GET", "/actions").json() if a["state"] in ("applying", "applied", "rolling_back")]
        return not live and all(last.get(i, sp) == sp for i, sp in home.items())
    return wait_quiet(mesh, timeout) and bool(wait_for(back, timeout, 0.5))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
