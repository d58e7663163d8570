"""How a fabric is split for sharded correlation and who owns each partition
(nms/app/correlate_partitions.py), on the synthetic fabric the correlator tests use (2 spines,
3 leaves, 6 hosts: tests/_fabric_synth.py) and on a rail-attached host."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nms.app.correlate_partitions import CORE, WHOLE, owned, partitions, partitions_of
from nms.config.models import CorrelateFeedConfig, FabricConfig
from tests._fabric_synth import Synth


def test_whole_fabric_is_one_partition_owned_by_the_only_member():
    fabric = Synth().fabric
    parts = partitions(fabric, "fabric")
    assert list(parts) == [WHOLE]
    assert parts[WHOLE] == {s.name for s in fabric.switches} | {h.name for h in fabric.hosts}
    assert owned(parts, (), "corr-a") == {WHOLE}


def test_leaf_split_puts_each_host_with_its_leaves_and_the_spines_in_core():
    fabric = Synth().fabric
    parts = partitions(fabric, "leaf")
    assert set(parts) == {"leaf:leaf1", "leaf:leaf2", "leaf:leaf3", CORE}
    assert parts[CORE] == {"spine1", "spine2"}
    for host in fabric.hosts:
        for nic in host.nics:
            assert host.name in parts[f"leaf:{nic.switch}"]
    every = set().union(*parts.values())
    assert every == {s.name for s in fabric.switches} | {h.name for h in fabric.hosts}
    # a path host1 -> leaf1 -> spine1 -> leaf2 -> host concerns three partitions
    h1 = next(h.name for h in fabric.hosts if h.nics[0].switch == "leaf1")
    h2 = next(h.name for h in fabric.hosts if h.nics[0].switch == "leaf2")
    assert partitions_of(parts, [h1, "leaf1", "spine1", "leaf2", h2]) == {"leaf:leaf1", CORE, "leaf:leaf2"}


def test_a_host_on_two_rails_is_in_both_leaves_partitions():
    fabric = FabricConfig.model_validate({
        "switches": [{"name": n, "mgmt_address": f"192.0.2.{i}", "role": "leaf"} for i, n in enumerate(("r0", "r1"))],
        "hosts": [{"name": "gpu1", "nics": [{"name": "mlx5_0", "address": "10.0.0.1", "switch": "r0"},
                                            {"name": "mlx5_1", "address": "10.0.1.1", "switch": "r1"}]}]})
    parts = partitions(fabric, "leaf")
    assert parts == {"leaf:r0": {"r0", "gpu1"}, "leaf:r1": {"r1", "gpu1"}, CORE: set()}


def test_ownership_splits_partitions_over_members_and_a_leaving_member_moves_only_its_own():
    parts = {f"leaf:leaf{i:02d}": set() for i in range(40)} | {CORE: set()}
    members = ("corr-a", "corr-b", "corr-c")
    shares = {m: owned(parts, members, m) for m in members}
    assert set().union(*shares.values()) == set(parts)
    assert sum(len(s) for s in shares.values()) == len(parts)  # disjoint
    assert all(shares.values())
    after = {m: owned(parts, ("corr-a", "corr-b"), m) for m in ("corr-a", "corr-b")}
    for m in ("corr-a", "corr-b"):
        assert shares[m] <= after[m]  # kept what it had
    assert after["corr-a"] | after["corr-b"] == set(parts)


def test_unknown_split_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="partitions"):
        CorrelateFeedConfig.model_validate({"partitions": "pod"})
    with pytest.raises(ValueError, match="cluster.correlate.partitions"):
        partitions(FabricConfig(), "pod")
