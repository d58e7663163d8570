"""Load-aware steering on a wider lab (issue #26; the harness of bench/traffic_load_aware.py): two
jobs' paced UDP flows (lab/jobtraffic.py) on a 4-spine, 2-leaf lab with 4 hosts per leaf, links
shaped to `LINK_RATE`, and per trial each job's goodput with the action engine only proposing
(ecmp), steering with `avoid_hops` alone (avoid: `actions.load_aware: false`), with `hop_loads`
(load: the agents place their ports by load, `plan_routes: false`) or with the service's planned
`routes` (plan: the agents follow them).

Jobs (disjoint hosts, two per leaf each): scenario A two all-to-all jobs, scenario B an all-to-all
and a ring. Every pair of a job on different leaves runs `QPS` flows of `RATE` (pairs under one
leaf never meet a spine: left out, they would only load the hosts' access links, which the lab
shapes at the same rate as the spine links; their congestion there is noise to this test). Their own
source ports are picked with the kernel's `ip route get` (lab/paths.py):

* collide: each leaf sends `hot` of its cross-leaf flows over spine1, both jobs' alike (their flows
  taken in turn), the rest round robin over the other three: an ECMP collision, built, polarized as
  one hash function on every switch polarizes it (the same uplink hot on every leaf);
* balanced: round robin over the four spines (a pair's QPs on different ones).

The jobs are posted to the service for each trial (POST /jobs), as a scheduler adapter would: the
planner then steers only the flows between job peers (correlator/actions/planner.py `job_peers`).

A trial is `clean` (collide, no fault: the collision alone is the congestion) or `degraded`
(balanced, then leaf1's egress to spine1 cut to `CUT` by TBF, healed after the observation, and
the time until every flow sends from its own port again measured).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab import faults, paths
from lab.agent_procs import agents_dir
from lab.control_trials import reconfigure, wait_for
from lab.correlator_trials import SERVICE, incidents, link_element, wait_quiet
from lab.jobtraffic import Flow, JobTraffic
from lab.mesh import MeshLab

SPINES, LEAVES, HOSTS_PER_LEAF = 4, 2, 4
LINK_RATE = 10_000_000
RATE = 1_200_000  # offered per flow: 16 flows of a leaf fit its 3 spines left after one is avoided (6 each, 0.72)
QPS = 2  # flows per pair of a job = the agents' steering.ports_per_dst
CUT, CUT_LINK, CUT_FROM = "2mbit", "leaf1-spine1", "leaf1"
HOME_BASE = 40000  # the jobs' own source ports start here (the agents' candidates: 49152 up)
JOBS = {  # scenario -> [(job, kind, hosts)]
    "A": [("a2a-1", "a2a", ["host1", "host2", "host5", "host6"]),
          ("a2a-2", "a2a", ["host3", "host4", "host7", "host8"])],
    "B": [("a2a", "a2a", ["host1", "host2", "host5", "host6"]),
          ("ring", "ring", ["host3", "host7", "host4", "host8"])],
}
ACTIONS = {"enabled": True, "dry_run": True, "load_aware": True, "hold": "20s", "expiry": "60s",
           "ports_per_dst": QPS,
           "rate": {"per_kind": 1000, "max_concurrent": 64},
           "policies": {"host_reroute": {"policy": "auto"}}}
MODES = {"ecmp": {"dry_run": True}, "avoid": {"dry_run": False, "load_aware": False},
         "load": {"dry_run": False, "load_aware": True, "plan_routes": False},
         "plan": {"dry_run": False, "load_aware": True, "plan_routes": True}}


def new_lab(prefix: str, mgmt: str, rate: int = RATE) -> MeshLab:
    """The agents keep QPS ports per destination, each counted as `rate` / LINK_RATE of a link's load
    (what an operator sets from the job's per-QP rate: the agent does not measure it)."""
    steering = {"ports_per_dst": QPS, "port_load": round(rate / LINK_RATE, 3)}
    return MeshLab(prefix, mgmt, link_rate_bps=LINK_RATE, snmp_interval="1s",
                   service_config={**SERVICE, "actions": {**ACTIONS, "port_load": steering["port_load"]}},
                   agent_config={"steering": steering},
                   spines=SPINES, leaves=LEAVES, hosts_per_leaf=HOSTS_PER_LEAF)


def leaf_of(topo, host: str) -> str:
    return topo.link_of_port(host, "eth0").a.node


def job_pairs(kind: str, hosts: list[str]) -> list[tuple[str, str]]:
    if kind == "a2a":
        return [(s, d) for s in hosts for d in hosts if s != d]
    return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]  # ring


