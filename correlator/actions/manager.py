"""The action lifecycle: incidents -> planned actions -> policy -> apply -> rollback.

An IncidentManager listener queues incident events (it must be quick); `tick()` (the service runs
it every correlator window, on the event loop) plans for them and runs the timers. States:

    proposed ------------------------------------------> expired      (dry run: recorded only)
    awaiting_approval -> approved -> applying -> applied -> rolling_back -> rolled_back | expired
            |  \\-> rejected             \\-> failed             (auto: proposed -> approved at once)
            \\-> expired (approval_ttl)

Policy per kind (and scope, config `actions.policies`): auto applies at once, approval waits for
an `act` token, off proposes nothing. Automatic actions beyond `rate.per_kind` per `rate.window`,
or beyond `rate.max_concurrent` applied at once, wait for approval instead. Rollback: at expiry;
once the incident stayed resolved for `hold` (and no incident is open on the element again);
when the action made things worse within `worse_windows` windows (the incident's loss or delay
evidence rose by `worse_factor`, or an incident opened on an element traffic moved to); or on
request. Every decision is an event in the audit log (nms.state action_events) with its reason.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from fnmatch import fnmatch

from prometheus_client import CollectorRegistry, Counter, Gauge

from correlator.actions import planner
from correlator.actions.base import Actuator, ActuatorError
from correlator.actions.steering import Limits
from nms.config.models import ActionsConfig, FabricConfig
from nms.records import (
    Action,
    ActionEvent,
    ActionEventKind,
    ActionState,
    FabricTopology,
    Incident,
    IncidentEvent,
    InterfaceAddress,
)
from nms.state import ActionEventEntry, StateStore
from nms.store.base import Point, TimeSeriesStore, declare_fields
from nms.topology import PathFinder, parse_end

log = logging.getLogger(__name__)
CONTROLLER = "controller"
PENDING: tuple[ActionState, ...] = ("proposed", "awaiting_approval", "approved")
LIVE: tuple[ActionState, ...] = ("applying", "applied", "rolling_back")
OPEN_STATES = PENDING + LIVE
RESOLVED = "resolved and stayed clean"  # in the result of a rollback on resolution
STEERING_KINDS = ("host_reroute", "drain_link", "isolate_port")  # all take traffic off an element
MEASUREMENT = "action_event"
TAGS = ("kind", "event", "state")
declare_fields(MEASUREMENT, {"id": "integer", "incident_id": "integer", "element": "string", "dry_run": "boolean",
                             "targets": "integer", "by": "string", "note": "string"})


class ActionRefused(Exception):
    """A request the policy, the limits or the state does not allow (the reason for the caller)."""


Context = Callable[[], tuple[FabricTopology, list[InterfaceAddress]]]


class ActionManager:
    def __init__(self, config: ActionsConfig, fabric: FabricConfig, state: StateStore,
                 actuators: dict[str, Actuator], context: Context, store: TimeSeriesStore | None = None,
                 registry: CollectorRegistry | None = None, clock: Callable[[], int] = time.time_ns,
                 window_ns: int = 10**9, port_loads: Callable[[], dict[tuple[str, str], float]] | None = None):
        self.config = config
        self.state = state
        self.actuators = actuators
        self.context = context
        # (device, port) -> inbound utilization now, for host_reroute's hop_loads; none when not load_aware
        # (the agents then keep the first ports that avoid: avoid-only steering)
        self.port_loads = (port_loads if config.load_aware else None) or dict
        self.routing = (planner.Routing(config.ports_per_dst, config.port_load)
                        if config.load_aware and config.plan_routes else None)
        self.store = store
        self.clock = clock
        self.window_ns = window_ns
        self.roles = {s.name: s.role for s in fabric.switches} | {h.name: "host" for h in fabric.hosts}
        self.limits = Limits(config.limits.max_drain_fraction, config.limits.min_paths)
        self._queue: queue.SimpleQueue[IncidentEvent] = queue.SimpleQueue()
        self._lock = asyncio.Lock()
        self._ticking = asyncio.Lock()
        r = registry if registry is not None else CollectorRegistry()
        self.m_events = Counter("nms_action_events", "action events (audit log entries)", ["kind", "event"],
                                registry=r)
        self.m_refused = Counter("nms_action_refusals", "actions not proposed or not applied automatically",
                                 ["kind", "why"], registry=r)
        Gauge("nms_actions_live", "actions applied or being applied or rolled back", registry=r).set_function(
            lambda: len(self.state.list_actions(states=LIVE, limit=None)))
        for action in self.state.list_actions(states=("approved", "applying", "rolling_back"), limit=None):
            # the service stopped in the middle: what the actuator did is unknown, an operator decides
            self._set(action, "failed", "failed", CONTROLLER, f"the service restarted while it was {action.state}; "
                      "check the targets and roll back by hand if needed", result=f"interrupted while {action.state}")

    # --- the incident listener and the loop -----------------------------------------------------

    def on_incident(self, event: IncidentEvent) -> None:
        """IncidentManager listener (its worker thread, under its lock): queue only."""
        if self.config.enabled:
            self._queue.put(event)

    @property
    def pending(self) -> bool:
        """Incident events wait to be planned for (the service then ticks at once, not on its interval)."""
        return not self._queue.empty()

    async def tick(self) -> None:
        """Plan for the queued incident events, then run the timers (expiry, hold, worse). Ticks never
        overlap: one asked for while another runs waits for it."""
        async with self._ticking:
            await self._tick()

    async def _tick(self) -> None:
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                break
            try:
                await self._on_incident(event)
            except Exception:
                log.exception("action planning failed for incident %d (%s)", event.incident.id, event.event)
        await self._timers()

    async def _on_incident(self, event: IncidentEvent) -> None:
        inc = event.incident
        if event.event == "opened":
            await self._check_moved_to(inc)
        if event.event in ("opened", "updated") and (now := self.state.get_incident(inc.id)) is not None \
                and now.state != "open":
            inc = now  # a window written late (after a state store outage): its incident has ended since
        if inc.state != "open":
            await self._withdraw(inc.id, set(), f"incident {inc.id} is {inc.state}")
            return
        if event.event not in ("opened", "updated"):
            return
        have = {a.kind for a in self.state.list_actions(incident_id=inc.id, limit=None)
                if a.state in OPEN_STATES or a.state == "applied"}
        topology, addresses = self.context()
        await self._withdraw(inc.id, planner.fitting_kinds(inc)[0],
                             f"incident {inc.id} is now {inc.kind}, for which the planner does not propose it")
        # in a thread: a big fabric's plan (every pair's paths, the routes) takes seconds, which the
        # service's event loop (ingest, the API) must not wait for
        result = await asyncio.to_thread(planner.plan, inc, topology, addresses, self.limits, self._avoided(),
                                         self.config.dport, self.port_loads(), self._job_peers, self.routing)
        for note in result.notes:
            log.info("incident %d (%s on %s): %s", inc.id, inc.kind, inc.element, note)
        for element, reason in result.refused.items():
            self.m_refused.labels("any", "limits").inc()
            log.warning("incident %d: not steering off %s: %s", inc.id, element, reason)
        for proposal in result.proposals:
            if proposal.kind in have:
                continue
            await self._propose(proposal, inc.id, CONTROLLER, dry_run=self.config.dry_run)

    async def _withdraw(self, incident_id: int, still_proposed: set[str], why: str) -> None:
        """Proposals waiting for approval that no longer fit their incident (resolved, or reclassified:
        a first window's corrupting_link that is congestion one window later must not leave a drain
        waiting for an operator's click) are rejected by the controller, the reason logged."""
        async with self._lock:
            for action in self.state.list_actions(incident_id=incident_id, states=("awaiting_approval", "proposed"),
                                                  limit=None):
                if action.kind not in still_proposed and (action.state == "awaiting_approval" or action.dry_run):
                    self._set(action, "rejected", "rejected", CONTROLLER, f"withdrawn: {why}",
                              result=f"withdrawn: {why}")

    # --- proposing and deciding -------------------------------------------------------------------

    def policy(self, kind: str, element: str) -> str:
        """auto | approval | off for this kind on this element: the first matching scope, else the kind's."""
        kind_policy = self.config.policies[kind]
        devices = sorted({parse_end(e)[0] for e in element.split("--")})
        for scope in kind_policy.scopes:
            if scope.devices and not any(fnmatch(d, pat) for d in devices for pat in scope.devices):
                continue
            if scope.roles and not any(self.roles.get(d) in scope.roles for d in devices):
                continue
            if scope.prefix and not element.startswith(scope.prefix):
                continue
            return scope.policy
        return kind_policy.policy

    def _avoided(self) -> dict[str, set[str]]:
        """Element -> the kinds of the live or pending actions steering off it."""
        out: dict[str, set[str]] = {}
        for a in self.state.list_actions(states=OPEN_STATES, limit=None):
            if a.kind in STEERING_KINDS and not a.dry_run:
                out.setdefault(a.element, set()).add(a.kind)
        return out

    def _job_peers(self) -> dict[str, set[str]]:
        """Host -> the hosts it has job traffic with, from the jobs running now (planner.job_peers)."""
        return planner.job_peers(self.state.list_jobs(active_at=self.clock(), limit=1_000_000))

    def _rate_refusal(self, kind: str) -> str | None:
        now = self.clock()
        since = now - int(self.config.rate.window * 1e9)
        recent = [a for a in self.state.list_actions(kind=kind, limit=None)
                  if a.requested_by == CONTROLLER and not a.dry_run and a.applied_ns and a.applied_ns >= since]
        if len(recent) >= self.config.rate.per_kind:
            return (f"rate limit: {len(recent)} automatic {kind} actions in the last {self.config.rate.window:g} s "
                    f"(max {self.config.rate.per_kind})")
        return self._concurrency_refusal()

    def _concurrency_refusal(self) -> str | None:
        live = len([a for a in self.state.list_actions(states=LIVE, limit=None) if not a.dry_run])
        if live >= self.config.rate.max_concurrent:
            return f"{live} actions applied at once (max {self.config.rate.max_concurrent})"
        return None

    def _hold(self, kind: str, element: str, now: int) -> tuple[float, str]:
        """The hold before a rollback on resolution, doubled for every action of this kind on this
        element that such a rollback ended within the last `expiry`: steering a congested link's
        traffic away resolves the incident while the link stays slow, and the rollback brings the
        traffic back onto it; the doubling damps that cycle (capped at `expiry`)."""
        since = now - int(self.config.expiry * 1e9)
        relapses = [a for a in self.state.list_actions(kind=kind, element=element, state="rolled_back", limit=None)
                    if (a.reverted_ns or 0) >= since and RESOLVED in (a.result or "")]
        hold = min(self.config.hold * 2 ** len(relapses), self.config.expiry)
        return hold, (f"; hold {hold:g} s: rolled back on resolution {len(relapses)} time(s) in the last "
                      f"{self.config.expiry:g} s" if relapses else "")

    async def _propose(self, proposal: planner.Proposal, incident_id: int | None, by: str, dry_run: bool,
                       approved: bool = False) -> Action:
        now = self.clock()
        hold, hold_note = self._hold(proposal.kind, proposal.element, now)
        policy = self.policy(proposal.kind, proposal.element)
        if policy == "off":
            self.m_refused.labels(proposal.kind, "policy_off").inc()
            raise ActionRefused(f"policy for {proposal.kind} on {proposal.element} is off")
        note = f"policy {policy}"
        state: ActionState = "awaiting_approval"
        if dry_run:
            state, note = "proposed", f"dry run: nothing sent (policy {policy})"
        elif approved:
            state = "approved"
        elif policy == "auto":
            refusal = self._rate_refusal(proposal.kind)
            if refusal is None:
                state = "approved"
            else:
                self.m_refused.labels(proposal.kind, "rate").inc()
                note = f"policy auto, but {refusal}: waiting for approval"
        note += hold_note
        ttl = self.config.expiry if state == "proposed" else self.config.approval_ttl
        action = Action(id=0, kind=proposal.kind, incident_id=incident_id, element=proposal.element,
                        element_kind=proposal.element_kind, targets=list(proposal.targets),
                        params=proposal.params | {"hold_s": hold},
                        state="proposed" if state != "awaiting_approval" else state, dry_run=dry_run,
                        reason=proposal.reason, requested_by=by, created_ns=now, updated_ns=now,
                        expires_ns=now + int(ttl * 1e9))
        action = self.state.insert_action(action, ActionEvent(event="proposed", ts=now, action=action, by=by), note)
        self._emit("proposed", action, by, note)
        if state == "approved":
            approver = by if approved else CONTROLLER
            action = await self._approve(action, approver, "requested by an act token" if approved else note)
        return action

    async def _approve(self, action: Action, by: str, note: str) -> Action:
        async with self._lock:
            action = self._set(action, "approved", "approved", by, note, approved_by=by)
            action = self._set(action, "applying", None, by, "")
        return await self._apply(action, by)

    async def _apply(self, action: Action, by: str) -> Action:
        actuator = self.actuators.get(action.kind)
        if actuator is None:
            return self._set(action, "failed", "failed", by, f"no actuator for {action.kind} in this service",
                             result=f"no actuator for {action.kind}")
        now = self.clock()
        expires = now + int(self.config.expiry * 1e9)
        action = self._set(action, "applying", None, by, "", expires_ns=expires, params=self._baseline(action))
        try:
            before = await actuator.read(action)
            action = self._set(action, "applying", None, by, "", before=before)
            after = await actuator.apply(action)
        except ActuatorError as e:
            action = self._set(action, "failed", "failed", by, str(e), after=e.state, result=str(e))
            if e.state:  # partly applied: undo what was done
                await self._revert(action, "rolled_back", by, f"undoing the partial apply: {e}")
                action = self.state.get_action(action.id) or action
            return action
        except Exception as e:  # a bug in an actuator must not leave the action "applying"
            log.exception("actuator %s failed", action.kind)
            return self._set(action, "failed", "failed", by, f"internal error: {type(e).__name__}",
                             result=f"internal error: {type(e).__name__}")
        return self._set(action, "applied", "applied", by, f"applied on {', '.join(action.targets)}",
                         after=after, applied_ns=self.clock(), result="applied")

    def _baseline(self, action: Action) -> dict:
        incident = self.state.get_incident(action.incident_id) if action.incident_id else None
        if incident is None:
            return action.params
        return action.params | {"baseline": planner.evidence_level(incident)}

    async def _revert(self, action: Action, final: ActionState, by: str, why: str,
                      final_event: ActionEventKind | None = None) -> Action:
        actuator = self.actuators.get(action.kind)
        event: ActionEventKind = final_event or ("expired" if final == "expired" else "rolled_back")
        if action.dry_run or actuator is None:
            return self._set(action, final, event, by, why, reverted_ns=self.clock())
        keep = action.state if action.state == "failed" else "rolling_back"
        action = self._set(action, keep, None, by, "")
        try:
            state = await actuator.revert(action)
        except ActuatorError as e:
            return self._set(action, "failed", "failed", by, f"rollback ({why}) failed: {e}", after=e.state,
                             result=f"rollback failed: {e}")
        except Exception as e:
            log.exception("actuator %s failed to revert", action.kind)
            return self._set(action, "failed", "failed", by, f"rollback failed: internal error {type(e).__name__}",
                             result="rollback failed")
        final_state = action.state if action.state == "failed" else final
        return self._set(action, final_state, event, by, why, after=state, reverted_ns=self.clock(),
                         result=why if action.state != "failed" else action.result)

    def _set(self, action: Action, state: ActionState, event: ActionEventKind | None, by: str, note: str,
             **updates) -> Action:
        action = action.model_copy(update={"state": state, "updated_ns": self.clock(), **updates})
        record = ActionEvent(event=event, ts=action.updated_ns, action=action, by=by) if event else None
        self.state.update_action(action, record, note)
        if event:
            self._emit(event, action, by, note)
        return action

    def _emit(self, event: str, action: Action, by: str, note: str) -> None:
        log.info("action %d %s (%s on %s, by %s): %s", action.id, event, action.kind, action.element, by, note)
        self.m_events.labels(action.kind, event).inc()
        if self.store is None:
            return
        fields = {"id": action.id, "element": action.element[:256], "dry_run": action.dry_run,
                  "targets": len(action.targets), "by": by, "note": note[:1024]}
        if action.incident_id is not None:
            fields["incident_id"] = action.incident_id
        try:
            self.store.write([Point(MEASUREMENT, {"kind": action.kind, "event": event, "state": action.state},
                                    fields, action.updated_ns)])
        except Exception as e:  # the audit log is in SQLite already; the point is for dashboards
            log.warning("action_event point for action %d not stored: %s", action.id, e)

    # --- timers and rollback triggers -------------------------------------------------------------

    async def _timers(self) -> None:
        now = self.clock()
        for action in self.state.list_actions(states=("proposed", "awaiting_approval", "applied"), limit=None):
            if action.state in ("proposed", "awaiting_approval"):
                if action.expires_ns is not None and now >= action.expires_ns:
                    self._set(action, "expired", "expired", CONTROLLER,
                              "dry-run proposal expired" if action.dry_run else "nobody approved it in time")
                continue
            if action.expires_ns is not None and now >= action.expires_ns:
                await self._revert(action, "expired", CONTROLLER,
                                   f"expired {self.config.expiry:g} s after it was applied: rolled back")
                continue
            if action.incident_id is None:
                continue
            incident = self.state.get_incident(action.incident_id)
            if incident is not None and incident.state == "open" and self._within_worse_window(action):
                await self._check_evidence(action, incident)  # every window: evidence changes emit no event
                continue
            if incident is None or incident.state != "resolved" or incident.resolved_ns is None:
                continue
            hold = float(action.params.get("hold_s", self.config.hold))
            if now - incident.resolved_ns < int(hold * 1e9):
                continue
            again = [i for i in self.state.list_incidents(state="open", element=action.element)
                     if i.element == action.element]
            if again:
                continue  # the element is bad again: keep steering off it
            await self._revert(action, "rolled_back", CONTROLLER,
                               f"incident {incident.id} {RESOLVED} for {hold:g} s")

    def _within_worse_window(self, action: Action) -> bool:
        return action.applied_ns is not None and \
            self.clock() - action.applied_ns <= self.config.worse_windows * self.window_ns

    async def _check_moved_to(self, incident: Incident) -> None:
        for action in self.state.list_actions(state="applied", limit=None):
            if (incident.element in action.params.get("moved_to", []) and self._within_worse_window(action)
                    and incident.opened_ns > (action.applied_ns or 0)):  # opened since: not a fault seen together
                await self._revert(action, "rolled_back", CONTROLLER,
                                   f"worse: incident {incident.id} ({incident.kind}) opened on {incident.element}, "
                                   "where the action moved traffic")

    async def _check_evidence(self, action: Action, incident: Incident) -> None:
        """Roll back when the incident's evidence rose by `worse_factor` over the baseline; in the
        first `worse_grace` windows only raise the baseline (a fresh fault still climbs)."""
        now = planner.evidence_level(incident)
        baseline = action.params.get("baseline", {})
        if self.clock() - (action.applied_ns or 0) <= self.config.worse_grace * self.window_ns:
            raised = {k: max(v, now.get(k, v)) for k, v in baseline.items()} | \
                {k: v for k, v in now.items() if k not in baseline}
            if raised != baseline:
                self._set(action, "applied", None, CONTROLLER, "", params=action.params | {"baseline": raised})
            return
        why = planner.worse(baseline, now, self.config.worse_factor)
        if why:
            await self._revert(action, "rolled_back", CONTROLLER, f"worse since applied: {why}")

    # --- operators (the API) ---------------------------------------------------------------------

    async def request(self, by: str, incident_id: int | None = None, element: str | None = None,
                      kind: str | None = None, dry_run: bool = False) -> list[Action]:
        """A manual request: the planner's actions for an incident, or `kind` on an element. Approved
        by the requester (an act token) unless dry run; the policy `off` and the limits still hold."""
        if not self.config.enabled:
            raise ActionRefused("actions are disabled (actions.enabled)")
        dry_run = dry_run or self.config.dry_run
        topology, addresses = self.context()
        if incident_id is not None:
            incident = self.state.get_incident(incident_id)
            if incident is None:
                raise KeyError(incident_id)
        elif element is not None and kind is not None:
            incident = self._synthetic(element, kind, topology)
        else:
            raise ActionRefused("give incident_id, or element and kind")
        if kind == "isolate_port":
            proposal = self._isolate(element or incident.element, topology, by)
            if refusal := planner.blast_radius(proposal.element, topology, self.limits, self._avoided()):
                raise ActionRefused(refusal)
            proposals = [proposal]
        else:
            result = await asyncio.to_thread(planner.plan, incident, topology, addresses, self.limits,
                                             self._avoided(), self.config.dport, self.port_loads(), self._job_peers,
                                             self.routing)
            proposals = [p for p in result.proposals if kind is None or p.kind == kind]
            if not proposals:
                raise ActionRefused("; ".join(result.notes) or f"nothing to do for {kind}")
        if not dry_run and (refusal := self._concurrency_refusal()):
            raise ActionRefused(refusal)
        return [await self._propose(p, incident.id or None, by, dry_run, approved=not dry_run) for p in proposals]

    def _synthetic(self, element: str, kind: str, topology: FabricTopology) -> Incident:
        """A stand-in incident for a request on an element: every host pair whose paths cross it."""
        hosts = sorted(n.name for n in topology.nodes if n.kind == "host")
        finder = PathFinder(topology)
        paths = [f"{s}:x>{d}:x/0" for s in hosts for d in hosts if s != d and
                 any(element in planner.path_elements(p) for p in finder.paths(s, d))]
        fault = {"host_reroute": "congestion", "drain_link": "corrupting_link"}.get(kind, "congestion")
        now = self.clock()
        return Incident(id=0, dedup_key=f"link:{element}", kind=fault, element=element, element_kind="link",
                        severity="major", summary=f"manual {kind} request", confidence=1.0, paths=paths,
                        opened_ns=now, updated_ns=now, last_seen_ns=now)

    @staticmethod
    def _isolate(element: str, topology: FabricTopology, by: str) -> planner.Proposal:
        switches = {n.name for n in topology.nodes if n.kind == "switch"}
        ends = [parse_end(e) for e in element.split("--")]
        ports = {d: p for d, p in ends if d in switches}
        if not ports:
            raise ActionRefused(f"{element} has no switch port to isolate")
        return planner.Proposal("isolate_port", element, "link", sorted(ports), {"ports": ports},
                                f"isolate requested by {by}")

    async def approve(self, action_id: int, by: str) -> Action:
        action = self._get(action_id)
        if action.state != "awaiting_approval":
            raise ActionRefused(f"action {action_id} is {action.state}, not awaiting approval")
        if refusal := self._concurrency_refusal():
            raise ActionRefused(refusal)
        return await self._approve(action, by, f"approved by {by}")

    async def reject(self, action_id: int, by: str, reason: str = "") -> Action:
        async with self._lock:
            action = self._get(action_id)
            if action.state not in ("proposed", "awaiting_approval"):
                raise ActionRefused(f"action {action_id} is {action.state}: only proposals can be rejected")
            return self._set(action, "rejected", "rejected", by, reason or f"rejected by {by}",
                             result=f"rejected by {by}" + (f": {reason}" if reason else ""))

    async def rollback(self, action_id: int, by: str, reason: str = "") -> Action:
        action = self._get(action_id)
        if action.state != "applied":
            raise ActionRefused(f"action {action_id} is {action.state}: only applied actions can be rolled back")
        return await self._revert(action, "rolled_back", by, reason or f"rolled back by {by}")

    def _get(self, action_id: int) -> Action:
        action = self.state.get_action(action_id)
        if action is None:
            raise KeyError(action_id)
        return action

    def get(self, action_id: int) -> Action | None:
        return self.state.get_action(action_id)

    def events(self, action_id: int) -> list[ActionEventEntry]:
        return self.state.action_events(action_id)
