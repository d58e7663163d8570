"""The lab's partial-blackhole fault (lab/faults.py `blackhole`): its parameters, ground truth and
nftables rule, computed without a lab (the rule ran on the real lab: docs/correlator.md)."""

from __future__ import annotations

import pytest

from lab import faults
from lab.sh import LabError
from lab.topology import Spec, plan

TOPO = plan(Spec(spines=2, leaves=3, hosts_per_leaf=2, mgmt_subnet="198.18.99.0/24", prefix="nmsz-"))


def test_from_the_spine_drops_at_the_leaf_port_by_source_address_and_port():
    link = TOPO.find_link("leaf2-spine1")
    params, claims = faults.make_params(TOPO, "blackhole", "leaf2-spine1",
                                        {"fraction": 0.5, "from_node": "spine1", "seed": 7})
    leaf_end = link.end("leaf2")
    assert params["direction"] == "spine1->leaf2" and params["dropped_at"] == str(leaf_end)
    assert (params["fraction"], params["by"], params["seed"]) == (0.5, "flow", 7)
    assert claims == [f"blackhole:{link.name}:leaf2"]
    rules = faults.blackhole_ruleset("nmslab_f3", leaf_end.name, params)
    assert "table netdev nmslab_f3 {" in rules
    assert f'hook ingress device "{leaf_end.name}"' in rules
    assert "meta protocol ip meta l4proto udp jhash ip saddr . udp sport mod 10000 seed 0x7 < 5000 counter drop" \
        in rules


def test_by_destination_and_defaults():
    params, _ = faults.make_params(TOPO, "blackhole", "leaf1-spine2", {"by": "dst", "fraction": 0.25})
    assert params["direction"] == "leaf1->spine2"  # the first node of the target sends, as for loss
    assert 0 <= params["seed"] < 2**32  # random, and recorded: the ground truth says which flows die
    rules = faults.blackhole_ruleset("t", "swp1", params)
    assert "meta protocol ip jhash ip daddr mod 10000" in rules and "< 2500 counter drop" in rules
    assert "l4proto" not in rules  # a destination's every packet


@pytest.mark.parametrize("opts, error", [
    ({"fraction": 1.0}, "--fraction must be within (0, 1)"),
    ({"fraction": 0.0}, "--fraction must be within (0, 1)"),
    ({"by": "port"}, "--by must be one of flow, dst"),
    ({"from_node": "leaf3"}, "leaf3 is not an end of"),
    ({"seed": -1}, "--seed must be within"),
    ({"percent": 5.0}, "blackhole does not take --percent"),
])
def test_bad_options_are_refused_naming_the_option(opts, error):
    with pytest.raises(LabError, match=error.replace("(", r"\(").replace(")", r"\)")):
        faults.make_params(TOPO, "blackhole", "leaf2-spine1", opts)
