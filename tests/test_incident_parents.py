"""One incident per failure (issue 28, item 3): a finding that explains others (a dead switch its
links, a down NIC its access link) is a parent; the incidents of what it explains are its children,
stored with its id, silent towards the sinks, resolved with it or re-raised when they outlive it.
Through the real correlator engine on synthetic telemetry (tests/_fabric_synth.py) and the real
incident manager on a real SQLite state store; the notifier against a real HTTP receiver; the
migration of a database written before parents existed."""

from __future__ import annotations

import json
import sqlite3

import pytest

from correlator.incidents import IncidentManager
from nms.app.dashboards.incident_points import incident_point
from nms.app.notify import NOTIFIER_GROUP
from nms.app.plugins import load_plugin
from nms.records import Finding, IncidentEvent
from nms.state import StateStore
from tests._fabric_synth import NS
from tests._notify import event, incident, notifications, until
from tests.test_correlator_faults import Run, link_of
from tests.test_incidents import T0, W, finding

RESOLVE_AFTER = 3


@pytest.fixture
def state(open_state):  # on SQLite and on PostgreSQL (tests/_postgres.py)
    store = open_state()
    yield store
    store.close()


class Fabric:
    """The synthetic fabric, the real correlator and the real incident manager, one window a step."""

    def __init__(self, state: StateStore, leaves: int = 3):
        self.run = Run(leaves=leaves)
        self.incidents = IncidentManager(state, resolve_after=RESOLVE_AFTER)
        self.events: list[IncidentEvent] = []
        self.incidents.add_listener(self.events.append)

    def steps(self, n: int) -> list[IncidentEvent]:
        before = len(self.events)
        for findings in self.run.steps(n):
            self.incidents.apply(findings, (self.run.t) * NS + NS // 10)
        return self.events[before:]

    def spine_links(self, spine: int) -> list[str]:
        return [link_of(self.run.s.up_link(lf, spine)) for lf in range(1, self.run.s.leaves + 1)]


def pages(events: list[IncidentEvent]) -> list[tuple[str, str, str]]:
    """What the notification sinks get: (event, kind, element)."""
    return [(e.event, e.incident.kind, e.incident.element) for e in events if e.notifies]


def test_a_switch_whose_links_were_reported_first_adopts_them(state):
    """The lab's order: the links' incidents open first, the switch's death is seen a window later
    (two of four links down look like two links; all four are the switch)."""
    fab = Fabric(state, leaves=4)
    links = fab.spine_links(2)
    fab.run.s.down.update(links[:2])
    first = fab.steps(2)
    assert sorted(pages(first)) == [("opened", "link_down", links[0]), ("opened", "link_down", links[1])]
    early = {e.incident.element: e.incident.id for e in first}

    fab.run.s.down.update(links[2:])
    later = fab.steps(1)
    assert pages(later) == [("opened", "device_down", "spine2")]  # one page for the switch, none for its links
    parent = later[0].incident
    assert sorted(later[0].absorbed) == sorted(early.values())  # it says what it absorbed
    assert parent.explains == sorted(f"link:{link}" for link in links)
    assert set(parent.children) == set(early.values())
    adopted = {e.incident.id: e for e in later[1:]}
    assert set(adopted) == set(early.values())
    assert all(e.event == "updated" and e.incident.parent_id == parent.id and e.incident.adopted_ns is not None
               and not e.notifies for e in adopted.values())

    # while the switch stays dead its children stay open under it (their findings are gone: it explains them)
    assert pages(fab.steps(2 * RESOLVE_AFTER)) == []
    assert [(i.id, i.parent_id) for i in fab.incidents.open_incidents()] == [
        *[(i, parent.id) for i in sorted(early.values())], (parent.id, None)]
    top = state.list_incidents(state="open", top_level=True)
    assert [i.id for i in top] == [parent.id]

    fab.run.s.down.clear()
    healed = fab.steps(RESOLVE_AFTER + 1)
    # the parent and, with it, the children; the adopted ones' resolves close the pages they had raised
    assert sorted(pages(healed)) == sorted([("resolved", "device_down", "spine2"),
                                            ("resolved", "link_down", links[0]),
                                            ("resolved", "link_down", links[1])])
    assert healed[0].incident.id == parent.id
    assert fab.incidents.open_incidents() == []


def test_a_switch_dead_at_once_is_one_incident_that_lists_its_links(state):
    fab = Fabric(state)
    links = fab.spine_links(1)
    fab.run.s.down.update(links)
    events = fab.steps(3)
    assert pages(events) == [("opened", "device_down", "spine1")]
    [inc] = fab.incidents.open_incidents()
    assert inc.explains == sorted(f"link:{link}" for link in links) and inc.children == []


def test_a_link_that_outlives_its_dead_switch_is_re_raised(state):
    """Decision: a child resolves with its parent, unless its own finding is in the window where the
    parent resolves; then it goes on as a top-level incident with the same id (its fault was
    never fixed: resolving it would page again a window later and lose its history)."""
    fab = Fabric(state)
    links = fab.spine_links(2)
    fab.run.s.down.add(links[0])
    [opened] = fab.steps(1)
    fab.run.s.down.update(links)
    fab.steps(3)
    [parent] = [i for i in fab.incidents.open_incidents() if i.parent_id is None]
    assert parent.kind == "device_down" and parent.children == [opened.incident.id]

    fab.run.s.down = {links[0]}  # the switch is back; this link's optic is still dead
    events = fab.steps(RESOLVE_AFTER + 1)
    assert pages(events) == [("resolved", "device_down", "spine2"), ("updated", "link_down", links[0])]
    raised = [e.incident for e in events if e.incident.id == opened.incident.id][-1]
    assert raised.parent_id is None and raised.state == "open"
    assert state.get_incident(parent.id).children == []  # the parent no longer claims it
    assert [i.id for i in fab.incidents.open_incidents()] == [opened.incident.id]


def test_a_child_born_under_its_parent_is_silent_and_re_raised_by_opened(state):
    """A finding for an explained element in the parent's window opens a child without a page;
    if it outlives the parent, its first page is an `opened`."""
    m = IncidentManager(state, resolve_after=2)
    link = "host3:eth0--leaf2:swp1"
    nic = finding(kind="nic_down", element="host3:eth0", element_kind="nic", explains=[f"link:{link}"])
    events = m.apply([nic, finding(element=link)], T0)
    assert [(e.event, e.incident.element, e.notifies) for e in events] == [
        ("opened", "host3:eth0", True), ("opened", link, False)]
    parent, child = events[0].incident, events[1].incident
    assert parent.children == [child.id] and child.parent_id == parent.id and child.adopted_ns is None
    assert events[0].absorbed == []
    m.apply([nic], T0 + W)
    events = m.apply([finding(element=link)], T0 + 2 * W)  # the NIC is back; its link still is not
    assert events == []  # the parent counts its clean windows; the child waits for it
    events = m.apply([finding(element=link)], T0 + 3 * W)
    assert [(e.event, e.incident.id, e.notifies) for e in events] == [
        ("resolved", parent.id, True), ("opened", child.id, True)]


def test_only_down_and_flapping_are_explained(state):
    """A congested link of a switch that then dies is its own fault: not adopted."""
    m = IncidentManager(state, resolve_after=2)
    link = "leaf1:swp3--spine1:swp1"
    [cong] = m.apply([finding(kind="congestion", element=link, severity="minor")], T0)
    events = m.apply([finding(kind="device_down", element="spine1", element_kind="device",
                              explains=[f"link:{link}"])], T0 + W)
    assert [(e.event, e.incident.kind) for e in events] == [("opened", "device_down")]
    assert events[0].incident.children == [] and state.get_incident(cong.incident.id).parent_id is None


def test_a_restart_keeps_parents_and_children(open_state):
    store = open_state()
    m = IncidentManager(store, resolve_after=2)
    link = "leaf1:swp3--spine1:swp1"
    [child] = m.apply([finding(element=link)], T0)
    dead = finding(kind="device_down", element="spine1", element_kind="device", explains=[f"link:{link}"])
    m.apply([dead], T0 + W)
    store.close()

    store = open_state()
    m = IncidentManager(store, resolve_after=2)
    assert m.apply([dead], T0 + 2 * W) == []
    assert m.apply([], T0 + 3 * W) == []
    events = m.apply([], T0 + 4 * W)
    assert [(e.event, e.incident.kind) for e in events] == [("resolved", "device_down"), ("resolved", "link_down")]
    assert events[1].incident.id == child.incident.id and events[1].notifies  # adopted: its page is closed
    store.close()


def test_an_adopted_parent_brings_its_children_along(state):
    """One level only: a NIC whose access link was its child, then the leaf dies."""
    m = IncidentManager(state, resolve_after=2)
    link = "host3:eth0--leaf2:swp1"
    nic = finding(kind="nic_down", element="host3:eth0", element_kind="nic", explains=[f"link:{link}"])
    first = m.apply([nic, finding(element=link)], T0)
    nic_id, link_id = first[0].incident.id, first[1].incident.id
    leaf = finding(kind="device_down", element="leaf2", element_kind="device",
                   explains=[f"link:{link}", "nic:host3:eth0"])
    events = m.apply([leaf], T0 + W)
    assert events[0].event == "opened" and events[0].absorbed == [nic_id]
    top = events[0].incident
    assert sorted(top.children) == sorted([nic_id, link_id])
    assert {i.id: i.parent_id for i in m.open_incidents()} == {nic_id: top.id, link_id: top.id, top.id: None}
    assert state.get_incident(nic_id).children == []


def test_an_older_database_gets_the_parent_column(tmp_path):
    """A state file written before parents existed: its incidents read back top-level, new ones nest."""
    path = tmp_path / "state.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, dedup_key TEXT NOT NULL, "
               "state TEXT NOT NULL, kind TEXT NOT NULL, element TEXT NOT NULL, opened_ns INTEGER NOT NULL, "
               "resolved_ns INTEGER, body TEXT NOT NULL)")
    old = {"id": 1, "dedup_key": "link:a:1--b:1", "kind": "link_down", "element": "a:1--b:1", "element_kind": "link",
           "direction": None, "severity": "critical", "state": "open", "summary": "down", "confidence": 0.9,
           "evidence": {}, "paths": [], "jobs": [], "opened_ns": T0, "updated_ns": T0, "last_seen_ns": T0,
           "resolved_ns": None, "updates": 0, "clean_windows": 0, "acknowledged_by": None, "acknowledged_ns": None}
    db.execute("INSERT INTO incidents VALUES (1, 'link:a:1--b:1', 'open', 'link_down', 'a:1--b:1', ?, NULL, ?)",
               (T0, json.dumps(old)))
    db.commit()
    db.close()
    for _ in range(2):  # the migration runs once; a second open changes nothing
        store = StateStore(path)
        [inc] = store.list_incidents(top_level=True)
        assert inc.id == 1 and inc.parent_id is None and inc.children == []
        store.close()
    store = StateStore(path)
    m = IncidentManager(store, resolve_after=2)
    events = m.apply([finding(kind="device_down", element="b", element_kind="device", explains=["link:a:1--b:1"])],
                     T0 + W)
    assert events[0].absorbed == [1]
    assert [i.id for i in store.list_incidents(top_level=True)] == [events[0].incident.id]
    assert store.incident_children([events[0].incident.id])[events[0].incident.id][0].id == 1
    store.close()


