"""Actions in the state store: ids never reused, the audit log kept with the action."""

from __future__ import annotations

from nms.records import Action, ActionEvent


def _action(**kw) -> Action:
    base = dict(id=0, kind="host_reroute", element="leaf1:swp1--spine1:swp1", element_kind="link",
                targets=["h1"], requested_by="controller", created_ns=10, updated_ns=10, reason="congested")
    return Action(**(base | kw))


def test_actions_and_their_audit_log_survive_a_restart(open_state):  # on SQLite and on PostgreSQL
    state = open_state()
    first = state.insert_action(_action(), ActionEvent(event="proposed", ts=10, action=_action(), by="controller"),
                                note="policy auto")
    assert first.id == 1
    applied = first.model_copy(update={"state": "applied", "before": {"h1": {}}, "after": {"h1": {"ports": [5]}}})
    state.update_action(applied, ActionEvent(event="applied", ts=20, action=applied, by="ops"), note="all agents ok")
    state.close()
    state = open_state()
    assert state.get_action(1).state == "applied"
    events = state.action_events(1)
    assert [(e.event, e.by, e.note) for e in events] == [("proposed", "controller", "policy auto"),
                                                         ("applied", "ops", "all agents ok")]
    assert events[0].action.id == 1 and events[1].action.after == {"h1": {"ports": [5]}}
    assert events[0].action.reason == "congested"
    second = state.insert_action(_action(kind="drain_link", targets=["leaf1"]))
    assert second.id == 2
    assert [a.id for a in state.list_actions(states=("applied",))] == [1]
    assert [a.id for a in state.list_actions(kind="drain_link")] == [2]
    # ids are never reused, even when the newest row is gone
    with state._db.transaction() as db:
        db.execute("DELETE FROM actions WHERE id = 2")
    assert state.insert_action(_action()).id == 3
    state.close()
