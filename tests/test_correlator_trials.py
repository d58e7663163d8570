"""The correlator bench's trial choices and table (lab/correlator_trials.py, bench/correlator_lab.py)
on a 3 spine x 4 leaf x 2 host topology from lab.topology: no lab, no root."""

from __future__ import annotations

import random
import typing

import pytest

from bench.correlator_lab import summary
from lab import correlator_trials as trials
from lab import faults
from lab.stack import expected_paths
from lab.topology import Spec, plan
from nms.records import FaultKind

TOPO = plan(Spec(spines=3, leaves=4, hosts_per_leaf=2, mgmt_subnet="198.18.99.0/24", prefix="nmscb-"))
SPINE_LINKS = {f"leaf{leaf}-spine{spine}" for leaf in range(1, 5) for spine in range(1, 4)}


@pytest.fixture(autouse=True)
def fresh_history(monkeypatch):
    monkeypatch.setattr(trials, "_last_fault", {})


def test_every_kind_has_a_deadline_and_an_incident_kind_of_the_contract():
    assert set(trials.DEADLINE_S) == set(trials.KIND_OF)
    assert set(trials.KIND_OF.values()) <= set(typing.get_args(FaultKind))
    assert (trials.DEADLINE_S["loss-0.5"], trials.DEADLINE_S["loss-0.1"]) == (60.0, 200.0)
    assert trials.KIND_OF["switch-down"] == "device_down"


@pytest.mark.parametrize("kind, percent", [("loss-0.5", 0.5), ("loss-0.1", 0.1)])
def test_low_loss_is_exactly_that_percent_one_way_on_a_leaf_spine_link(kind, percent):
    rng = random.Random(kind)
    for _ in range(12):
        target, opts, element = trials.choose(TOPO, kind, rng)
        link = TOPO.link(target)
        assert target in SPINE_LINKS and opts["percent"] == percent
        assert opts["from_node"] in (link.a.node, link.b.node)
        assert element == "--".join(sorted((str(link.a), str(link.b))))
        params, _ = faults.make_params(TOPO, "loss", target, opts)  # what trial() injects
        assert params["percent"] == percent
        assert params["direction"] == f"{opts['from_node']}->{link.other(opts['from_node']).node}"


def test_switch_down_picks_a_spine_and_rests_its_links():
    rng = random.Random(1)
    picked = [trials.choose(TOPO, "switch-down", rng) for _ in range(3)]
    assert sorted(target for target, _, _ in picked) == ["spine1", "spine2", "spine3"]  # never a rested one
    for target, opts, element in picked:
        assert opts == {} and element == target
        faults.make_params(TOPO, "switch-down", target, opts)  # a target the lab takes
    assert set(trials._last_fault) == SPINE_LINKS  # each spine's links count as faulted
    for spine, when in (("spine1", 3e18), ("spine2", 1e18), ("spine3", 2e18)):  # all rested
        trials._last_fault.update({f"leaf{leaf}-{spine}": when for leaf in range(1, 5)})
    trials._last_fault["leaf1-spine2"] = 4e18  # a spine is as rested as its most recently faulted link
    assert trials.choose(TOPO, "switch-down", rng)[0] == "spine3"  # the one faulted longest ago


def test_a_link_fault_avoids_the_links_of_a_spine_just_killed():
    rng = random.Random(2)
    trials._last_fault.update({f"leaf{leaf}-spine1": 1e18 for leaf in range(1, 5)})  # just now, for ever
    for kind in ("loss-0.5", "link-down", "blackhole"):
        target, _, _ = trials.choose(TOPO, kind, rng)
        assert not target.endswith("spine1"), (kind, target)


def test_a_spine_whose_link_was_just_faulted_is_not_killed():
    rng = random.Random(3)
    trials._last_fault.update({"leaf4-spine2": 1e18, "leaf1-spine3": 1e18})
    assert trials.choose(TOPO, "switch-down", rng)[0] == "spine1"