def test_top_level_filters_match_a_child(state):
    m = IncidentManager(state, resolve_after=2)
    link = "leaf1:swp3--spine1:swp1"
    m.apply([finding(element=link, jobs=["train-1"])], T0)
    [parent] = [e.incident for e in m.apply([finding(kind="device_down", element="spine1", element_kind="device",
                                                     explains=[f"link:{link}"])], T0 + W) if e.event == "opened"]
    assert [i.id for i in state.list_incidents(top_level=True, element="leaf1")] == [parent.id]
    assert [i.id for i in state.list_incidents(top_level=True, job="train-1")] == [parent.id]
    assert [i.id for i in state.list_incidents(top_level=True, kind="link_down")] == [parent.id]
    assert state.list_incidents(top_level=True, element="leaf9") == []
    assert len(state.list_incidents(element="leaf1")) == 1  # flat: the child itself


async def test_the_sinks_get_one_page_per_failure(make, rx, state):
    """A real webhook receiver: the links' pages, the switch's page with what it absorbed, and at the
    end the resolves that close all three; the children's own events never reach it."""
    notifier = make(notifications([{"name": "hook", "kind": "webhook", "url": rx.url("/hook")}]))
    await notifier.start()
    m = IncidentManager(state, resolve_after=2)
    m.add_listener(notifier.submit)
    links = ["leaf1:swp3--spine1:swp1", "leaf2:swp3--spine1:swp2"]
    m.apply([finding(element=link) for link in links], T0)
    dead = finding(kind="device_down", element="spine1", element_kind="device",
                   explains=[f"link:{link}" for link in links])
    events = m.apply([dead], T0 + W)
    assert len(events) == 3  # the parent's opened, two adoptions (history and stream only)
    for i in range(2, 5):
        m.apply([] if i > 2 else [dead], T0 + i * W)
    await until(lambda: len(notifier.deliveries(state="delivered")) == 6)
    got = [r.json() for r in rx.at("/hook")]
    assert sorted((g["event"], g["incident"]["element"]) for g in got) == sorted(
        [("opened", links[0]), ("opened", links[1]), ("opened", "spine1"),
         ("resolved", "spine1"), ("resolved", links[0]), ("resolved", links[1])])
    parent = next(g for g in got if g["event"] == "opened" and g["incident"]["element"] == "spine1")
    assert sorted(parent["absorbed"]) == [1, 2] and sorted(parent["incident"]["children"]) == [1, 2]