def register_jobs(mesh: MeshLab, scenario: str) -> list[str]:
    """The scenario's jobs as a scheduler adapter would post them (their hosts; a ring's ranks with
    their peers, the NCCL plugin's data): the planner then steers only the flows they have."""
    ids, now = [], time.time_ns()
    for name, kind, hosts in JOBS[scenario]:
        job: dict = {"id": f"{scenario}-{name}", "hosts": hosts, "start": now}
        if kind == "ring":
            n = len(hosts)
            job["ranks"] = [{"rank": i, "host": h, "peers": [(i + 1) % n, (i - 1) % n]} for i, h in enumerate(hosts)]
        mesh.api("POST", "/jobs", json=job).raise_for_status()
        ids.append(job["id"])
    return ids


def job_flows(topo, scenario: str, layout: str, hot: float = 0.8,
              rate: int = RATE) -> tuple[list[Flow], dict[int, str]]:
    """(flows, {flow id: job}) with their home ports picked for `layout` (collide | balanced)."""
    specs = [(job, s, d, q) for job, kind, hosts in JOBS[scenario] for s, d in job_pairs(kind, hosts)
             if leaf_of(topo, s) != leaf_of(topo, d) for q in range(QPS)]
    spines = sorted(n.name for n in topo.by_role("spine"))
    leaves = sorted(n.name for n in topo.by_role("leaf"))
    target: dict[int, str] = {}
    for leaf in leaves:
        cross = [i for i, (_, s, d, _q) in enumerate(specs) if leaf_of(topo, s) == leaf and leaf_of(topo, d) != leaf]
        if layout == "collide":
            # QP 0 of every pair first, the jobs' flows in turn: both jobs as hot as each other
            rank = {i: k for job in {specs[i][0] for i in cross}
                    for k, i in enumerate(sorted((i for i in cross if specs[i][0] == job),
                                                 key=lambda i: (specs[i][3], specs[i][1], specs[i][2])))}
            cross.sort(key=lambda i: (rank[i], specs[i][0]))
            n_hot = math.ceil(hot * len(cross))
            others = spines[1:]
            for k, i in enumerate(cross):
                target[i] = spines[0] if k < n_hot else others[(k - n_hot) % len(others)]
        else:
            cross.sort(key=lambda i: (specs[i][1], specs[i][2], specs[i][3]))
            for k, i in enumerate(cross):
                target[i] = spines[k % len(spines)]
    flows, owner, used = [], {}, set()
    for i, (job, s, d, _q) in enumerate(specs):
        spine = target[i]
        sport = paths.sport_via(topo, s, d, str(spine), "udp", 4791, HOME_BASE, avoid=used)
        used.add(sport)
        flows.append(Flow(i, s, d, topo.host_port(s).ip, topo.host_port(d).ip, sport, rate))
        owner[i] = job
    return flows, owner


def uplink_counts(topo, flows: list[Flow], sports: dict[int, int]) -> dict[str, list[int]]:
    """Per leaf: how many flows each spine uplink carries with the given source ports (ip route get)."""
    spines = sorted(n.name for n in topo.by_role("spine"))
    out: dict[str, list[int]] = {}
    for f in flows:
        leaf = leaf_of(topo, f.src)
        if leaf == leaf_of(topo, f.dst):
            continue
        spine = paths.predict(topo, f.src, f.dst, "udp", sports[f.id], 4791)["spine"]
        out.setdefault(leaf, [0] * len(spines))[spines.index(spine)] += 1
    return dict(sorted(out.items()))


def set_mode(mesh: MeshLab, mode: str) -> None:
    reconfigure(mesh, {"actions": MODES[mode]})


def current_ports(job: JobTraffic, flows: list[Flow]) -> dict[int, int]:
    ports = {f.id: f.sport for f in flows}
    for m in job.moves():
        ports[m["flow"]] = m["sport"]
    return ports


@dataclass
class Trial:
    scenario: str
    fault: str  # clean | degraded
    mode: str
    per_flow: dict[int, float]  # goodput (bit/s) over the window
    owner: dict[int, str]
    uplinks: dict[str, list[int]]  # flows per spine uplink at the window's end
    incidents: list[str] = field(default_factory=list)  # kind@element of those opened in the trial
    actions: list[str] = field(default_factory=list)
    moved: int = 0  # flows that left their own port during the observation
    followed: tuple[int, int] = (0, 0)  # the reroutes' kept ports that took a planned route, of all kept
    back_early: int = 0  # of those, back on their own port at its end (a rollback before the heal)
    return_s: float | None = None  # degraded: heal -> every flow on its own port again
    returned: bool | None = None

    def jobs(self) -> dict[str, dict[str, float]]:
        """Per job: aggregate goodput, slowest flow, and the collective's rate (slowest x flows: a
        collective step ends with its slowest flow)."""
        out = {}
        for job in sorted(set(self.owner.values())):
            rates = [r for fid, r in self.per_flow.items() if self.owner[fid] == job]
            out[job] = {"aggregate": sum(rates), "slowest": min(rates), "collective": min(rates) * len(rates)}
        return out