@pytest.mark.parametrize("spines, leaves, hpl, peers_random, sports, want", [
    (2, 3, 2, 12, 32, 1 + 2 * 4),     # the tests' shared mesh: as before
    (3, 4, 2, 12, 32, 1 + 3 * 6),     # 3 spines: one path per spine to each host under another leaf
    (2, 3, 4, 12, 32, 3 + 2 * 8),     # the bench's default
    (2, 4, 4, 12, 32, 3 + 2 * 12),    # 16 hosts, every one still a peer
    (2, 5, 4, 12, 32, None),          # 16 hosts under other leaves, 12 random peers: the count is chance
    (3, 4, 2, 5, 32, None),
    (4, 4, 2, 12, 32, None),          # 32 source ports miss one of 4 spines for some of 48 pairs (2 %)
    (4, 4, 2, 12, 64, 1 + 4 * 6),     # ... 64 do not
])
def test_expected_paths_for_any_spine_count(spines, leaves, hpl, peers_random, sports, want):
    spec = Spec(spines=spines, leaves=leaves, hosts_per_leaf=hpl)
    assert expected_paths(spec, peers_random, sports) == want


def _result(kind, detected, latency=None, resolved=None, wrong=(), percent=None, ambiguous=False):
    return {"kind": kind, "detected": detected, "latency_s": latency, "resolved_s": resolved, "wrong": list(wrong),
            "opts": {"percent": percent} if percent else {}, "ambiguous": ambiguous}


def test_the_table_covers_every_kind_run_and_names_the_shape():
    results = [_result("switch-down", True, 0.8, 12.0), _result("switch-down", True, 1.4, 14.0,
                                                                 wrong=["link_down leaf2:swp3--spine1:swp2"]),
               _result("loss-0.1", False), _result("loss-0.1", True, 71.0, 55.0),
               _result("loss", True, 2.5, 6.0, percent=1.0), _result("blackhole", True, 5.5, 6.0, ambiguous=True)]
    lines = summary(results, ["switch-down", "loss-0.1", "loss", "blackhole", "mtu"],
                                   "3 spines x 4 leaves x 2 hosts per leaf, 8 hosts", 2, 60.0, ["congestion x"])
    assert lines[0].startswith("correlator on the lab (3 spines x 4 leaves x 2 hosts per leaf, 8 hosts;")
    assert lines[1] == "  soak 60 s: 1 false incidents ['congestion x']"
    assert lines[2].split() == ["fault", "recall", "precision", "p50", "s", "p99", "s", "max", "s",
                                "resolve", "p50", "s", "resolve", "max", "s", "ambiguous"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:-1]}
    assert rows["switch-down"] == ["100%", "67%", "0.80", "1.40", "1.40", "12.0", "14.0", "0"]
    assert rows["loss-0.1"] == ["50%", "100%", "71.00", "71.00", "71.00", "55.0", "55.0", "0"]
    assert rows["blackhole"][-1] == "1"
    assert "mtu" not in rows  # not run
    assert lines[-1] == "  loss 1%: 1 detected, p50 2.50 s, max 2.50 s"


@pytest.mark.parametrize("element, alternatives, named", [
    ("leaf3:swp4--spine2:swp3", [], False),
    ("leaf3:swp4--spine2:swp3", ["spine2:swp3->leaf3:swp4"], True),
    ("leaf3:swp4--spine2:swp3", ["leaf3:swp4->spine2:swp3", "leaf2:swp4->spine2:swp2"], True),
    ("leaf3:swp4--spine2:swp3", ["leaf2:swp4->spine2:swp2"], False),
])
def test_a_partial_blackhole_may_name_the_faulted_link_among_its_alternatives(element, alternatives, named):
    evidence = {"alternatives": alternatives} if alternatives else {}
    incident = {"element": "leaf1:swp4--spine2:swp1", "evidence": evidence}
    assert trials._names(incident, element) is named
    assert trials._names({"element": element, "evidence": {}}, element)
