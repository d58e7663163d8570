"""/actions: the actions the controller proposed or took, their audit log, manual requests,
approvals, rejections and rollbacks (correlator.actions.manager keeps the lifecycle; docs/actions.md).
Reading needs `read`; everything that changes an action needs `act` (not a host-bound token), and
the token's name is recorded as who did it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from correlator.actions.manager import ActionManager, ActionRefused
from nms.app.api.deps import ActionsDep
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, ErrorDetail, Principal, require
from nms.app.binding import require_unbound
from nms.records import Action, ActionKind, ActionState
from nms.state import ActionEventEntry

router = APIRouter(prefix="/actions", tags=["actions"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})
ActionId = Annotated[int, Path(ge=1, le=2**63 - 1)]
NOT_FOUND = {404: {"model": ErrorDetail, "description": "no such action (or incident)"}}
REFUSED = {409: {"model": ErrorDetail, "description": "refused: policy off, blast-radius limits, concurrency "
                                                      "limit, or the action's state does not allow it"}}
CHANGE = {**NOT_FOUND, **REFUSED, 403: {"model": ErrorDetail, "description": "token lacks scope act, or is "
                                                                            "bound to a host"}}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ActionRequest(Strict):
    """Either an incident to plan for, or an element with the kind of action."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["incident_id"], "properties": {"incident_id": {"type": "integer"}, "element": {"type": "null"}}},
        {"required": ["element", "kind"], "properties": {"element": {"type": "string"}, "kind": {"type": "string"},
                                                         "incident_id": {"type": "null"}}}]})

    incident_id: int | None = Field(
        None, ge=1, le=2**63 - 1, description="plan for this incident (kind: only that kind)"
    )
    element: str | None = Field(None, min_length=1, max_length=512, description="a link `dev:port--dev:port`")
    kind: ActionKind | None = Field(None, description="required with element")
    dry_run: bool = Field(False, description="record the proposal, send nothing")

    @model_validator(mode="after")
    def _target(self) -> ActionRequest:
        if (self.incident_id is None) == (self.element is None):
            raise ValueError("give incident_id or element, not both")
        if self.element is not None and self.kind is None:
            raise ValueError("kind is required with element")
        return self


class Reason(Strict):
    reason: str = Field("", max_length=1024, description="kept in the audit log")


def _action(actions: ActionManager, action_id: int) -> Action:
    action = actions.get(action_id)
    if action is None:
        raise HTTPException(404, f"no action {action_id}")
    return action


@router.get("", response_model=list[Action], dependencies=[Depends(require("read"))], summary="Actions, newest first")
def list_actions(
    actions: ActionsDep,
    state: ActionState | None = None,
    kind: ActionKind | None = None,
    incident_id: int | None = Query(None, ge=1, le=2**63 - 1),
    element: str | None = Query(None, max_length=512),
    limit: int = Query(1000, ge=1, le=100_000),
) -> list[Action]:
    return actions.state.list_actions(state=state, kind=kind, incident_id=incident_id, element=element,
                                      limit=limit)


@router.get("/{action_id}", response_model=Action, dependencies=[Depends(require("read"))], responses=NOT_FOUND,
            summary="One action")
def get_action(action_id: ActionId, actions: ActionsDep) -> Action:
    return _action(actions, action_id)


@router.get("/{action_id}/events", response_model=list[ActionEventEntry], dependencies=[Depends(require("read"))],
            responses=NOT_FOUND, summary="An action's audit log, oldest first: who, what, why, before/after")
def action_events(action_id: ActionId, actions: ActionsDep) -> list[ActionEventEntry]:
    _action(actions, action_id)
    return actions.events(action_id)


async def _change(coro):
    try:
        return await coro
    except KeyError as e:
        raise HTTPException(404, f"no such action or incident: {e.args[0]}") from None
    except ActionRefused as e:
        raise HTTPException(409, str(e)) from None


@router.post("", response_model=list[Action], responses=CHANGE,
             summary="Request actions for an incident, or one kind on an element (approved by the requester)")
async def request_actions(body: ActionRequest, actions: ActionsDep,
                          who: Principal = Depends(require_unbound("act"))) -> list[Action]:
    return await _change(actions.request(who.name, incident_id=body.incident_id, element=body.element,
                                         kind=body.kind, dry_run=body.dry_run))


@router.post("/{action_id}/approve", response_model=Action, responses=CHANGE, summary="Approve and apply")
async def approve(action_id: ActionId, actions: ActionsDep,
                  who: Principal = Depends(require_unbound("act"))) -> Action:
    return await _change(actions.approve(action_id, who.name))


@router.post("/{action_id}/reject", response_model=Action, responses=CHANGE, summary="Reject a proposal")
async def reject(action_id: ActionId, actions: ActionsDep, body: Reason | None = None,
                 who: Principal = Depends(require_unbound("act"))) -> Action:
    return await _change(actions.reject(action_id, who.name, body.reason if body else ""))


@router.post("/{action_id}/rollback", response_model=Action, responses=CHANGE, summary="Undo an applied action")
async def rollback(action_id: ActionId, actions: ActionsDep, body: Reason | None = None,
                   who: Principal = Depends(require_unbound("act"))) -> Action:
    return await _change(actions.rollback(action_id, who.name, body.reason if body else ""))
