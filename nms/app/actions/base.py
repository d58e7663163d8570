"""Actuator contract (issue #13). Minimal copy on branch actsouth2; actcore's
version replaces it at merge."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the Action record comes with actcore's nms/records.py hunk
    from nms.records import Action


class ActuatorError(Exception):
    """An action could not be read, applied or reverted; the text is a reason, never a secret."""


class Actuator(ABC):
    kinds: ClassVar[frozenset[str]]

    @abstractmethod
    async def read(self, action: Action) -> dict:
        """The state the action would change (its "before")."""

    @abstractmethod
    async def apply(self, action: Action) -> dict:
        """Do it; return the "after" state; raise ActuatorError."""

    @abstractmethod
    async def revert(self, action: Action) -> dict:
        """Restore action.before; return the state after."""
