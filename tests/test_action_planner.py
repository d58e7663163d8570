"""The action planner (correlator/actions/planner.py): which actions each incident kind gets, and the
blast-radius limits through correlator.actions.steering."""

from __future__ import annotations

from _act_fabric import addresses, incident, topology, uplink

from correlator.actions.planner import avoid_hops, host_pairs, job_peers, plan
from correlator.actions.steering import Limits
from nms.records import Job, RankPlacement


def test_congestion_reroutes_every_host_whose_flows_may_cross_the_link():
    # the probes saw h1 <-> h3 only; h2's and h4's flows hash over the same uplink too. No direction
    # known: both directions' flows move (h1 -> h3 leaves leaf1 by up1; h3 -> h1 comes back over
    # spine1 -> leaf1 on the same cable)
    p = plan(incident("congestion"), topology(4), addresses(4))
    assert [x.kind for x in p.proposals] == ["host_reroute"]
    (reroute,) = p.proposals
    assert reroute.targets == ["h1", "h2", "h3", "h4"]
    assert reroute.params["dsts"] == {"h1": ["h3", "h4"], "h2": ["h3", "h4"], "h3": ["h1", "h2"], "h4": ["h1", "h2"]}
    # spine1 answers from its leaf1 port (h1 -> h3), leaf1 from up1 (h3 -> h1)
    assert reroute.params["avoid_hops"] == ["10.1.1.0", "10.1.1.1"]
    assert reroute.params["dport"] == 4791 and reroute.params["proto"] == "udp"
    assert "incident 7" in reroute.reason
    # the movers behind one leaf share its uplinks: one stripe each (rank, movers)
    assert reroute.params["stripe"] == {"h1": [0, 2], "h2": [1, 2], "h3": [0, 2], "h4": [1, 2]}


def test_a_reroute_in_a_known_direction_moves_the_flows_that_go_that_way():
    # a congested link takes some of its probe paths down for a while: the incident may list
    # h1 -> h3 only, while h2's flows cross the same uplink the same way
    up = "leaf1:up1->spine1:leaf1"
    p = plan(incident("congestion", direction=up), topology(4), addresses(4))
    [reroute] = p.proposals
    assert reroute.params["dsts"] == {"h1": ["h3", "h4"], "h2": ["h3", "h4"]}
    down = plan(incident("congestion", direction="spine1:leaf1->leaf1:up1"), topology(4), addresses(4))
    assert down.proposals[0].params["dsts"] == {"h3": ["h1", "h2"], "h4": ["h1", "h2"]}
    both = plan(incident("congestion", direction=up, evidence={"also_direction": "spine1:leaf1->leaf1:up1"}),
                topology(4), addresses(4))
    assert both.proposals[0].targets == ["h1", "h2", "h3", "h4"]


def test_a_host_in_a_running_job_steers_only_its_flows_to_its_job_peers():
    # h1 and h3 run a job together, h2 and h4 another (their ranks' peers known: h2 only sends to
    # h4's rank); h1 -> h4 carries no job traffic, so it is not steered, nor is h3 -> h2
    jobs = [Job(id="a", hosts=["h1", "h3"], start=1),
            Job(id="b", hosts=["h2", "h4"], start=1,
                ranks=[RankPlacement(rank=0, host="h2", peers=[1]), RankPlacement(rank=1, host="h4", peers=[0])])]
    peers = job_peers(jobs)
    assert peers == {"h1": {"h3"}, "h3": {"h1"}, "h2": {"h4"}, "h4": {"h2"}}
    [reroute] = plan(incident("congestion"), topology(4), addresses(4), peers=lambda: peers).proposals
    assert reroute.params["dsts"] == {"h1": ["h3"], "h2": ["h4"], "h3": ["h1"], "h4": ["h2"]}
    # a host in no job keeps every pair; no jobs: as before
    [reroute] = plan(incident("congestion"), topology(4), addresses(4), peers=lambda: job_peers(jobs[:1])).proposals
    assert reroute.params["dsts"] == {"h1": ["h3"], "h2": ["h3", "h4"], "h3": ["h1"], "h4": ["h1", "h2"]}
    assert job_peers([]) == {}


def test_path_imbalance_reroutes_too():
    p = plan(incident("path_imbalance"), topology(4), addresses(4))
    assert [x.kind for x in p.proposals] == ["host_reroute"]


def test_corrupting_and_flapping_links_are_drained_and_rerouted():
    for kind in ("corrupting_link", "link_flapping"):
        p = plan(incident(kind), topology(4), addresses(4))
        assert [x.kind for x in p.proposals] == ["drain_link", "host_reroute"], kind
        drain = p.proposals[0]
        assert drain.targets == ["leaf1"]  # drained where it is an uplink; the spine has one way down
        assert drain.params["ports"] == {"leaf1": "up1"}


def test_a_flapping_link_caught_down_is_still_drained():
    # the topology is refreshed every few seconds: half the time it catches a flapping link down
    topo = topology(4)
    topo = topo.model_copy(
        update={
            "links": [
                x.model_copy(update={"state": "down"}) if f"{x.a}--{x.b}" == uplink("leaf1", 1) else x
                for x in topo.links
            ]
        }
    )
    p = plan(incident("link_flapping"), topo, addresses(4))
    assert [x.kind for x in p.proposals] == ["drain_link", "host_reroute"], p.notes


