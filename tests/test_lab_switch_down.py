"""The lab's switch-down fault (lab/faults.py): a whole switch dies, every link of it at once.
Its parameters, claims, refusals and `nms lab status` rows, computed without a lab (its injection
in the namespaces: bench/correlator_lab.py --kinds switch-down, docs/correlator.md)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lab import cli, faults
from lab import lab as lab_mod
from lab.sh import LabError
from lab.state import LabDir, now
from lab.topology import Spec, plan

SPEC = Spec(spines=3, leaves=4, hosts_per_leaf=2, mgmt_subnet="198.18.99.0/24", prefix="nmscb-")
TOPO = plan(SPEC)


def test_a_spine_takes_every_one_of_its_links_and_claims_their_carrier():
    params, claims = faults.make_params(TOPO, "switch-down", "spine2", {})
    links = ["leaf1-spine2", "leaf2-spine2", "leaf3-spine2", "leaf4-spine2"]
    assert params == {"switch": "spine2", "links": links}
    assert claims == [f"carrier:{name}" for name in links]
    _, link_claims = faults.make_params(TOPO, "link-down", "spine2-leaf3", {})
    assert set(link_claims) <= set(claims)  # so a link-down on one of them clashes


def test_a_leaf_takes_its_uplinks_and_its_host_links():
    params, claims = faults.make_params(TOPO, "switch-down", "leaf1", {})
    assert sorted(params["links"]) == ["leaf1-host1", "leaf1-host2", "leaf1-spine1", "leaf1-spine2", "leaf1-spine3"]
    _, nic_claims = faults.make_params(TOPO, "nic-down", "host2", {})
    assert set(nic_claims) & set(claims) == {"carrier:leaf1-host2"}


@pytest.mark.parametrize("target, opts, error", [
    ("host1", {}, "switch-down needs a switch (e.g. spine1, spine2, spine3), got 'host1'"),
    ("leaf1-spine2", {}, "switch-down needs a switch"),
    ("spine9", {}, "switch-down needs a switch"),
    ("spine1", {"mode": "failover"}, "switch-down does not take --mode"),
])
def test_bad_targets_and_options_are_refused_naming_them(target, opts, error):
    with pytest.raises(LabError, match=error.replace("(", r"\(").replace(")", r"\)")):
        faults.make_params(TOPO, "switch-down", target, opts)


def _lab(tmp_path, faults_held: list[dict]) -> LabDir:
    """A lab directory whose state.json holds the given faults (nothing built: no namespaces)."""
    lab = LabDir(tmp_path)
    lab.lock_file.touch()
    state = {"lab": lab_mod._lab_info(TOPO, lab, SPEC, now()), "nodes": {}, "links": lab_mod._links_info(TOPO),
             "withdrawn": [], "faults": faults_held, "clocks": {}}
    lab.save(state)
    return lab


def _held(fault_id: str, kind: str, target: str, **opts) -> dict:
    params, claims = faults.make_params(TOPO, kind, target, opts)
    t = now()
    return {"id": fault_id, "kind": kind, "target": target, "params": params, "claims": claims, "active": True,
            "start_ns": t["ns"], "start_iso": t["iso"], "end_ns": None, "end_iso": None, "events": []}


def test_a_clashing_fault_is_refused_both_ways_and_the_state_is_kept(tmp_path):
    lab = _lab(tmp_path, [_held("f1", "link-down", "leaf3-spine2")])
    before = lab.state.read_text()
    with pytest.raises(LabError, match=r"fault f1 \(link-down leaf3-spine2\) already holds carrier:leaf3-spine2"):
        faults.inject(lab, "switch-down", "spine2")
    assert lab.state.read_text() == before

    lab = _lab(tmp_path, [_held("f2", "switch-down", "spine1")])
    before = lab.state.read_text()
    for kind, target in (("flap", "leaf4-spine1"), ("link-down", "spine1-leaf2"), ("switch-down", "leaf2")):
        with pytest.raises(LabError, match=r"fault f2 \(switch-down spine1\) already holds carrier:leaf\d-spine1"):
            faults.inject(lab, kind, target)
    assert lab.state.read_text() == before


def test_status_shows_the_fault_on_every_link_of_the_switch(tmp_path, monkeypatch):
    lab = _lab(tmp_path, [_held("f1", "switch-down", "spine3")])
    out = Console(record=True, width=300)
    monkeypatch.setattr(cli, "console", out)
    result = CliRunner().invoke(cli.app, ["status", "--lab-dir", str(lab.root)])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in out.export_text().splitlines() if line.count("│") > 3}
    for link in TOPO.links:
        assert ("f1:switch-down" in rows[link.name]) == (link.b.node == "spine3"), rows[link.name]
    assert "switch=spine3" in rows["f1"] and "links=" not in rows["f1"]
    state = json.loads(CliRunner().invoke(cli.app, ["status", "--json", "--lab-dir", str(lab.root)]).stdout)
    assert state["faults"][0]["params"]["links"] == ["leaf1-spine3", "leaf2-spine3", "leaf3-spine3", "leaf4-spine3"]
