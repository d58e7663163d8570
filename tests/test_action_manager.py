"""The ActionManager: policies, dry run, approvals, rate limits, expiry and the rollbacks, fed by a
real IncidentManager over a real state store. The actuator here records what it is asked (the
switch and host actuators have their own tests; tests/test_action_service.py runs real agents)."""

from __future__ import annotations

import asyncio

import pytest
from _act_fabric import addresses, topology, uplink

from correlator.actions.base import Actuator, ActuatorError
from correlator.actions.manager import ActionManager, ActionRefused
from correlator.incidents import IncidentManager
from nms.config.models import ActionsConfig, FabricConfig, SwitchConfig
from nms.records import Action, Finding, Job

S = 10**9


class Recording(Actuator):
    kinds = frozenset({"host_reroute", "drain_link", "isolate_port"})

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.fail: str | None = None
        self.partial = False

    async def read(self, action: Action) -> dict:
        return {"steered": []}

    async def apply(self, action: Action) -> dict:
        self.calls.append(("apply", action.id))
        if self.fail:
            raise ActuatorError(self.fail, {"hosts": {"h1": "done"}} if self.partial else None)
        return {"steered": list(action.targets)}

    async def revert(self, action: Action) -> dict:
        self.calls.append(("revert", action.id))
        return {"steered": []}


class Clock:
    def __init__(self):
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


def finding(kind="congestion", element=None, pairs=(("h1", "h3"), ("h3", "h1")), loss=2.0, ts=0):
    element = element or uplink("leaf1", 1)
    return Finding(kind=kind, element=element, element_kind="link", ts=ts, confidence=0.9, severity="major",
                   summary=f"{kind} on {element}", evidence={"loss": {"loss_pct": loss}},
                   paths=[f"{s}:eth0>{d}:eth0/0" for s, d in pairs])


class Rig:
    def __init__(self, open_state, spines=4, **config):
        self.clock = Clock()
        self.state = open_state()  # on SQLite and on PostgreSQL (tests/_postgres.py)
        self.incidents = IncidentManager(self.state, resolve_after=2)
        self.actuator = Recording()
        cfg = ActionsConfig.model_validate({"enabled": True, **config})
        fabric = FabricConfig(switches=[SwitchConfig(name=n, mgmt_address=f"192.0.2.{i}", role=n[:-1])
                                        for i, n in enumerate(["leaf1", "leaf2", "spine1", "spine2"], 1)])
        self.manager = ActionManager(cfg, fabric, self.state, {k: self.actuator for k in Recording.kinds},
                                     lambda: (topology(spines), addresses(spines)), clock=self.clock,
                                     port_loads=lambda: {("spine2", "leaf2"): 0.5})
        self.incidents.add_listener(self.manager.on_incident)

    def window(self, *findings):
        self.clock.now += S
        self.incidents.apply(list(findings), self.clock.now)
        asyncio.run(self.manager.tick())

    def actions(self, **kw):
        return self.state.list_actions(**kw)


AUTO = {"policies": {"host_reroute": {"policy": "auto"}, "drain_link": {"policy": "auto"}}}


