"""The agent's steering table and steer arguments (hostprobe/steer.py); the traces and the traffic
moving are exercised on the lab (tests/lab/test_actions_lab.py)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from hostprobe.config import SteeringSettings
from hostprobe.steer import SteerError, Steering, live_routes, parse_steer, read_table
from lab.jobtraffic import steered_ports

GOOD = {"action_id": 3, "element": "leaf1:swp1--spine1:swp1", "avoid_hops": ["198.19.0.1"], "dsts": ["host3"],
        "proto": "udp", "dport": 4791}


def test_parse_steer_names_the_bad_field():
    later = time.time_ns() + 10**10
    assert parse_steer({**GOOD, "expires_ns": later})["avoid_hops"] == {"198.19.0.1"}
    for bad, field in [({"avoid_hops": []}, "avoid_hops"), ({"dsts": "host3"}, "dsts"), ({"proto": "tcp"}, "proto"),
                       ({"dport": 0}, "dport"), ({"action_id": True}, "action_id"),
                       ({"expires_ns": 5}, "expires_ns"), ({"rank": 2, "movers": 2}, "rank"),
                       ({"movers": 0}, "movers"), ({"routes": {"host3": [[]]}}, "routes"),
                       ({"routes": {"host3": ["10.1.0.1"]}}, "routes")]:
        with pytest.raises(SteerError, match=field):
            parse_steer({**GOOD, "expires_ns": later, **bad})


def test_unsteer_removes_only_its_action_and_expired_entries_are_ignored(tmp_path):
    path = tmp_path / "steering.json"
    now = time.time_ns()
    path.write_text(json.dumps({"version": 4, "updated_ns": 1, "routes": {
        "198.19.2.1": {"ports": [49153, 49160], "action_ids": [3, 5], "expires_ns": now + 10**11},
        "198.19.2.2": {"ports": [49154], "action_ids": [3], "expires_ns": now + 10**11},
        "198.19.2.3": {"ports": [49155], "action_ids": [9], "expires_ns": now - 1}}}))
    assert live_routes(read_table(path)) == {"198.19.2.1": [49153, 49160], "198.19.2.2": [49154]}
    assert steered_ports(path) == live_routes(read_table(path))  # the generator reads it the same way
    s = Steering(SteeringSettings(), path, b"k" * 16, 1, 8, 100.0, lambda: 1)
    status, message = s.unsteer({"action_id": 3})
    table = read_table(path)
    assert status == "done" and "2 destination" in message
    assert table["version"] == 5 and list(table["routes"]) == ["198.19.2.1"]  # expired one dropped too
    assert table["routes"]["198.19.2.1"]["action_ids"] == [5]
    assert not list(tmp_path.glob(".steering-*"))  # no temporary file left behind


def test_a_malformed_table_steers_nothing(tmp_path):
    path = tmp_path / "steering.json"
    path.write_text("{not json")
    assert steered_ports(path) == {}
    path.write_text(json.dumps({"routes": {"198.19.2.1": {"ports": ["x"]}, "198.19.2.2": {"ports": [5]}}}))
    assert steered_ports(path) == {"198.19.2.2": [5]}
    assert steered_ports(tmp_path / "missing.json") == {}


def test_steer_refuses_unknown_peers_before_tracing(tmp_path):
    s = Steering(SteeringSettings(), tmp_path / "t.json", b"k" * 16, 1, 8, 100.0, lambda: 1)
    with pytest.raises(SteerError, match="not peers of this agent: host3"):
        s.start_steer({**GOOD, "expires_ns": time.time_ns() + 10**10}, {}, lambda *a: None)
    assert not (tmp_path / "t.json").exists()


def test_steering_settings_are_checked():
    with pytest.raises(ValueError, match="ports_per_dst"):
        SteeringSettings(candidates=2, ports_per_dst=3)
    with pytest.raises(ValueError, match="65535"):
        SteeringSettings(port_base=65530, candidates=16)
    assert SimpleNamespace(**SteeringSettings().model_dump()).candidates == 16


class MappedSteering(Steering):
    """Real Steering with canned traces: port p crosses spine1's address when p is odd."""

    def __init__(self, tmp_path, spines: int = 2, **settings):
        super().__init__(SteeringSettings(candidates=8, ports_per_dst=2, **settings), tmp_path / "steering.json",
                         b"k" * 16, 1, 8, 100.0, lambda: 1)
        self.traced: list[tuple[str, int]] = []
        self.silent: set[int] = set()
        self.spines = spines  # port p crosses spine address 10.<p % spines + 1>.0.1

    def _trace(self, pairs, dport, base):
        self.traced += [(p.addr, dport) for _, p in pairs]
        return {(p.local, p.addr): [(port, None if port in self.silent else
                                     ["10.0.0.1", f"10.{(port - 1) % self.spines + 1}.0.1", "10.9.0.1"])
                                    for port in range(base, base + self.settings.candidates)] for _, p in pairs}