def followed_routes(actions: list[dict]) -> tuple[int, int]:
    """(ports that took one of the service's planned routes, ports kept) over the agents' steer
    results of these actions (hostprobe/steer.py: per destination `planned` and `ports`)."""
    followed = kept = 0
    for a in actions:
        for host in ((a.get("after") or {}).get("hosts") or {}).values():
            for dst in ((host.get("result") or {}).get("dsts") or {}).values():
                followed += int(dst.get("planned", 0))
                kept += len(dst.get("ports", []))
    return followed, kept


def trial(mesh: MeshLab, flows: list[Flow], owner: dict[int, str], scenario: str, fault: str, mode: str,
          observe: float, window: float, workdir: Path, return_wait: float = 60.0) -> Trial:
    tables = {h.name: agents_dir(mesh.dir) / h.name / "steering.json" for h in mesh.topo.by_role("host")}
    first_action = max((a["id"] for a in mesh.api("GET", "/actions").json()), default=0)
    home = {f.id: f.sport for f in flows}
    registered = register_jobs(mesh, scenario)
    job = JobTraffic(mesh.topo, flows, Path(tempfile.mkdtemp(prefix=f"{scenario}-{fault}-{mode}-", dir=workdir)),
                     steering=tables).start(24 * 3600)
    fault_id = None
    try:
        if fault == "degraded":
            time.sleep(3.0)  # the job at its rate before the cut
        start = time.time_ns()
        if fault == "degraded":
            fault_id = faults.inject(mesh.dir, "congestion", CUT_LINK, rate=CUT, from_node=CUT_FROM)["id"]
        time.sleep(observe)
        end = time.time_ns()
        per_flow = job.goodput(end - int(window * 1e9), end)
        now = current_ports(job, flows)
        t = Trial(scenario, fault, mode, per_flow, owner, uplink_counts(mesh.topo, flows, now))
        t.moved = len({m["flow"] for m in job.moves() if m["sport"] != home[m["flow"]]})
        t.back_early = sum(1 for fid in {m["flow"] for m in job.moves() if m["sport"] != home[m["flow"]]}
                           if now[fid] == home[fid])
        actions = [a for a in mesh.api("GET", "/actions").json() if a["id"] > first_action]
        t.actions = [f"{a['kind']}@{a.get('element')}:{a['state']}" for a in actions]
        t.followed = followed_routes(actions)
        t.incidents = [f"{i['kind']}@{i['element']}" for i in incidents(mesh, since=start) if i["opened_ns"] >= start]
        if fault_id is not None:
            faults.heal(mesh.dir, fault_id)
            healed, fault_id = time.time_ns(), None
            if t.moved:
                t.returned = bool(wait_for(lambda: current_ports(job, flows) == home, return_wait, 0.5))
                last = max((m["t_ns"] for m in job.moves() if m["t_ns"] > healed), default=healed)
                t.return_s = (last - healed) / 1e9 if t.returned else None
        return t
    finally:
        if fault_id is not None:
            faults.heal(mesh.dir, fault_id)
        job.stop()
        for job_id in registered:
            mesh.api("DELETE", f"/jobs/{job_id}")


def roll_back_live(mesh: MeshLab) -> int:
    """Roll back (as an operator would) every action still applied: the next trial starts unsteered,
    and no hold doubles for it (only rollbacks on resolution count as relapses)."""
    n = 0
    for a in mesh.api("GET", "/actions").json():
        if a["state"] == "applied":
            mesh.api("POST", f"/actions/{a['id']}/rollback", json={"reason": "bench: next trial"})
            n += 1
    return n


def quiet(mesh: MeshLab, timeout: float = 90.0) -> bool:
    """Every live action rolled back, then until no incident is open and no action is live or
    proposed (a dry run's proposals are withdrawn when their incident resolves)."""
    roll_back_live(mesh)

    def idle() -> bool:
        return not [a for a in mesh.api("GET", "/actions").json()
                    if a["state"] in ("applying", "applied", "rolling_back", "proposed")]
    return wait_quiet(mesh, timeout) and bool(wait_for(idle, timeout, 0.5))


__all__ = ["link_element"]