def test_auto_applies_and_the_audit_log_says_who_what_why_before_after(open_state):
    rig = Rig(open_state, **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    assert action.kind == "host_reroute" and action.state == "applied" and not action.dry_run
    assert action.targets == ["h1", "h2", "h3", "h4"] and action.incident_id == 1
    assert rig.actuator.calls == [("apply", action.id)]
    events = rig.state.action_events(action.id)
    assert [(e.event, e.by) for e in events] == [("proposed", "controller"), ("approved", "controller"),
                                                 ("applied", "controller")]
    assert events[0].note == "policy auto" and "incident 1: congestion on" in events[0].action.reason
    assert events[-1].action.before == {"steered": []}
    assert events[-1].action.after == {"steered": ["h1", "h2", "h3", "h4"]}
    assert action.expires_ns == action.applied_ns + 3600 * S
    # the next window with the same finding proposes nothing new
    rig.window(finding())
    assert len(rig.actions()) == 1


def test_windows_written_late_act_only_on_what_is_still_open(open_state):
    """After a state store outage the windows of its time are written in a row before the manager's
    next tick (nms/app/correlation.py): an incident opened and resolved among them gets no action,
    one still open gets its action as at once."""
    rig = Rig(open_state, **AUTO)
    for findings in ([finding()], [finding()], [], [], [], [finding(element=uplink("leaf2", 1))]):
        rig.clock.now += S
        rig.incidents.apply(findings, rig.clock.now)
    asyncio.run(rig.manager.tick())
    first, second = sorted(rig.state.list_incidents(), key=lambda i: i.id)
    assert (first.state, second.state) == ("resolved", "open")
    assert [(a.incident_id, a.state) for a in rig.actions()] == [(second.id, "applied")]
    assert rig.actuator.calls == [("apply", rig.actions()[0].id)]


@pytest.mark.parametrize("load_aware", [True, False])
def test_a_reroute_carries_hop_loads_unless_load_aware_is_off(open_state, load_aware):
    rig = Rig(open_state, load_aware=load_aware, **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    assert action.params["hop_loads"] == ({"10.2.2.0": 0.5} if load_aware else {})  # off: avoid_hops alone


def test_a_reroute_steers_the_running_jobs_flows_only(open_state):
    rig = Rig(open_state, **AUTO)
    rig.state.put_job(Job(id="a", hosts=["h1", "h3"], start=rig.clock.now - S))
    rig.state.put_job(Job(id="gone", hosts=["h2", "h3"], start=1, end=rig.clock.now - S))  # ended: no say
    rig.window(finding())
    (action,) = rig.actions()
    assert action.params["dsts"] == {"h1": ["h3"], "h2": ["h3", "h4"], "h3": ["h1"], "h4": ["h1", "h2"]}


def test_dry_run_records_and_sends_nothing(open_state):
    rig = Rig(open_state, dry_run=True, **AUTO)
    rig.window(finding("corrupting_link"))
    acts = rig.actions()
    assert sorted(a.kind for a in acts) == ["drain_link", "host_reroute"]
    assert all(a.dry_run and a.state == "proposed" for a in acts)
    assert rig.actuator.calls == []
    assert "dry run: nothing sent (policy auto)" == rig.state.action_events(acts[0].id)[0].note
    rig.clock.now += 3601 * S
    rig.window()
    assert {a.state for a in rig.actions()} == {"expired"} and rig.actuator.calls == []


def test_approval_policy_waits_and_only_then_applies(open_state):
    rig = Rig(open_state)  # the default: approval
    rig.window(finding())
    (action,) = rig.actions()
    assert action.state == "awaiting_approval" and rig.actuator.calls == []
    done = asyncio.run(rig.manager.approve(action.id, "alice"))
    assert done.state == "applied" and done.approved_by == "alice"
    assert [e.by for e in rig.state.action_events(action.id)] == ["controller", "alice", "alice"]
    with pytest.raises(ActionRefused, match="not awaiting approval"):
        asyncio.run(rig.manager.approve(action.id, "bob"))


def test_reject_and_approval_expiry(open_state):
    rig = Rig(open_state, approval_ttl="60s")
    rig.window(finding())
    rig.window(finding("congestion", uplink("leaf2", 2), pairs=(("h4", "h2"),)))
    first, second = sorted(rig.actions(), key=lambda a: a.id)
    rejected = asyncio.run(rig.manager.reject(first.id, "bob", "maintenance window"))
    assert rejected.state == "rejected" and rig.state.action_events(first.id)[-1].note == "maintenance window"
    rig.clock.now += 61 * S
    rig.window()
    assert rig.state.get_action(second.id).state == "expired"
    assert rig.actuator.calls == []


def test_proposals_that_no_longer_fit_their_incident_are_withdrawn(open_state):
    rig = Rig(open_state)  # approval for every kind
    rig.window(finding("corrupting_link"))  # a first window's guess: drain + reroute proposed
    assert sorted(a.kind for a in rig.actions(state="awaiting_approval")) == ["drain_link", "host_reroute"]
    rig.window(finding("congestion"))  # one window later it is congestion: no drain for that
    drain = rig.actions(kind="drain_link")[0]
    assert drain.state == "rejected" and drain.result.startswith("withdrawn: incident 1 is now congestion")
    assert rig.state.action_events(drain.id)[-1].by == "controller"
    (reroute,) = rig.actions(kind="host_reroute")
    assert reroute.state == "awaiting_approval"
    rig.window()
    rig.window()  # resolved: nobody may approve a steer for a healed fault any more
    assert rig.state.get_action(reroute.id).state == "rejected"
    with pytest.raises(ActionRefused, match="not awaiting approval"):
        asyncio.run(rig.manager.approve(reroute.id, "alice"))
    assert rig.actuator.calls == []


def test_policy_off_and_scopes(open_state):
    rig = Rig(open_state, policies={"host_reroute": {"policy": "auto", "scopes": [
        {"policy": "off", "devices": ["spine1"]}, {"policy": "approval", "roles": ["leaf"], "prefix": "leaf2"}]}})
    assert rig.manager.policy("host_reroute", uplink("leaf1", 1)) == "off"  # spine1 is an end
    assert rig.manager.policy("host_reroute", uplink("leaf1", 2)) == "auto"
    assert rig.manager.policy("host_reroute", uplink("leaf2", 2)) == "approval"
    rig.window(finding())  # leaf1-spine1: off
    assert rig.actions() == []
    rig.window(finding(), finding(element=uplink("leaf1", 2)))
    assert [a.state for a in rig.actions()] == ["applied"]


def test_rate_limit_turns_auto_into_approval(open_state):
    rig = Rig(open_state, rate={"per_kind": 1, "window": "10m"}, limits={"max_drain_fraction": 1.0}, **AUTO)
    rig.window(finding(), finding(element=uplink("leaf2", 3), pairs=(("h4", "h2"),)))
    first, second = sorted(rig.actions(), key=lambda a: a.id)
    assert first.state == "applied" and second.state == "awaiting_approval"
    assert "rate limit: 1 automatic host_reroute actions in the last 600 s (max 1)" in \
        rig.state.action_events(second.id)[0].note


def test_max_concurrent(open_state):
    rig = Rig(open_state, rate={"max_concurrent": 1}, limits={"max_drain_fraction": 1.0}, **AUTO)
    rig.window(finding(), finding(element=uplink("leaf2", 3), pairs=(("h4", "h2"),)))
    second = max(rig.actions(), key=lambda a: a.id)
    assert second.state == "awaiting_approval" and "1 actions applied at once (max 1)" in \
        rig.state.action_events(second.id)[0].note
    with pytest.raises(ActionRefused, match="max 1"):
        asyncio.run(rig.manager.approve(second.id, "alice"))


def test_the_last_path_is_refused_nothing_recorded(open_state):
    rig = Rig(open_state, spines=1, **AUTO)
    rig.window(finding())
    assert rig.actions() == [] and rig.actuator.calls == []


def test_expiry_rolls_back(open_state):
    rig = Rig(open_state, expiry="30m", **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    rig.clock.now += 1801 * S
    rig.window(finding())
    action = rig.state.get_action(action.id)
    assert action.state == "expired" and action.reverted_ns == rig.clock.now
    assert rig.actuator.calls[-1] == ("revert", action.id)
    assert "expired 1800 s after it was applied" in rig.state.action_events(action.id)[-1].note


def test_rollback_after_the_incident_stays_resolved_for_the_hold(open_state):
    rig = Rig(open_state, hold="10s", **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    rig.window()
    rig.window()  # 2 clean windows: resolved
    assert rig.state.get_incident(1).state == "resolved"
    for _ in range(9):
        rig.window()
    assert rig.state.get_action(action.id).state == "applied"  # 9 s of the 10 s hold
    rig.window()
    action = rig.state.get_action(action.id)
    assert action.state == "rolled_back" and ("revert", action.id) in rig.actuator.calls
    last = rig.state.action_events(action.id)[-1]
    assert last.event == "rolled_back" and "incident 1 resolved and stayed clean for 10 s" in last.note


def test_the_hold_doubles_when_the_element_relapses_after_a_rollback(open_state):
    # steering a slow link's traffic away resolves the incident while the link stays slow; the
    # rollback brings the traffic back and the incident again: each round holds twice as long
    rig = Rig(open_state, hold="2s", expiry="1h", **AUTO)
    holds = []
    for _ in range(3):
        rig.window(finding())
        action = max(rig.actions(), key=lambda a: a.id)
        holds.append(action.params["hold_s"])
        rig.window()
        rig.window()  # resolved
        for _ in range(int(action.params["hold_s"]) + 1):
            rig.window()
        assert rig.state.get_action(action.id).state == "rolled_back"
    assert holds == [2.0, 4.0, 8.0]
    assert "hold 8 s: rolled back on resolution 2 time(s)" in rig.state.action_events(action.id)[0].note


def test_no_rollback_while_the_element_is_bad_again(open_state):
    rig = Rig(open_state, hold="2s", **AUTO)
    rig.window(finding())
    rig.window()
    rig.window()  # resolved
    rig.window(finding())  # a new incident on the same element
    rig.window(finding())
    rig.window(finding())
    first = min(rig.actions(), key=lambda a: a.id)
    assert first.state == "applied"


def test_rollback_when_the_evidence_gets_worse(open_state):
    rig = Rig(open_state, worse_factor=1.5, worse_grace=2, **AUTO)
    rig.window(finding(loss=2.0))
    (action,) = rig.actions()
    assert action.params["baseline"] == {"loss_pct": 2.0}
    rig.window(finding(loss=3.5))  # the grace: a fresh fault's loss still climbs; the baseline follows
    rig.window(finding(loss=3.0))
    action = rig.state.get_action(action.id)
    assert action.state == "applied" and action.params["baseline"] == {"loss_pct": 3.5}
    rig.window(finding(loss=5.0))  # 1.43x: not worse
    assert rig.state.get_action(action.id).state == "applied"
    rig.window(finding(loss=5.3))  # 1.51x, no incident event for it (same kind, summary): judged anyway
    action = rig.state.get_action(action.id)
    assert action.state == "rolled_back"
    assert "worse since applied: loss_pct rose from 3.5 to 5.3" in rig.state.action_events(action.id)[-1].note


def test_rollback_when_an_incident_opens_where_traffic_moved(open_state):
    rig = Rig(open_state, spines=2, **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    rig.window(finding(), finding(element=uplink("leaf2", 2), pairs=(("h4", "h2"),)))
    action = rig.state.get_action(action.id)
    assert action.state == "rolled_back"
    assert f"opened on {uplink('leaf2', 2)}, where the action moved traffic" in \
        rig.state.action_events(action.id)[-1].note


def test_a_failed_apply_records_the_reason_and_undoes_a_partial_one(open_state):
    rig = Rig(open_state, **AUTO)
    rig.actuator.fail, rig.actuator.partial = "h3: failed: no path avoids the hops", True
    rig.window(finding())
    (action,) = rig.actions()
    assert action.state == "failed" and action.result == "h3: failed: no path avoids the hops"
    assert rig.actuator.calls == [("apply", action.id), ("revert", action.id)]
    assert [e.event for e in rig.state.action_events(action.id)] == ["proposed", "approved", "applied", "failed",
                                                                      "rolled_back"][:2] + ["failed", "rolled_back"]


def test_manual_requests(open_state):
    rig = Rig(open_state, limits={"max_drain_fraction": 0.75})
    rig.window(finding())
    (pending,) = rig.actions()
    assert pending.state == "awaiting_approval"
    # on an element, by kind: the requester's act token approves it
    (manual,) = asyncio.run(rig.manager.request("ops", element=uplink("leaf2", 3), kind="host_reroute"))
    assert manual.state == "applied" and manual.requested_by == "ops" and manual.approved_by == "ops"
    assert manual.incident_id is None and manual.targets == ["h1", "h2", "h3", "h4"]
    (dry,) = asyncio.run(rig.manager.request("ops", element=uplink("leaf2", 4), kind="drain_link", dry_run=True))
    assert dry.dry_run and dry.state == "proposed" and dry.targets == ["leaf2"]
    (iso,) = asyncio.run(rig.manager.request("ops", element=uplink("leaf1", 4), kind="isolate_port"))
    assert iso.params["ports"] == {"leaf1": "up4", "spine4": "leaf1"} and iso.state == "applied"
    with pytest.raises(ActionRefused, match="avoided already"):
        asyncio.run(rig.manager.request("ops", incident_id=1))
    with pytest.raises(ActionRefused, match="would keep 0 of 4 paths"):  # the last path: never
        asyncio.run(rig.manager.request("ops", element=uplink("leaf1", 2), kind="isolate_port"))
    with pytest.raises(KeyError):
        asyncio.run(rig.manager.request("ops", incident_id=99))
    rolled = asyncio.run(rig.manager.rollback(manual.id, "ops", "done testing"))
    assert rolled.state == "rolled_back" and rig.state.action_events(manual.id)[-1].note == "done testing"


def test_config_errors_name_the_field():
    from nms.config.models import NmsConfig
    for doc, field in (({"rate": {"per_kind": 0}}, "actions.rate.per_kind"),
                       ({"policies": {"drain_link": {"policy": "maybe"}}}, "actions.policies.drain_link.policy"),
                       ({"policies": {"reboot": {"policy": "auto"}}}, "actions.policies"),
                       ({"limits": {"max_drain_fraction": 1.5}}, "actions.limits.max_drain_fraction"),
                       ({"policies": {"host_reroute": {"scopes": [{"policy": "off"}]}}}, "scopes.0"),
                       ({"expiry": "soon"}, "actions.expiry"), ({"dryrun": True}, "actions.dryrun")):
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            NmsConfig.model_validate({"actions": doc})
    assert NmsConfig().actions.enabled is False  # off unless configured
    import yaml  # a bare `off` in YAML is a boolean: still the policy off
    doc = yaml.safe_load("actions: {policies: {drain_link: {policy: off, scopes: [{policy: off, roles: [spine]}]}}}")
    off = NmsConfig.model_validate(doc).actions.policies["drain_link"]
    assert off.policy == "off" and off.scopes[0].policy == "off"
    with pytest.raises(ValueError, match="policy"):
        NmsConfig.model_validate({"actions": {"policies": {"drain_link": {"policy": True}}}})


def test_a_restart_in_the_middle_marks_the_action_failed(open_state):
    rig = Rig(open_state, **AUTO)
    rig.window(finding())
    (action,) = rig.actions()
    rig.state.update_action(action.model_copy(update={"state": "applying"}))
    again = Rig(open_state, **AUTO)  # the service starts again on the same state
    action = again.state.get_action(action.id)
    assert action.state == "failed" and action.result == "interrupted while applying"
    assert "restarted while it was applying" in again.state.action_events(action.id)[-1].note
