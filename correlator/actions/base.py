"""The actuator contract: one actuator per action kind changes the network and can undo it.

The ActionManager (manager.py) calls `read` (the state the action would change: its "before"),
`apply` (do it; the "after") and `revert` (restore `action.before`). Actuators are built with the
application and passed in (a dict kind -> actuator; docs/ARCHITECTURE.md names the modules):
host_reroute by signed agent commands, drain_link / isolate_port through the southbound.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from nms.records import Action


class ActuatorError(Exception):
    """Why an actuator could not read, apply or revert (reason text for the audit log; never a secret).
    `state`: what was changed anyway (a partial apply), recorded as the action's "after"."""

    def __init__(self, reason: str, state: dict | None = None):
        super().__init__(reason)
        self.state = state or {}


class Actuator(ABC):
    kinds: ClassVar[frozenset[str]]

    @abstractmethod
    async def read(self, action: Action) -> dict:
        """The state the action would change (its "before")."""

    @abstractmethod
    async def apply(self, action: Action) -> dict:
        """Do it; returns the "after" state; raises ActuatorError."""

    @abstractmethod
    async def revert(self, action: Action) -> dict:
        """Restore `action.before`; returns the state after; raises ActuatorError."""
