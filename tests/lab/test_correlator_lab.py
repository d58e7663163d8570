"""The correlator end to end on the real lab: real agents, real snmpd polled every second, real faults.

One trial per fault kind of the lab (bench/correlator_lab.py runs ten of each and scores them): the
incident of the right kind opens on the right element, nothing else opens, and it resolves after
the heal. A clean soak first: no incident at all. On the shared mesh (tests/lab/conftest.py), after the
audit lab's tests and before the jobs lab's.
"""

from __future__ import annotations

import random
import time

import pytest

from lab.correlator_trials import DEADLINE_S, soak, trial

pytestmark = pytest.mark.root
# clean half a minute (each trial below also fails on an incident it did not cause);
# bench/correlator_lab.py --soak runs longer (docs/benchmarks.md)
SOAK_S = 30.0


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    return shared_mesh


def test_a_clean_lab_raises_no_incident(mesh):
    assert soak(mesh, SOAK_S) == []


@pytest.mark.parametrize("kind", ["link-down", "loss", "congestion", "flap", "nic-down", "mtu", "blackhole"])
def test_each_fault_opens_the_right_incident_and_resolves_after_heal(mesh, kind):
    r = trial(mesh, kind, random.Random(kind))
    assert r["detected"], f"no {kind} incident on {r['element']} within {DEADLINE_S[kind]} s: {r}"
    assert r["wrong"] == [], f"other incidents opened during the {kind} fault: {r['wrong_why']}"
    assert r["resolved_s"] is not None, f"the incident did not resolve after the heal: {r}"


def test_incident_carries_evidence_and_jobs(mesh):
    """A job on two hosts whose traffic crosses the failed link is attached to the incident."""
    topo = mesh.topo
    start = time.time_ns()
    mesh.api("POST", "/jobs", json={"id": "train-7", "hosts": ["host1", "host3"], "start": start}).raise_for_status()
    r = trial(mesh, "link-down", random.Random("jobs"))
    assert r["detected"]
    inc = next(i for i in mesh.api("GET", "/incidents", params={"since": start}).json()
               if i["element"] == r["element"])
    assert inc["evidence"], inc
    leaves = {topo.link_of_port(h, "eth0").a.node for h in ("host1", "host3")}
    link = topo.link(r["target"])
    crosses = bool({link.a.node, link.b.node} & leaves)
    assert ("train-7" in inc["jobs"]) == crosses, (inc["jobs"], r["target"])