def _steer_now(s: Steering, peers: dict) -> dict:
    done = []
    s.start_steer({**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10}, peers,
                  lambda *a: done.append(a))
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done and done[0][0] == "done", done
    return done[0][2]


def test_the_port_map_answers_a_steer_without_tracing_until_routing_changes(tmp_path):
    from hostprobe.steer import Peer
    s = MappedSteering(tmp_path)
    peer = Peer("198.19.1.1", "198.19.2.1", routers=3, paths=frozenset({"p1", "p2"}))
    peers = {"host3": [peer], "host4": [Peer("198.19.1.1", "198.19.2.2")]}  # host4: routers unknown yet
    assert s.warm(peers) == 1  # host4 waits until the prober knows its paths
    deadline = time.monotonic() + 5
    while s._warming and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.traced == [("198.19.2.1", 4791)] and s.map_size(peers) == 1
    assert s.warm(peers) == 0  # fresh: nothing due
    details = _steer_now(s, {"host3": [peer]})
    assert s.traced == [("198.19.2.1", 4791)]  # answered from the map
    assert details["dsts"]["host3"] == {"ports": [49152, 49154], "candidates": 8, "kept": 4,
                                       "planned": 0}
    assert live_routes(read_table(s.path)) == {"198.19.2.1": [49152, 49154]}
    moved = Peer(peer.local, peer.addr, 3, frozenset({"p1", "p3"}))  # the prober saw the paths change
    assert s.fresh(moved, 4791) is None and s.map_size({"host3": [moved]}) == 0
    _steer_now(s, {"host3": [moved]})
    assert s.traced[-1] == ("198.19.2.1", 4791)  # traced live
    s.silent = {49153}  # a trace through a fault: used for this steer, never mapped
    stale = Peer(peer.local, peer.addr, 3, frozenset({"p9"}))
    _steer_now(s, {"host3": [stale]})
    assert s.fresh(stale, 4791) is None


def test_the_port_map_goes_stale_after_warm_every(tmp_path):
    from hostprobe.steer import Peer
    s = MappedSteering(tmp_path, warm_every=0.2)
    peer = Peer("198.19.1.1", "198.19.2.1", routers=3)
    s.trace([("host3", peer)], 4791)
    assert s.fresh(peer, 4791) is not None and s.fresh(peer, 4792) is None  # per dport
    time.sleep(0.25)
    assert s.fresh(peer, 4791) is None
    off = MappedSteering(tmp_path, warm_every=0)
    assert off.warm({"host3": [peer]}) == 0 and off.traced == []