def test_finding_explains_is_bounded_and_optional():
    f = Finding(kind="link_down", element="a:1--b:1", element_kind="link", ts=T0, confidence=1.0,
                severity="critical", summary="down")
    assert f.explains == []


def test_every_sink_says_what_a_parent_absorbed():
    """The one update for the parent (sinks are pure: rendered without I/O)."""
    parent = incident(id=7, kind="device_down", element="spine1", element_kind="device",
                      dedup_key="device:spine1", children=[3, 4], explains=["link:a:1--spine1:1"])
    ev = event("opened", parent).model_copy(update={"absorbed": [3, 4]})
    config = notifications([
        {"name": "hook", "kind": "webhook", "url": "http://127.0.0.1:9/h"},
        {"name": "pd", "kind": "pagerduty", "url": "http://127.0.0.1:9/pd", "secret": "k" * 32},
        {"name": "slack", "kind": "slack", "url": "http://127.0.0.1:9/services/T0/B0/x"},
        {"name": "am", "kind": "alertmanager", "url": "http://127.0.0.1:9/am"},
        {"name": "snow", "kind": "servicenow", "url": "http://127.0.0.1:9/sn", "username": "u", "secret": "p" * 8}])
    bodies = {s.kind: json.loads(load_plugin(NOTIFIER_GROUP, s.kind).from_config(s, "lab").render(ev, 1, T0).body)
              for s in config.sinks}
    assert bodies["webhook"]["absorbed"] == [3, 4] and bodies["webhook"]["incident"]["children"] == [3, 4]
    details = bodies["pagerduty"]["payload"]["custom_details"]
    assert (details["children"], details["absorbed"]) == ([3, 4], [3, 4])
    slack = json.dumps(bodies["slack"]["blocks"])
    assert "*Absorbed*\\n#3 #4 (notified before; now under #7)" in slack and "*Explains*\\n#3 #4" in slack
    annotations = bodies["alertmanager"]["alerts"][0]["annotations"]
    assert (annotations["children"], annotations["absorbed"]) == ("#3 #4", "#3 #4")
    info = json.loads(bodies["servicenow"]["records"][0]["additional_info"])
    assert (info["children"], info["absorbed"]) == ([3, 4], [3, 4])


