"""A job's slowed collectives joined with a real fabric fault, end to end on the lab.

Six lab hosts (3 leaves x 2) run a ring all-reduce over TCP (lab/allreduce.py), each rank driving the real
NCCL profiler plugin (ncclProfiler_v4 through ctypes) that ships to the real `nms-agent` of its
host namespace; the agents post to a real `nms serve` (SNMP polling for the switches' addresses).
The job appears on its own; its collectives get a bus bandwidth baseline. Then:
- a real rate cut (10 Mbit/s TBF) on the spine egress that the ring's first hop hashes onto, with
  5 Mbit/s of other UDP traffic across it: the congestion incident on that link names the job and
  its slowed AllReduce;
- after the heal the slowdown clears; then one rank's process is throttled (SIGSTOP/SIGCONT duty
  cycle, the host side): a `job_slowdown` incident says no fabric element explains it, and no
  fabric incident opens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import agent_procs as agents
from lab import faults, paths
from lab.correlator_trials import incidents, link_element, load_through, wait_quiet
from lab.mesh import MeshLab
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.root
JOB = "lab-allreduce-1"
PORT, SPORT = 47000, 47100
NBYTES = 512 << 10
RATE_MBPS = 30  # paced: two ring flows hashed onto one 100 Mbit/s link must not congest it by themselves


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    # three leaves (the shared mesh): with two, every probe path over spine->leaf2 also crosses
    # leaf1->spine, and the probes alone could not tell which of the two the cut is on
    return shared_mesh


class Ring:
    """The all-reduce processes, one per host namespace, rank order `hosts`."""

    def __init__(self, mesh: MeshLab, hosts: list[str], nbytes: int = NBYTES):
        topo = mesh.topo
        self.hosts = hosts
        addrs = [topo.link_of_port(h, "eth0").b.ip for h in hosts]
        self.procs = []
        for rank, host in enumerate(hosts):
            sock = agents.agents_dir(mesh.dir) / host / "nccl.sock"
            env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": JOB, "NMS_NCCL_SOCKET": str(sock)}
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", topo.netns(host), sys.executable, "-m", "lab.allreduce",
                 "--rank", str(rank), "--addrs", ",".join(addrs), "--port", str(PORT), "--sport", str(SPORT + rank),
                 "--bytes", str(nbytes), "--seconds", "600", "--rate-mbps", str(RATE_MBPS)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def stop(self) -> list[dict]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        out = []
        for p in self.procs:
            try:
                stdout, stderr = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            out.append(json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {"stderr": stderr[-2000:]})
        return out


def _wait(what: str, check, timeout: float, every: float = 0.5, why=lambda: ""):
    return wait_until(check, timeout, every, what=what, why=why)


def _slowdowns(mesh) -> dict:
    r = mesh.api("GET", f"/jobs/{JOB}/slowdowns")
    return r.json() if r.status_code == 200 else {"active": [], "cleared": []}


def _collectives(mesh, n: int = 200) -> list[dict]:
    r = mesh.api("GET", f"/jobs/{JOB}/collectives", params={"limit": n})
    return r.json() if r.status_code == 200 else []


def test_a_fabric_fault_names_the_job_and_a_host_side_slowdown_is_not_blamed_on_it(mesh):
    topo = mesh.topo
    hosts = sorted(n.name for n in topo.by_role("host"))
    leaf_of = {h: topo.link_of_port(h, "eth0").a.node for h in hosts}
    # every hop of the ring crosses the spines: take the leaves' hosts in turn
    by_leaf: dict[str, list[str]] = {}
    for h in hosts:
        by_leaf.setdefault(leaf_of[h], []).append(h)
    order = [h for group in zip(*by_leaf.values()) for h in group]
    ring = Ring(mesh, order)
    try:
        # the job appears on its own, with ranks on their hosts, peers and sockets
        job = _wait(
            "the job",
            lambda: (
                (r := mesh.api("GET", f"/jobs/{JOB}")).status_code == 200
                and len(r.json()["ranks"]) == len(order)
                and all(x["qps"] for x in r.json()["ranks"])
                and r.json()
            ),
            60,
            why=lambda: (
                mesh.api("GET", f"/jobs/{JOB}").text[:2000]
                + " agents: "
                + json.dumps(
                    {
                        h: {k: v for k, v in (a.get("stats") or {}).items() if k.startswith("nccl")}
                        for h, a in mesh.agent_status().items()
                    }
                )
                + " ranks: "
                + json.dumps([p.poll() for p in ring.procs])
            ),
        )
        assert job["labels"]["source"] == "nccl"
        assert {(x["rank"], x["host"]) for x in job["ranks"]} == set(enumerate(order))
        n = len(order)
        assert all(sorted(x["peers"]) == sorted({(x["rank"] + 1) % n, (x["rank"] - 1) % n}) for x in job["ranks"])
        baseline = _wait("a bus bandwidth baseline", lambda: [c for c in _collectives(mesh)
                                                              if c["baseline_busbw_gbps"]], 40)
        base_busbw = baseline[-1]["baseline_busbw_gbps"]
        assert base_busbw > 0.002, baseline[-1]  # GB/s: 30 Mbit/s paced ~ 0.0035 x 2(n-1)/n

        # --- a real rate cut on the spine egress of the ring's first hop ------------------------------
        src, dst = order[0], order[1]
        spine = paths.predict(topo, src, dst, "tcp", SPORT, PORT)["spine"]
        link = next(x for x in topo.links if {x.a.node, x.b.node} == {spine, leaf_of[dst]})
        # other traffic across the cut, as on a congested fabric: it keeps the egress queue standing (the
        # ring's TCP alone, cut to 10 Mbit/s behind a 20 ms queue of a few jumbo frames, mostly drops
        # and backs off: loss at low utilization with no queueing delay, which reads as a corrupting link
        # where the switch's queue counters are not polled, as here)
        load = load_through(mesh, link.name, 20, rate="5M")  # half the cut: the ring keeps the rest
        time.sleep(1.0)
        start = time.time_ns()
        fault = faults.inject(mesh.dir, "congestion", link.name, rate="10M", from_node=spine)
        try:
            def named():
                for inc in incidents(mesh, since=start):
                    slowed = inc["evidence"].get("job_slowdowns") or []
                    if inc["element"] == link_element(link) and any(s["job"] == JOB for s in slowed):
                        return inc
                return None
            inc = _wait("the congestion incident naming the job", named, 60, why=lambda: json.dumps(
                {"incidents": [(i["kind"], i["element"], i["jobs"], i["summary"])
                               for i in incidents(mesh, since=start)],
                 "slowdowns": _slowdowns(mesh), "element": link_element(link),
                 "last": [(c["seq"], c["busbw_gbps"], c["baseline_busbw_gbps"], c["slow"])
                          for c in _collectives(mesh, 30)]}))
            named_after_s = (time.time_ns() - start) / 1e9
        finally:
            faults.heal(mesh.dir, fault["id"])
        history = mesh.api("GET", f"/incidents/{inc['id']}/events").json()
        assert inc["kind"] == "congestion", (inc, [(e["event"], e["ts"], e["incident"]["kind"],
                                                    e["incident"]["evidence"]) for e in history])
        assert JOB in inc["jobs"] and f"slows job {JOB}: AllReduce" in inc["summary"], inc["summary"]
        [slowed] = [s for s in inc["evidence"]["job_slowdowns"] if s["job"] == JOB]
        assert slowed["op"] == "AllReduce" and slowed["size_bucket"] == "512KiB" and slowed["ratio"] < 0.5, slowed
        assert len(slowed["slow_collectives"]) >= 3
        colls = {c["seq"]: c for c in _collectives(mesh, 1000)}
        assert all(colls[s]["slow"] for s in slowed["slow_collectives"] if s in colls), \
            (slowed, [colls.get(s) for s in slowed["slow_collectives"]])
        fault_busbw = sorted(colls[s]["busbw_gbps"] for s in slowed["slow_collectives"] if s in colls)
        # no host-side incident for the job while the fabric explained it (one opened before the
        # fault is the lab's own: a starved machine slows the ranks' processes)
        host_side = [i for i in incidents(mesh, since=start) if i["kind"] == "job_slowdown"]
        assert not [i for i in host_side if i["opened_ns"] >= start], [
            (i["id"], (i["opened_ns"] - start) / 1e9, i["state"], i["summary"], i["evidence"]) for i in host_side]

        # --- heal: the slowdown clears; then the host side slows down -----------------------------------
        _wait("the slowdown to clear", lambda: not _slowdowns(mesh)["active"], 60)
        load.join()
        assert wait_quiet(mesh, 60), incidents(mesh, state="open")
        start = time.time_ns()
        victim = ring.procs[2]
        throttling = threading.Event()

        def throttle():  # the rank's process runs 1 ms in every ~250 ms
            while not throttling.is_set() and victim.poll() is None:
                victim.send_signal(signal.SIGSTOP)
                time.sleep(0.25)
                victim.send_signal(signal.SIGCONT)
                time.sleep(0.001)
        worker = threading.Thread(target=throttle, daemon=True)
        worker.start()
        try:
            host_side = _wait("a job_slowdown incident",
                              lambda: next((i for i in incidents(mesh, since=start)
                                            if i["kind"] == "job_slowdown" and i["element"] == JOB), None), 60)
            fabric = [i for i in incidents(mesh, since=start) if i["kind"] != "job_slowdown"]
        finally:
            throttling.set()
            worker.join()
            victim.send_signal(signal.SIGCONT)
        assert host_side["element_kind"] == "job" and host_side["jobs"] == [JOB]
        assert "no fabric element" in host_side["summary"] and host_side["evidence"]["fabric_cause"] is None
        assert host_side["evidence"]["job_slowdowns"][0]["op"] == "AllReduce"
        assert fabric == [], fabric  # nothing blamed on the network

        # `nms jobs show` tells the story
        env = {**os.environ, "NMS_URL": mesh.url, "NMS_TOKEN": mesh.token, "COLUMNS": "250"}
        out = subprocess.run([sys.executable, "-m", "nms", "jobs", "show", JOB, "--json"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        kinds = {i["kind"] for i in shown["incidents"]}
        assert {"congestion", "job_slowdown"} <= kinds, kinds
        assert shown["slowdowns"]["cleared"] and shown["collectives"]
        print(f"\nbaseline busbw {base_busbw * 1e3:.2f} MB/s; under the 10 Mbit/s cut "
              f"{fault_busbw[len(fault_busbw) // 2] * 1e3:.2f} MB/s (median of {len(fault_busbw)} slow); "
              f"the congestion incident named the job {named_after_s:.1f} s after the cut")
    finally:
        results = ring.stop()
    assert all(r.get("wrong") == 0 and r.get("collectives", 0) > 10 for r in results), results
