"""The incident lifecycle (correlator.incidents) on a real SQLite state store: open -> updated ->
resolved, dedup, no update spam, reopen with a new id, restart, acknowledgements, listeners,
filters, and the thread-safe fan-out to asyncio subscribers."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from correlator.incidents import IncidentManager, changed
from nms.records import Finding
from nms.state import StateStore

T0 = 1_700_000_000 * 10**9
W = 10**9  # one correlator window
LINK = "leaf1:swp1--spine1:swp1"


def finding(kind: str = "link_down", element: str = LINK, severity: str = "critical", summary: str = "link down",
            confidence: float = 0.9, paths: list[str] | None = None, jobs: list[str] | None = None,
            element_kind: str = "link", **extra) -> Finding:
    return Finding(kind=kind, element=element, element_kind=element_kind, ts=T0, confidence=confidence,
                   severity=severity, summary=summary, paths=paths or [], jobs=jobs or [], **extra)


def paths(n: int) -> list[str]:
    return [f"h{i}:eth0>h{i + 100}:eth0/{i}" for i in range(n)]


@pytest.fixture
def state(open_state):  # on SQLite and on PostgreSQL (tests/_postgres.py)
    store = open_state()
    yield store
    store.close()


def kinds(events) -> list[str]:
    return [e.event for e in events]


def test_open_update_resolve(state):
    m = IncidentManager(state, resolve_after=3)
    heard = []
    m.add_listener(heard.append)
    [opened] = m.apply([finding(paths=paths(4), jobs=["train-1"], evidence={"down_paths": 4})], T0)
    inc = opened.incident
    assert (opened.event, opened.ts, inc.state, inc.opened_ns, inc.updated_ns, inc.last_seen_ns) == (
        "opened", T0, "open", T0, T0, T0)
    assert inc.id >= 1 and inc.dedup_key == f"link:{LINK}" and inc.evidence == {"down_paths": 4}
    assert m.get(inc.id) == inc

    # the same fault window after window: refreshed in the store, but no event
    for i, conf in ((1, 0.95), (2, 0.97)):
        again = finding(paths=paths(4), jobs=["train-1"], confidence=conf, evidence={"n": i})
        assert m.apply([again], T0 + i * W) == []
    now = m.get(inc.id)
    assert (now.last_seen_ns, now.confidence, now.evidence, now.updates, now.updated_ns) == (
        T0 + 2 * W, 0.97, {"n": 2}, 0, T0)

    # a severity change is an update
    [upd] = m.apply([finding(severity="major", paths=paths(4), jobs=["train-1"])], T0 + 3 * W)
    assert (upd.event, upd.incident.severity, upd.incident.updates, upd.incident.updated_ns) == (
        "updated", "major", 1, T0 + 3 * W)

    # clean windows count up, a finding resets them, N clean windows in a row resolve
    assert m.apply([], T0 + 4 * W) == [] and m.get(inc.id).clean_windows == 1
    assert m.apply([], T0 + 5 * W) == [] and m.get(inc.id).clean_windows == 2
    assert m.apply([finding(severity="major", paths=paths(4), jobs=["train-1"])], T0 + 6 * W) == []
    assert m.get(inc.id).clean_windows == 0
    assert m.apply([], T0 + 7 * W) == [] and m.apply([], T0 + 8 * W) == []
    [res] = m.apply([], T0 + 9 * W)
    assert (res.event, res.ts, res.incident.state, res.incident.resolved_ns, res.incident.last_seen_ns) == (
        "resolved", T0 + 9 * W, "resolved", T0 + 9 * W, T0 + 6 * W)
    assert m.get(inc.id).state == "resolved" and m.open_incidents() == []
    assert m.apply([], T0 + 10 * W) == []  # nothing open: nothing to do

    # the same fault again: a new incident with a new id
    [again] = m.apply([finding()], T0 + 11 * W)
    assert again.event == "opened" and again.incident.id > inc.id
    assert kinds(heard) == ["opened", "updated", "resolved", "opened"]
    assert [e.event for e in m.events(inc.id)] == ["opened", "updated", "resolved"]
    history = m.events(inc.id)
    assert history[0].id < history[1].id < history[2].id and history[2].incident.state == "resolved"


def test_retention_deletes_incidents_resolved_before_the_cutoff_with_their_events(state):
    m = IncidentManager(state, resolve_after=1)
    [old] = m.apply([finding(element="leaf1:swp1--spine1:swp1")], T0)
    [old_resolved] = m.apply([], T0 + W)
    [recent] = m.apply([finding(element="leaf2:swp1--spine1:swp2")], T0 + 5 * W)
    [_] = m.apply([], T0 + 6 * W)  # resolved at T0 + 6 W
    [still_open] = m.apply([finding(element="leaf3:swp1--spine1:swp3")], T0 + 7 * W)  # opened long ago, open
    assert state.prune_incidents(T0 + 3 * W) == 1
    assert m.get(old.incident.id) is None and m.events(old.incident.id) == []
    assert m.get(recent.incident.id).state == "resolved" and len(m.events(recent.incident.id)) == 2
    assert m.get(still_open.incident.id).state == "open"
    assert state.prune_incidents(T0 + 100 * W) == 1  # the recent one; an open incident is never pruned
    assert [i.id for i in m.list()] == [still_open.incident.id] and old_resolved.event == "resolved"


def test_the_service_prunes_old_incidents_on_schedule(tmp_path):
    from nms.app.service import Service
    from tests.helpers import make_config

    cfg = make_config(tmp_path, correlator={"incident_retention": "1h"}, scheduler={"retention_interval": "0.2s"})
    service = Service(cfg)
    now = time.time_ns()
    hours_ago = now - 3 * 3600 * 10**9
    m = service.incidents
    [old] = m.apply([finding(element="leaf1:swp1--spine1:swp1")], hours_ago - W)
    for i in range(cfg.thresholds.resolve_after_clean_windows):  # resolved about 3 h ago
        m.apply([], hours_ago + i * W)
    [new] = m.apply([finding(element="leaf2:swp1--spine1:swp2")], now)
    assert m.get(old.incident.id).state == "resolved"

    async def run():
        await service.start()
        await asyncio.sleep(0.8)
        await service.stop()

    asyncio.run(run())
    reopened = StateStore(cfg.data_dir / "state.sqlite")
    assert reopened.get_incident(old.incident.id) is None and reopened.get_incident(new.incident.id).state == "open"
    reopened.close()
    runs = service.metrics.registry.get_sample_value("nms_scheduler_job_runs_total",
                                                     {"job": "incident-retention", "result": "ok"})
    assert runs and runs >= 1


def test_what_counts_as_an_update(state):
    m = IncidentManager(state, resolve_after=5)
    base = dict(kind="corrupting_link", summary="loss 3.1% on leaf1:swp1->spine1:swp1", severity="major",
                direction="leaf1:swp1->spine1:swp1", jobs=["a", "b"], paths=paths(10))
    m.apply([finding(**base)], T0)
    quiet = [
        {"summary": "loss 3.4% on leaf1:swp1->spine1:swp1"},  # numbers only
        {"jobs": ["b", "a"]},  # same set of jobs
        {"paths": paths(12)},  # 10 -> 12 paths: not notable
        {"paths": paths(8)},
        {"confidence": 0.5, "evidence": {"loss_pct": 3.9}},
    ]
    for i, change in enumerate(quiet, 1):
        assert m.apply([finding(**{**base, **change})], T0 + i * W) == [], change
    loud = [
        {"severity": "critical"},
        {"summary": "silent loss on leaf1:swp1->spine1:swp1"},
        {"direction": "spine1:swp1->leaf1:swp1"},
        {"jobs": ["a", "b", "c"]},
        {"paths": paths(15)},  # half as many again as at the last event
        {"paths": paths(7)},  # and half as many
    ]
    for i, change in enumerate(loud, 10):
        assert kinds(m.apply([finding(**{**base, **change})], T0 + i * W)) == ["updated"], change
        base = {**base, **change}
    assert m.open_incidents()[0].updates == len(loud)
    # creeping change adds up against the last announced state, not the previous window
    for i, n in enumerate((8, 9, 10), 20):
        assert m.apply([finding(**{**base, "paths": paths(n)})], T0 + i * W) == []
    assert kinds(m.apply([finding(**{**base, "paths": paths(11)})], T0 + 30 * W)) == ["updated"]


def test_changed_names_what_changed(state):
    m = IncidentManager(state, resolve_after=5)
    [e] = m.apply([finding(paths=paths(2))], T0)
    after = e.incident.model_copy(update={"severity": "minor", "jobs": ["x"], "paths": paths(3)})
    assert changed(e.incident, after) == ["severity", "jobs", "paths"]
    assert changed(e.incident, e.incident) == []


def test_dedup_in_a_window_and_across_elements(state):
    m = IncidentManager(state, resolve_after=2)
    events = m.apply([finding(severity="minor", confidence=0.99, summary="weak"),
                      finding(severity="critical", confidence=0.6, summary="strong"),
                      finding(severity="critical", confidence=0.5, summary="weaker"),
                      finding(kind="link_flapping", severity="major"),
                      finding(element="leaf2:swp1--spine1:swp2")], T0)
    assert kinds(events) == ["opened"] * 2  # one incident per element
    assert {e.incident.dedup_key for e in events} == {f"link:{LINK}", "link:leaf2:swp1--spine1:swp2"}
    assert events[0].incident.summary == "strong" and events[0].incident.kind == "link_down"  # most severe wins
    # one window later only one of them still shows: the other counts a clean window
    assert m.apply([finding(summary="strong")], T0 + W) == []
    assert sorted(i.clean_windows for i in m.open_incidents()) == [0, 1]
    assert kinds(m.apply([finding(summary="strong")], T0 + 2 * W)) == ["resolved"]
    assert [i.dedup_key for i in m.open_incidents()] == [f"link:{LINK}"]


def test_clean_windows_count_time_not_steps(state):
    """Extra steps inside a window (path events trigger them) do not hurry a resolution, and a step
    after a long gap (a stalled service) counts one window, not the gap."""
    m = IncidentManager(state, resolve_after=3)
    [opened] = m.apply([finding()], T0)
    for k in range(1, 8):
        assert m.apply([], T0 + k * W // 4) == []  # seven steps within 1.75 windows
    assert m.get(opened.incident.id).clean_windows == 2
    assert kinds(m.apply([], T0 + 3 * W)) == ["resolved"]
    [again] = m.apply([finding()], T0 + 4 * W)
    assert m.apply([], T0 + 60 * W) == [] and m.get(again.incident.id).clean_windows == 1


def test_a_change_of_kind_on_the_same_element_updates_the_incident(state):
    """A link first seen down that then flaps is one incident: its kind follows the evidence, and once
    flapping it stays so while it is down between flaps (no event to link_down and back each flap)."""
    m = IncidentManager(state, resolve_after=2)
    opened = m.apply([finding()], T0)
    assert kinds(opened) == ["opened"] and opened[0].incident.kind == "link_down"
    updated = m.apply([finding(kind="link_flapping", severity="major")], T0 + W)
    assert kinds(updated) == ["updated"]
    assert (updated[0].incident.id, updated[0].incident.kind) == (opened[0].incident.id, "link_flapping")
    assert m.get(opened[0].incident.id).kind == "link_flapping"
    assert [i.kind for i in m.list(kind="link_flapping")] == ["link_flapping"] and m.list(kind="link_down") == []
    # down again between two flaps: still the flapping link, no event; only fresh evidence (paths) updates it
    flap_summary = updated[0].incident.summary
    assert m.apply([finding()], T0 + 2 * W) == []
    [again] = m.apply([finding(paths=paths(8))], T0 + 3 * W)
    assert (again.event, again.incident.kind, again.incident.severity, again.incident.summary) == (
        "updated", "link_flapping", "major", flap_summary)
    assert again.incident.paths == paths(8) and m.get(again.incident.id).kind == "link_flapping"


def test_open_incidents_continue_across_a_restart(open_state):
    state = open_state()
    m = IncidentManager(state, resolve_after=3)
    [a] = m.apply([finding(paths=paths(10))], T0)
    [b] = m.apply([finding(paths=paths(10)), finding(element="h1:eth0", element_kind="nic", kind="nic_down")], T0 + W)
    assert m.apply([finding(paths=paths(14))], T0 + 2 * W) == []  # b: one clean window; a: 14 paths, no event
    [c] = m.apply([finding(paths=paths(14)), finding(kind="congestion", element="leaf9:swp9--spine9:swp9",
                                                     severity="minor")], T0 + 3 * W)  # b: two clean windows
    state.close()

    state = open_state()
    m = IncidentManager(state, resolve_after=3)
    assert [i.id for i in m.open_incidents()] == [a.incident.id, b.incident.id, c.incident.id]
    assert [i.clean_windows for i in m.open_incidents()] == [0, 2, 0]
    # a continues under its id; 15 paths is notable against the 10 of its last event (not the 14 of the last
    # window); b resolves after its third clean window in a row
    events = m.apply([finding(paths=paths(15))], T0 + 5 * W)
    assert [(e.event, e.incident.id) for e in events] == [("updated", a.incident.id), ("resolved", b.incident.id)]
    [d] = m.apply([finding(paths=paths(15)), finding(element="h1:eth0", element_kind="nic", kind="nic_down")],
                  T0 + 6 * W)
    assert d.event == "opened" and d.incident.id > c.incident.id  # ids keep rising, never reused
    state.close()


def test_acknowledge(state, caplog):
    m = IncidentManager(state, resolve_after=2)
    heard = []
    m.add_listener(heard.append)
    [opened] = m.apply([finding()], T0)
    iid = opened.incident.id
    ack = m.acknowledge(iid, "noc-alice", comment="looking at the optic", now_ns=T0 + 5)
    assert (ack.event, ack.ts, ack.incident.acknowledged_by, ack.incident.acknowledged_ns) == (
        "acknowledged", T0 + 5, "noc-alice", T0 + 5)
    again = m.acknowledge(iid, "noc-bob", comment="me too", now_ns=T0 + 9)
    assert (again.ts, again.incident.acknowledged_by) == (T0 + 5, "noc-alice")  # the first ack stands
    assert kinds(heard) == ["opened", "acknowledged"]  # the second emitted nothing
    # the ack survives the windows that refresh the incident, and its resolution
    m.apply([finding(severity="minor")], T0 + W)
    m.apply([], T0 + 2 * W)
    [res] = m.apply([], T0 + 3 * W)
    assert res.event == "resolved" and res.incident.acknowledged_by == "noc-alice"
    history = m.events(iid)
    assert [(e.event, e.comment) for e in history] == [("opened", None), ("acknowledged", "looking at the optic"),
                                                       ("updated", None), ("resolved", None)]
    # a resolved incident may be acknowledged; an unknown one may not
    [other] = m.apply([finding(element="leaf3:swp1--spine1:swp3")], T0 + 4 * W)
    m.apply([], T0 + 5 * W)
    m.apply([], T0 + 6 * W)
    assert m.get(other.incident.id).state == "resolved"
    assert m.acknowledge(other.incident.id, "noc-bob").incident.acknowledged_by == "noc-bob"
    with pytest.raises(KeyError):
        m.acknowledge(9999, "noc-bob")


def test_a_failing_listener_is_logged_and_does_not_stop_the_others(state, caplog):
    m = IncidentManager(state, resolve_after=2)
    heard = []

    def broken(event):
        raise RuntimeError("webhook down")

    m.add_listener(broken)
    m.add_listener(heard.append)
    with caplog.at_level(logging.ERROR, logger="correlator.incidents"):
        [e] = m.apply([finding()], T0)
    assert heard == [e] and "incident listener" in caplog.text and "webhook down" in caplog.text
    assert m.get(e.incident.id) is not None  # committed before the listeners ran


def test_list_filters(state):
    m = IncidentManager(state, resolve_after=1)
    m.apply([finding(jobs=["train-1", "train-2"])], T0)  # 1: resolved at T0 + W
    m.apply([finding(kind="congestion", element="leaf2:swp3--spine1:swp2", severity="minor", jobs=["train-2"]),
             finding(kind="nic_down", element="h1-1:eth0", element_kind="nic"),
             finding(kind="device_down", element="leaf1", element_kind="device")], T0 + W)
    m.apply([finding(kind="congestion", element="leaf2:swp3--spine1:swp2", severity="minor", jobs=["train-2"]),
             finding(kind="device_down", element="leaf1", element_kind="device")], T0 + 2 * W)  # nic: resolved
    ids = lambda **kw: [i.id for i in m.list(**kw)]  # noqa: E731
    every = ids()
    assert len(every) == 4 and every == sorted(every, reverse=True)  # newest first
    one, cong, nic, dev = sorted(every)
    assert ids(state="open") == [dev, cong] and ids(state="resolved") == [nic, one]
    assert ids(kind="congestion") == [cong]
    assert ids(job="train-2") == [cong, one] and ids(job="train") == []
    assert ids(element="leaf1") == [dev, one]  # the device, and a link with an end on it
    assert ids(element="spine1") == [cong, one]
    assert ids(element="spine1:swp2") == [cong] and ids(element="leaf1:swp1") == [one]
    assert ids(element="h1-1") == [nic] and ids(element="h1-1:eth0") == [nic] and ids(element="leaf") == []
    assert ids(element="leaf_") == [] and ids(element="%") == []  # no LIKE wildcards
    # active span: one was open T0 .. T0+W, nic T0+W .. T0+2W, the others from T0+W on
    assert ids(until_ns=T0) == [one]
    assert ids(since_ns=T0 + 2 * W) == [dev, nic, cong]
    assert ids(since_ns=T0 + 3 * W) == [dev, cong]
    assert ids(since_ns=T0, until_ns=T0 + W - 1) == [one]
    assert ids(limit=2) == [dev, nic]


async def test_subscribers_get_events_from_another_thread_in_order(state):
    m = IncidentManager(state, resolve_after=2)
    sub = m.subscribe()

    def correlator():  # a worker thread, as in the service
        m.apply([finding()], T0)
        m.apply([finding(severity="major")], T0 + W)
        m.apply([], T0 + 2 * W)
        m.apply([], T0 + 3 * W)

    await asyncio.to_thread(correlator)
    got = [await asyncio.wait_for(anext(sub), 5) for _ in range(3)]
    assert [(g.event.event, g.event.ts) for g in got] == [("opened", T0), ("updated", T0 + W), ("resolved", T0 + 3 * W)]
    assert got[0].id < got[1].id < got[2].id
    # a later subscriber: the incidents open now, and what it missed since an id
    m.apply([finding(element="leaf5:swp1--spine1:swp5")], T0 + 4 * W)
    await asyncio.sleep(0.01)  # delivered to sub through the loop
    late = m.subscribe(after=got[0].id)
    assert [i.element for i in late.snapshot] == ["leaf5:swp1--spine1:swp5"]
    assert [b.event.event for b in late.backlog] == ["updated", "resolved", "opened"]
    sub.close()
    late.close()
    assert [x.event.incident.element async for x in sub] == ["leaf5:swp1--spine1:swp5"]  # what it had, then the end
    assert m._subscribers == set()


async def test_a_shared_stream_shows_what_another_process_commits_in_order(open_state):
    """Two processes on one state store (two connections): the API worker's manager applies nothing;
    its subscribers get the correlate member's events read back from the state (`follow`), in id order,
    each once, the backlog and the live events meeting without a gap or a repeat; its snapshot is what
    the state holds open. Its own events (an acknowledgement) come the same way."""
    worker_state, member_state = open_state(), open_state()
    other = finding(element="leaf9:swp1--spine1:swp9")
    try:
        member = IncidentManager(member_state, resolve_after=2)
        member.apply([other], T0 - W)  # before the worker started
        worker = IncidentManager(worker_state, resolve_after=2)
        worker.share_stream()
        sub = worker.subscribe()
        assert [i.element for i in sub.snapshot] == [other.element]  # the state's, not the worker's own (none)
        member.apply([other, finding()], T0)
        member.apply([other, finding(severity="major")], T0 + W)
        assert worker.follow() == 2 and worker.follow() == 0
        late = worker.subscribe(after=0)  # everything so far: the backlog up to the cursor, nothing twice
        assert [i.element for i in late.snapshot] == [other.element, LINK]
        member.apply([other], T0 + 2 * W)
        member.apply([other], T0 + 3 * W)  # the second clean window: resolved
        [kept] = member.open_incidents()
        worker.acknowledge(kept.id, by="noc")  # the worker's own event: through the state as well
        assert worker.follow() == 2
        expected = [("opened", LINK), ("updated", LINK), ("resolved", LINK), ("acknowledged", other.element)]
        got = [await asyncio.wait_for(anext(sub), 5) for _ in range(4)]
        assert [(g.event.event, g.event.incident.element) for g in got] == expected
        assert [g.id for g in got] == sorted(g.id for g in got)
        late_got = late.backlog + [await asyncio.wait_for(anext(late), 5) for _ in range(2)]
        assert [(g.event.event, g.event.incident.element) for g in late_got] == [("opened", other.element), *expected]
        sub.close()
        late.close()
        assert [x async for x in sub] == [] and [x async for x in late] == []  # nothing more, nothing twice
    finally:
        worker_state.close()
        member_state.close()


async def test_a_slow_subscriber_is_dropped_without_blocking_apply(state, caplog):
    m = IncidentManager(state, resolve_after=100, queue_size=3)
    slow, fast = m.subscribe(), m.subscribe()
    fast_got = []

    async def read_fast():
        async for item in fast:
            fast_got.append(item)

    reader = asyncio.create_task(read_fast())
    with caplog.at_level(logging.WARNING, logger="correlator.incidents"):
        for i in range(6):  # each window opens one incident
            done = threading.Event()
            threading.Thread(target=lambda i=i, done=done: (m.apply([finding(element=f"leaf{i}:swp1--spine1:swp1")],
                                                         T0 + i * W), done.set())).start()
            assert await asyncio.to_thread(done.wait, 5)  # apply never waits for a subscriber
            await asyncio.sleep(0.01)
    assert "subscriber dropped" in caplog.text
    assert slow.dropped and slow not in m._subscribers and fast in m._subscribers
    kept = [item async for item in slow]  # what it had queued, then the end
    assert [k.event.incident.element for k in kept] == [f"leaf{i}:swp1--spine1:swp1" for i in range(3)]
    assert len(fast_got) == 6
    fast.close()
    await asyncio.wait_for(reader, 5)


def test_hold_continues_only_the_incidents_of_owned_elements(open_state):
    """Sharded correlation: two managers on one state store, each holding the elements of its partition
    (nms/app/correlate_feed.py). What one opened, the other takes over by hold() and resolves; what it
    gave away, it neither resolves nor refreshes."""
    a, b = IncidentManager(open_state(), resolve_after=2), IncidentManager(open_state(), resolve_after=2)
    leaf2 = "leaf2:swp3--spine1:swp2"
    [opened] = a.apply([finding()], T0)  # LINK, leaf1's
    [other] = b.apply([finding(element=leaf2)], T0)
    taken, given = a.hold(lambda i: i.element == LINK)
    assert (taken, given) == ([], [])  # it held LINK already and never knew leaf2's
    b.hold(lambda i: i.element == leaf2)
    assert a.apply([], T0 + W) == [] and [i.id for i in a.open_incidents()] == [opened.incident.id]
    # b takes LINK (a died): it continues a's incident, does not open another, and resolves it when clean
    taken, given = b.hold(lambda i: True)
    assert [i.id for i in taken] == [opened.incident.id] and given == []
    [e] = b.apply([finding(element=leaf2)], T0 + 2 * W)  # LINK: 2 windows since last seen: resolved
    assert (e.event, e.incident.id) == ("resolved", opened.incident.id)
    # a gives LINK away: it forgets it and emits nothing for it
    a.hold(lambda i: False)
    assert a.open_incidents() == [] and a.apply([], T0 + 9 * W) == []
    assert [i.id for i in b.open_incidents()] == [other.incident.id]
