"""How a fabric is split for sharded correlation, who owns each partition, which partitions a record
concerns (routing) and which one partition owns a finding's element (nms/app/correlate_partitions.py),
on the synthetic fabric the correlator tests use (2 spines, 3 leaves, 6 hosts: tests/_fabric_synth.py;
its records are made by the same record models the agents send) and on a rail-attached host."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nms.app.correlate_partitions import CORE, WHOLE, Split, owned, owned_findings, partitions, partitions_of
from nms.config.models import CorrelateFeedConfig, FabricConfig
from nms.records import ClockEdge, Finding, GenericPoint, HostNicSample, PortSample, ProbeWindow
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
        CorrelateFeedConfig.model_validate({"partitions": "rack"})
    with pytest.raises(ValueError, match="cluster.correlate.partitions"):
        partitions(FabricConfig(), "rack")


def three_tier() -> FabricConfig:
    """2 pods (2 leaves and 2 spines each, every leaf to both its spines), 2 superspines (every
    spine to both), a host on each leaf."""
    switches, links = [], []
    for s in ("ss1", "ss2"):
        switches.append({"name": s, "mgmt_address": "192.0.2.1", "role": "superspine"})
    for p in (1, 2):
        for s in (1, 2):
            switches.append({"name": f"p{p}s{s}", "mgmt_address": "192.0.2.1", "role": "spine"})
            links += [{"a": f"p{p}s{s}:up{u}", "b": f"ss{u}:p{p}s{s}"} for u in (1, 2)]
            for leaf in (1, 2):
                links.append({"a": f"p{p}l{leaf}:up{s}", "b": f"p{p}s{s}:l{leaf}"})
        for leaf in (1, 2):
            switches.append({"name": f"p{p}l{leaf}", "mgmt_address": "192.0.2.1", "role": "leaf"})
    hosts = [{"name": f"h{p}{leaf}",
              "nics": [{"name": "eth0", "address": f"10.{p}.{leaf}.1", "switch": f"p{p}l{leaf}"}]}
             for p in (1, 2) for leaf in (1, 2)]
    return FabricConfig.model_validate({"switches": switches, "hosts": hosts, "links": links})


def test_pod_split_keeps_each_pods_leaves_spines_and_hosts_together_and_superspines_in_core():
    fabric = three_tier()
    assert partitions(fabric, "pod") == {"pod:p1l1": {"p1l1", "p1l2", "p1s1", "p1s2", "h11", "h12"},
                                         "pod:p2l1": {"p2l1", "p2l2", "p2s1", "p2s2", "h21", "h22"},
                                         "core": {"ss1", "ss2"}}
    split = Split(fabric, "pod")
    window = ProbeWindow(src_host="h11", src_nic="eth0", dst_host="h12", dst_nic="eth0", path_id="0",
                         window_start=1, sent=10, received=10)
    assert split.of_record("probe_windows", window) == {"pod:p1l1"}  # within a pod: no superspine
    across = window.model_copy(update={"dst_host": "h21"})
    assert split.of_record("probe_windows", across) == {"pod:p1l1", "pod:p2l1", "core"}
    owners = {e: split.owner(k, e) for k, e in [("link", "p1l2:up1--p1s1:l2"), ("link", "p2s2:up1--ss1:p2s2"),
                                                ("device", "p1s2"), ("device", "ss2"), ("nic", "h22:eth0"),
                                                ("link", "h11:eth0--p1l1:swp1")]}
    assert owners == {"p1l2:up1--p1s1:l2": "pod:p1l1", "p2s2:up1--ss1:p2s2": "pod:p2l1", "p1s2": "pod:p1l1",
                      "ss2": "core", "h22:eth0": "pod:p2l1", "h11:eth0--p1l1:swp1": "pod:p1l1"}
    # a 2-tier fabric is one pod (with nothing in core)
    flat = partitions(Synth().fabric, "pod")
    assert len(flat) == 2 and flat["core"] == set()


RAILS = FabricConfig.model_validate({
    "switches": [{"name": "r0", "mgmt_address": "192.0.2.1", "role": "leaf"},
                 {"name": "r1", "mgmt_address": "192.0.2.2", "role": "leaf"},
                 {"name": "sp:1", "mgmt_address": "192.0.2.3", "role": "spine"}],
    "hosts": [{"name": f"gpu{i}", "nics": [{"name": "mlx5_0", "address": f"10.0.0.{i}", "switch": "r0"},
                                            {"name": "mlx5_1", "address": f"10.0.1.{i}", "switch": "r1"}]}
              for i in (1, 2)]})


def _window(synth: Synth, src: str, dst: str):
    return next(w for w in synth.windows(1_700_000_000) if w.src_host == src and w.dst_host == dst)


def test_a_probe_window_concerns_its_ends_leaves_and_core_when_they_differ():
    synth = Synth()
    split = Split(synth.fabric, "leaf")
    # host1, host2 on leaf1; host3 on leaf2
    assert split.of_record("probe_windows", _window(synth, "host1", "host2")) == {"leaf:leaf1"}
    assert split.of_record("probe_windows", _window(synth, "host1", "host3")) == {"leaf:leaf1", "leaf:leaf2", CORE}
    paths = [r for r in synth.inventory_records(1_700_000_000) if r.measurement == "probe_path"]
    p = next(r for r in paths if r.src_host == "host3" and r.dst_host == "host5")
    assert split.of_record("probe_paths", p) == {"leaf:leaf2", "leaf:leaf3", CORE}
    # a rail-attached host: by the NIC the window left from and arrived at, not every rail of the host
    rails = Split(RAILS, "leaf")
    w = _window(synth, "host1", "host3").model_copy(update={"src_host": "gpu1", "src_nic": "mlx5_1",
                                                             "dst_host": "gpu2", "dst_nic": "mlx5_1"})
    assert rails.of_record("probe_windows", w) == {"leaf:r1"}
    w = w.model_copy(update={"dst_nic": "mlx5_0"})
    assert rails.of_record("probe_windows", w) == {"leaf:r0", "leaf:r1", CORE}
    # a host the inventory does not know: every member takes it (correlated twice rather than by no one)
    assert split.of_record("probe_windows", w.model_copy(update={"src_host": "stranger"})) is None


def test_switch_host_clock_and_generic_records_are_routed_by_what_they_name():
    split = Split(Synth().fabric, "leaf")
    t = 1_700_000_000 * 10**9
    # a switch's ports end links of several partitions (spine1:swp2 is leaf2's uplink's far end): every member
    for device in ("leaf2", "spine1", "unknown"):
        assert split.of_record("port_samples", PortSample(device=device, port="swp1", ts=t)) is None
    assert split.of_record("link_events", PortSample(device="spine1", port="swp1", ts=t)) is None
    assert split.of_record("host_nic_samples", HostNicSample(host="host5", nic="eth0", ts=t)) == {"leaf:leaf3"}
    point = GenericPoint(measurement="gpu", tags={"host": "host4"}, fields={"util": 1.0}, ts=t)
    assert split.of_record("points", point) == {"leaf:leaf2"}
    point = GenericPoint(measurement="x", tags={"device": "spine2"}, fields={"v": 1.0}, ts=t)
    assert split.of_record("points", point) == {CORE}
    assert split.of_record("points", GenericPoint(measurement="x", tags={}, fields={"v": 1.0}, ts=t)) is None
    edge = ClockEdge.model_validate({"host_a": "host1", "host_b": "host3", "window_start": t, "window_s": 2.0,
                                     "offset_ns": 0.0, "drift_ppb": 0.0, "bound_ns": 100.0, "pure_pairs": 10,
                                     "method": "svm"})
    assert split.of_record("clock_edges", edge) is None  # the clock solve is one graph: every member
    whole = Split(Synth().fabric, "fabric")  # one partition: its owner takes everything
    assert whole.of_record("clock_edges", edge) == {WHOLE}
    assert whole.of_record("port_samples", PortSample(device="spine1", port="swp1", ts=t)) == {WHOLE}


def test_each_element_has_one_owning_partition():
    split = Split(Synth().fabric, "leaf")
    assert split.owner("link", "leaf2:swp3--spine1:swp2") == "leaf:leaf2"  # leaf-spine: the leaf's
    assert split.owner("link", "spine1:swp2--leaf2:swp3") == "leaf:leaf2"
    assert split.owner("link", "host3:eth0--leaf2:swp1") == "leaf:leaf2"  # access link
    assert split.owner("nic", "host5:eth0") == "leaf:leaf3"
    assert split.owner("device", "leaf1") == "leaf:leaf1"
    assert split.owner("device", "spine2") == CORE
    assert split.owner("host", "host2") == "leaf:leaf1"
    for kind, element in [("link", "spine1:swp9--superspine1:swp1"), ("job", "job-7"), ("host_pair", "host1--host3"),
                          ("role", "spine"), ("device", "not-in-inventory")]:
        assert split.owner(kind, element) == CORE, (kind, element)
    rails = Split(RAILS, "leaf")
    assert rails.owner("link", "r1:swp1--sp:1:swp2") == "leaf:r1"  # a device name with ':' in it
    assert rails.owner("link", "sp:1:swp1--sp:1:swp2") == CORE
    assert rails.owner("nic", "gpu1:mlx5_1") == "leaf:r1"
    assert rails.owner("host", "gpu1") == "leaf:r0"  # a host on two rails: the first leaf by name
    assert Split(Synth().fabric, "fabric").owner("device", "spine1") == WHOLE


def _finding(element: str, element_kind: str, kind: str = "link_down", explains: tuple[str, ...] = ()) -> Finding:
    return Finding(kind=kind, element=element, element_kind=element_kind, ts=1, confidence=0.9, severity="critical",
                   summary="s", explains=list(explains))


def test_a_member_keeps_the_findings_of_its_partitions_and_a_parent_keeps_its_children():
    split = Split(Synth().fabric, "leaf")
    leaf_link = _finding("leaf2:swp3--spine1:swp2", "link")
    nic = _finding("host1:eth0", "nic", "nic_down")
    findings = [leaf_link, nic, _finding("spine2", "device", "device_down")]
    assert owned_findings(findings, split.owner, {"leaf:leaf2"}) == [leaf_link]
    assert owned_findings(findings, split.owner, {"leaf:leaf1", CORE}) == [nic, findings[2]]
    assert owned_findings(findings, split.owner, set()) == []
    # a dead spine explains its links: they go with the spine's owner, not their leaves'
    child = _finding("leaf1:swp3--spine1:swp1", "link")
    spine = _finding("spine1", "device", "device_down", explains=(child.dedup_key,))
    assert owned_findings([spine, child], split.owner, {CORE}) == [spine, child]
    assert owned_findings([spine, child], split.owner, {"leaf:leaf1"}) == []
    assert owned_findings([child], split.owner, {"leaf:leaf1"}) == [child]  # no parent seen here: its own


def test_replay_and_heartbeat_are_validated_naming_the_field():
    assert CorrelateFeedConfig().replay == 150.0 and CorrelateFeedConfig().heartbeat == 2.0
    assert CorrelateFeedConfig.model_validate({"replay": "5m", "heartbeat": "1s"}).replay == 300.0
    for bad in ({"replay": "0s"}, {"replay": "2d"}, {"heartbeat": "0.1s"}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            CorrelateFeedConfig.model_validate(bad)
