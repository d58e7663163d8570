"""The rows of the state store as records: agent commands, incident and action events."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from nms.records import ActionEvent, IncidentEvent

CommandStatus = Literal["pending", "delivered", "done", "failed", "expired"]
COMMAND_COLUMNS = "id, host, kind, args, issued_ns, by, status, delivered_ns, result_ns, message, details"


class AgentCommand(BaseModel):
    """A command for one host's probe agent, and what became of it."""

    id: int = Field(description="rises with every command; never reused, also across service restarts")
    host: str
    kind: str
    args: dict[str, Any] = Field(default_factory=dict)
    issued_ns: int
    by: str = Field(description="name of the token that issued it")
    status: CommandStatus = Field("pending",
                                  description="pending -> delivered -> done | failed; pending -> expired")
    delivered_ns: int | None = Field(None, description="when an agent's long-poll first received it")
    result_ns: int | None = Field(None, description="when it was done or failed (agent's report), or expired")
    message: str = Field("", description="the agent's result message, or why it expired")
    details: dict[str, Any] | None = Field(None, description="what the agent added to its result")
    envelope: dict[str, Any] | None = Field(None, description="the service's signature (nms.signing), added "
                                                    "when an agent receives it; agents verify it before acting")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> AgentCommand:
        cid, host, kind, args, issued, by, status, delivered, result, message, details = row
        return cls(id=cid, host=host, kind=kind, args=json.loads(args), issued_ns=issued, by=by, status=status,
                   delivered_ns=delivered, result_ns=result, message=message,
                   details=None if details is None else json.loads(details))


class ActionEventEntry(ActionEvent):
    """An action event as the audit log keeps it."""

    id: int = Field(description="rises with every event, never reused")
    note: str = Field("", description="why: the decision's reason in words")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ActionEventEntry:
        eid, note, body = row
        return cls.model_validate({**json.loads(body), "id": eid, "note": note})


class IncidentEventEntry(IncidentEvent):
    """An incident event as the history keeps it."""

    id: int = Field(description="rises with every event, never reused: the `id:` of the event stream")
    comment: str | None = Field(None, description="the acknowledger's comment")

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> IncidentEventEntry:
        eid, comment, body = row
        return cls.model_validate({**json.loads(body), "id": eid, "comment": comment})