def test_a_steer_places_its_ports_where_the_loads_leave_room(tmp_path):
    from hostprobe.steer import Peer
    s = MappedSteering(tmp_path, spines=4)  # spine addresses 10.1-10.4.0.1; 10.1 is avoided
    peer = Peer("198.19.1.1", "198.19.2.1", routers=3)
    done = []
    args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10,
            "hop_loads": {"10.2.0.1": 0.9, "10.3.0.1": 0.2, "10.4.0.1": 0.5}}
    s.start_steer(args, {"host3": [peer]}, lambda *a: done.append(a))
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    ports = done[0][2]["dsts"]["host3"]["ports"]
    # its 2 flows of 0.25 poured onto 0.9, 0.2, 0.5: both on 10.3 (0.7; one on 10.4 would be 0.75)
    assert ports == [49155, 49159]
    with pytest.raises(SteerError, match="hop_loads"):
        parse_steer({**args, "hop_loads": {"10.2.0.1": -1}})
    without = parse_steer({**GOOD, "expires_ns": time.time_ns() + 10**10})
    assert without["hop_loads"] == {}  # older services send none: avoid-only, as before


def _steer_with_loads(s: Steering, hop_loads: dict) -> list[int]:
    from hostprobe.steer import Peer
    done = []
    args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10, "hop_loads": hop_loads}
    s.start_steer(args, {"host3": [Peer("198.19.1.1", "198.19.2.1", routers=3)]}, lambda *a: done.append(a))
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done and done[0][0] == "done", done
    return done[0][2]["dsts"]["host3"]["ports"]


def test_kept_ports_spread_by_load_instead_of_herding_onto_one_spine(tmp_path):
    # spines 10.1-10.4 (port p via 10.<(p - 1) % 4 + 1>); 10.1 avoided. By the busiest hop alone
    # (`choose`, what `port_load: 0` keeps) both kept ports take 10.3 (0.6), which their 2 x 0.25
    # puts at 1.1; poured to one level, one goes to 10.3 and one to 10.4 (0.65), none to 10.2 (0.9)
    s = MappedSteering(tmp_path, spines=4)
    loads = {"10.2.0.1": 0.9, "10.3.0.1": 0.6, "10.4.0.1": 0.65}
    ports = _steer_with_loads(s, loads)
    assert sorted(f"10.{(p - 1) % 4 + 1}.0.1" for p in ports) == ["10.3.0.1", "10.4.0.1"]
    off = MappedSteering(tmp_path, spines=4, port_load=0.0)
    assert _steer_with_loads(off, loads) == [49155, 49159]  # the herd: both on 10.3


def test_a_steer_follows_the_services_planned_routes_where_a_traced_port_takes_them(tmp_path):
    # by the loads alone both ports would take 10.3 (test above: port_load 0 herds there); the
    # service placed every mover's flows and wants one on 10.4 and one on 10.2: the agent keeps a
    # port whose hops hold each route's addresses
    from hostprobe.steer import Peer
    spine = {p: f"10.{(p - 1) % 4 + 1}.0.1" for p in range(49152, 49160)}
    loads = {"10.2.0.1": 0.9, "10.3.0.1": 0.6, "10.4.0.1": 0.65}

    def steer(routes: dict) -> dict:
        done = []
        args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10, "hop_loads": loads,
                "routes": routes}
        s = MappedSteering(tmp_path, spines=4, port_load=0.0)
        s.start_steer(args, {"host3": [Peer("198.19.1.1", "198.19.2.1", routers=3)]}, lambda *a: done.append(a))
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done and done[0][0] == "done", done
        return done[0][2]["dsts"]["host3"]

    got = steer({"host3": [["10.4.0.1", "10.9.0.1"], ["10.2.0.1"]]})
    assert sorted(spine[p] for p in got["ports"]) == ["10.2.0.1", "10.4.0.1"] and got["planned"] == 2
    # two subflows on one route: two distinct ports that take it
    got = steer({"host3": [["10.4.0.1"], ["10.4.0.1"]]})
    assert [spine[p] for p in got["ports"]] == ["10.4.0.1", "10.4.0.1"] and len(set(got["ports"])) == 2
    # a route through the avoided spine, or one no traced port takes, is not followed: the agent
    # places that flow itself (here by the loads: 10.3)
    got = steer({"host3": [["10.1.0.1"], ["10.4.0.1"], ["10.7.0.1"]]})
    assert sorted(spine[p] for p in got["ports"]) == ["10.3.0.1", "10.4.0.1"] and got["planned"] == 1
    assert steer({"host4": [["10.2.0.1"]]})["planned"] == 0  # routes for another peer


