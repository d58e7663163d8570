"""Which actuator carries out which action kind: built with the Service (one line per actuator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nms.app.actions.base import Actuator
from nms.app.actions.host import HostRerouteActuator

if TYPE_CHECKING:
    from nms.app.service import Service


def build_actuators(service: Service) -> dict[str, Actuator]:
    """kind -> actuator. drain_link / isolate_port (nms/app/actions/switch.py) add their entries here."""
    host = HostRerouteActuator(service.agents, timeout=min(60.0, service.config.agents.command_ttl))
    return {"host_reroute": host}