def test_a_reroute_carries_the_loads_of_the_links_it_may_move_onto():
    loads = {("spine2", "leaf2"): 0.8, ("spine3", "leaf2"): 0.1, ("leaf2", "up2"): 0.3, ("leaf9", "up1"): 0.5}
    p = plan(incident("congestion"), topology(4), addresses(4), port_loads=loads)
    [reroute] = p.proposals
    # each hop address stands for the link into it: spine2's port to leaf2 is 10.2.2.0 (_act_fabric)
    assert reroute.params["hop_loads"] == {"10.2.2.0": 0.8, "10.2.3.0": 0.1, "10.2.2.1": 0.3}
    assert plan(incident("congestion"), topology(4), addresses(4)).proposals[0].params["hop_loads"] == {}


def test_link_down_needs_evidence_that_traffic_still_goes_there():
    down = plan(incident("link_down", evidence={"paths_down": 4, "oper": "down"}), topology(4), addresses(4))
    assert down.proposals == [] and "routing already avoids it" in down.notes[0]
    gray = plan(incident("link_down", evidence={"paths_down": 4, "oper": "up"}), topology(4), addresses(4))
    assert [x.kind for x in gray.proposals] == ["host_reroute"]


def test_other_elements_and_kinds_get_nothing_with_a_reason():
    nic = incident("nic_down", element="h1:eth0", element_kind="nic")
    p = plan(nic, topology(), addresses())
    assert p.proposals == [] and "nic" in p.notes[0]
    p = plan(incident("mtu_mismatch"), topology(), addresses())
    assert p.proposals == [] and "mtu_mismatch" in p.notes[0]


def test_the_last_path_is_never_taken():
    # one spine: every h1 <-> h3 path crosses leaf1's only uplink
    p = plan(incident("congestion", element=uplink("leaf1", 1)), topology(1), addresses(1))
    assert p.proposals == []
    assert uplink("leaf1", 1) in p.refused and "would keep 0 of 1 paths" in p.refused[uplink("leaf1", 1)]


def test_blast_radius_fraction_of_a_leafs_uplinks():
    limits = Limits(max_drain_fraction=0.5, min_paths=1)
    # 2 spines: one uplink is half the paths: allowed; a second one beside it is not
    first = plan(incident("congestion", element=uplink("leaf1", 1)), topology(2), addresses(2), limits)
    assert [x.kind for x in first.proposals] == ["host_reroute"]
    second = plan(incident("congestion", element=uplink("leaf1", 2)), topology(2), addresses(2), limits,
                  avoided={uplink("leaf1", 1): {"host_reroute"}})
    assert second.proposals == [] and "would keep 0 of 2 paths" in second.refused[uplink("leaf1", 2)]
    # 4 spines, a 25 % limit: the first uplink fits, the second does not
    quarter = Limits(max_drain_fraction=0.25)
    ok = plan(incident("congestion", element=uplink("leaf1", 2)), topology(4), addresses(4), quarter)
    assert ok.proposals
    no = plan(incident("congestion", element=uplink("leaf1", 2)), topology(4), addresses(4), quarter,
              avoided={uplink("leaf1", 1): {"host_reroute"}})
    assert not no.proposals and "max 25%" in no.refused[uplink("leaf1", 2)]


def test_a_drain_counts_every_host_pair_not_only_the_probed_ones():
    # h2 -> h4 was not probed, but a drain moves its traffic too: with 2 spines and a 40 % limit
    # draining one of leaf1's two uplinks takes 50 % of every pair's paths
    limits = Limits(max_drain_fraction=0.4)
    p = plan(incident("corrupting_link"), topology(2), addresses(2), limits)
    assert p.proposals == [] and uplink("leaf1", 1) in p.refused


def test_an_element_already_avoided_gets_nothing_new_but_a_drain_may_join_a_reroute():
    rerouted = {uplink("leaf1", 1): {"host_reroute"}}
    p = plan(incident("congestion"), topology(4), addresses(4), avoided=rerouted)
    assert p.proposals == [] and "avoided already" in p.notes[0]
    # a congestion that turns out a flapping link: the drain joins the reroute already steering off it
    p = plan(incident("link_flapping"), topology(4), addresses(4), avoided=rerouted)
    assert [x.kind for x in p.proposals] == ["drain_link"], p.notes


def test_no_addresses_no_reroute():
    p = plan(incident("congestion"), topology(4), [])
    assert p.proposals == [] and "no interface address" in p.notes[0]


def test_helpers():
    assert host_pairs(["h1:eth0>h3:eth1/2", "h1:eth0>h4:eth0/0", "junk"]) == {"h1": {"h3", "h4"}}
    assert avoid_hops("h1:eth0--leaf1:h1", topology(), addresses()) == []  # leaf1:h1 has no address


def test_moved_to_and_worse():
    from correlator.actions.planner import evidence_level, worse
    p = plan(incident("congestion"), topology(2), addresses(2))
    # h1 <-> h3 avoiding leaf1-spine1 uses spine2's links; access links are common to every path
    assert p.proposals[0].params["moved_to"] == [uplink("leaf1", 2), uplink("leaf2", 2)]
    inc = incident(evidence={"loss": {"loss_pct": 2.0}, "delay": {"inflation_us": 80.0}})
    assert evidence_level(inc) == {"loss_pct": 2.0, "inflation_us": 80.0}
    assert worse({"loss_pct": 2.0}, {"loss_pct": 2.9}, 1.5) is None
    assert "loss_pct rose from 2 to 3" in worse({"loss_pct": 2.0}, {"loss_pct": 3.0}, 1.5)