def test_a_planned_route_no_candidate_takes_is_searched_for_in_further_blocks_of_ports(tmp_path):
    # 12 spines: the first 8 candidates (49152-49159) reach spines 12, 1-7; the service wants one
    # flow via spine 10 and one via spine 11, which only the next block (49160-49167) reaches
    from hostprobe.steer import Peer
    peer = Peer("198.19.1.1", "198.19.2.1", routers=3, paths=frozenset({"p1"}))

    def steer(s: MappedSteering, routes: list) -> dict:
        done = []
        args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10,
                "routes": {"host3": routes}}
        s.start_steer(args, {"host3": [peer]}, lambda *a: done.append(a))
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done and done[0][0] == "done", done
        return done[0][2]["dsts"]["host3"]

    s = MappedSteering(tmp_path, spines=12)
    got = steer(s, [["10.10.0.1"], ["10.11.0.1"]])
    assert got["planned"] == 2 and got["ports"] == [49162, 49163] and len(s.traced) == 2
    assert len(s.fresh(peer, 4791)) == 16  # the map keeps the second block: the next steer traces nothing
    steer(s, [["10.10.0.1"]])
    assert len(s.traced) == 2
    # a route no port reaches, with blocks 0-1 mapped: blocks 2 and 3 traced (route_search 3), not 1
    # again, and no port comes twice
    got = steer(s, [["10.4.0.1"], ["10.99.0.1"]])
    assert len(s.traced) == 4 and len(s.fresh(peer, 4791)) == 32 and len(set(got["ports"])) == len(got["ports"])
    # a route that no port reaches: 1 + route_search blocks traced, then the flow is placed as usual
    s = MappedSteering(tmp_path, spines=12, route_search=2)
    got = steer(s, [["10.99.0.1"]])
    assert got["planned"] == 0 and len(got["ports"]) == 2 and len(s.traced) == 3
    off = MappedSteering(tmp_path, spines=12, route_search=0)
    assert steer(off, [["10.10.0.1"]])["planned"] == 0 and len(off.traced) == 1
    with pytest.raises(ValueError, match="route_search"):
        SteeringSettings(port_base=65000, candidates=16, route_search=64)


def test_kept_ports_never_take_the_avoided_spine_even_when_all_others_are_full(tmp_path):
    s = MappedSteering(tmp_path, spines=4)
    ports = _steer_with_loads(s, {"10.1.0.1": 0.0, "10.2.0.1": 1.0, "10.3.0.1": 1.0, "10.4.0.1": 1.0})
    assert ports and all((p - 1) % 4 + 1 != 1 for p in ports)
    with pytest.raises(ValueError, match="port_load"):
        SteeringSettings(port_load=-0.1)


def test_the_destinations_of_one_steer_take_the_next_slots(tmp_path):
    # two dsts behind the same uplinks (spines 10.2-10.4 after avoiding 10.1, all at 0.2): the first
    # dst's 2 ports take the stripe's first two routes, the second dst's the next ones, not the
    # same two again
    from hostprobe.steer import Peer
    s = MappedSteering(tmp_path, spines=4)
    done = []
    args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10, "dsts": ["host3", "host4"],
            "hop_loads": {"10.2.0.1": 0.2, "10.3.0.1": 0.2, "10.4.0.1": 0.2}}
    peers = {"host3": [Peer("198.19.1.1", "198.19.2.1", routers=3)],
             "host4": [Peer("198.19.1.1", "198.19.2.2", routers=3)]}
    s.start_steer(args, peers, lambda *a: done.append(a))
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done and done[0][0] == "done", done
    spines = {h: [f"10.{(p - 1) % 4 + 1}.0.1" for p in d["ports"]] for h, d in done[0][2]["dsts"].items()}
    every = spines["host3"] + spines["host4"]
    assert "10.1.0.1" not in every
    assert max(every.count(x) for x in set(every)) <= 2  # 4 ports over 3 spines: 2, 1, 1 (herded: 4 on one)
    assert set(spines["host3"]) != set(spines["host4"]) or len(set(every)) == 3