def test_dashboard_points_mark_a_child():
    assert incident_point(event("updated", incident(id=3, parent_id=7))).fields["parent_id"] == 7
    assert "parent_id" not in incident_point(event("opened", incident(id=7))).fields


def test_acknowledging_a_parent_acknowledges_its_children(state):
    m = IncidentManager(state, resolve_after=2)
    link = "leaf1:swp3--spine1:swp1"
    [child] = m.apply([finding(element=link)], T0)
    [opened, _] = m.apply([finding(kind="device_down", element="spine1", element_kind="device",
                                   explains=[f"link:{link}"])], T0 + W)
    heard: list[IncidentEvent] = []
    m.add_listener(heard.append)
    m.acknowledge(opened.incident.id, "noc-alice", "spine1 is being replaced", now_ns=T0 + 2 * W)
    assert [(e.incident.id, e.incident.acknowledged_by, e.notifies) for e in heard] == [
        (opened.incident.id, "noc-alice", True), (child.incident.id, "noc-alice", True)]  # adopted: its page too
    [entry] = [e for e in m.events(child.incident.id) if e.event == "acknowledged"]
    assert entry.comment == f"with its parent, incident {opened.incident.id}"
    assert {i.id: i.acknowledged_by for i in m.open_incidents()} == {child.incident.id: "noc-alice",
                                                                     opened.incident.id: "noc-alice"}
    m.acknowledge(opened.incident.id, "noc-bob")  # the first ack stands, for both
    assert len(heard) == 2


