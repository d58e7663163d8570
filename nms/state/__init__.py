"""The service's durable state (jobs, agent commands, incidents, actions): `StateStore` over SQLite
(the single-node default) or PostgreSQL (shared by a cluster's processes)."""

from nms.state.db import StateUnavailable, open_sqlite
from nms.state.entries import ActionEventEntry, AgentCommand, CommandStatus, IncidentEventEntry
from nms.state.incidents import IncidentWriter
from nms.state.migrations import SchemaError
from nms.state.store import StateStore

__all__ = ["ActionEventEntry", "AgentCommand", "CommandStatus", "IncidentEventEntry", "IncidentWriter",
           "SchemaError", "StateStore", "StateUnavailable", "open_sqlite"]