def test_a_later_steer_to_a_dst_keeps_avoiding_what_the_earlier_one_avoids(tmp_path):
    # a steer replaces a dst's ports: action 4 (off 10.2) must not put host3's flows back on 10.1,
    # which action 3 steers them off; once action 3 is undone, a new steer may use 10.1 again
    from hostprobe.steer import Peer
    s = MappedSteering(tmp_path, spines=4)
    peers = {"host3": [Peer("198.19.1.1", "198.19.2.1", routers=3)]}

    def steer(action_id: int, avoid: str) -> set[str]:
        done = []
        args = {**GOOD, "action_id": action_id, "avoid_hops": [avoid], "expires_ns": time.time_ns() + 10**10}
        s.start_steer(args, peers, lambda *a: done.append(a))
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done and done[0][0] == "done", done
        return {f"10.{(p - 1) % 4 + 1}.0.1" for p in done[0][2]["dsts"]["host3"]["ports"]}

    assert "10.1.0.1" not in steer(3, "10.1.0.1")
    assert not steer(4, "10.2.0.1") & {"10.1.0.1", "10.2.0.1"}
    s.unsteer({"action_id": 3})
    assert steer(5, "10.3.0.1") & {"10.1.0.1"}  # 10.1 free again; 10.2 still avoided (action 4)
    assert not steer(6, "10.4.0.1") & {"10.2.0.1", "10.4.0.1"}


def test_the_movers_of_one_action_spread_by_rank_instead_of_all_taking_the_same_spines(tmp_path):
    # 4 hosts under one leaf steer 2 dsts x 2 ports each off 10.1 at once, on the same loads: placed
    # alone each takes the same slots (8 of 16 ports on one spine); each taking the slots of its
    # rank, they spread over the three spines that avoid as 6 + 5 + 5
    from collections import Counter

    from hostprobe.steer import Peer
    peers = {"host3": [Peer("198.19.1.1", "198.19.2.1", routers=3)],
             "host4": [Peer("198.19.1.1", "198.19.2.2", routers=3)]}

    done: list = []

    def record(*answer) -> None:
        done.append(answer)

    def spines(ranked: bool) -> Counter:
        count: Counter = Counter()
        for rank in range(4):
            s = MappedSteering(tmp_path / f"{ranked}-{rank}", spines=4)
            (tmp_path / f"{ranked}-{rank}").mkdir()
            done.clear()
            args = {**GOOD, "avoid_hops": ["10.1.0.1"], "expires_ns": time.time_ns() + 10**10,
                    "dsts": ["host3", "host4"], "rank": rank if ranked else 0, "movers": 4 if ranked else 1,
                    "hop_loads": {"10.2.0.1": 0.2, "10.3.0.1": 0.2, "10.4.0.1": 0.2}}
            s.start_steer(args, peers, record)
            deadline = time.monotonic() + 5
            while not done and time.monotonic() < deadline:
                time.sleep(0.01)
            assert done and done[0][0] == "done", done
            count.update(f"10.{(p - 1) % 4 + 1}.0.1" for d in done[0][2]["dsts"].values() for p in d["ports"])
        return count

    alone, ranked = spines(False), spines(True)
    assert sum(alone.values()) == sum(ranked.values()) == 16 and "10.1.0.1" not in alone | ranked
    assert max(alone.values()) == 8  # the herd
    assert sorted(ranked.values()) == [5, 5, 6]