@pytest.mark.parametrize("links_first", [True, False])
def test_a_parent_in_one_member_adopts_the_children_another_member_opened(open_state, links_first):
    """Sharded correlation (docs/cluster.md): the owner of a leaf's partition opens a link's incident,
    the owner of `core` opens the spine's death that explains it. Before, the spine's incident listed
    the link but the link stayed top-level (the leaf's member wrote it back without a parent at its
    next window): two pages for one failure. Each member on its own connection to one state."""
    leaf_state, core_state = open_state(), open_state()
    leaf, core = IncidentManager(leaf_state, resolve_after=2), IncidentManager(core_state, resolve_after=2)
    leaf.follows_others = core.follows_others = True
    link = finding("link_down", "leaf1:swp1--spine1:swp1")
    spine = finding("device_down", "spine1", element_kind="device", summary="switch down",
                    explains=[link.dedup_key])
    t = T0
    if links_first:
        [opened] = leaf.apply([link], t)
        t += W
        events = core.apply([spine, link], t)  # the core member sees the link too: it goes with its parent
    else:
        events = core.apply([spine, link], t)
        t += W
        leaf.apply([link], t)
    parent = next(e.incident for e in events if e.incident.kind == "device_down")
    for _ in range(3):  # both go on judging: the leaf's member keeps the link under the parent
        t += W
        leaf.apply([link], t)
        core.apply([spine, link], t)
    stored = {i.kind: i for i in leaf_state.list_incidents(state="open")}
    assert stored["link_down"].parent_id == parent.id and stored["device_down"].children == [stored["link_down"].id]
    assert [i.kind for i in leaf_state.list_incidents(state="open", top_level=True)] == ["device_down"]
    if links_first:
        assert next(e for e in events if e.incident.kind == "device_down").absorbed == [opened.incident.id]
    leaf_state.close()
    core_state.close()
