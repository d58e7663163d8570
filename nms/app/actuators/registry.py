"""Which actuator carries out which action kind: built with the Service (one line per actuator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nms.app.actions.base import Actuator
from nms.app.actions.host import HostRerouteActuator
from nms.app.actions.switch import SwitchActuator

if TYPE_CHECKING:
    from nms.app.service import Service


def build_actuators(service: Service) -> dict[str, Actuator]:
    """kind -> actuator: host_reroute by signed agent commands, drain_link / isolate_port by the
    switches' southbound (gNMI Set, UFM)."""
    host = HostRerouteActuator(service.agents, timeout=min(60.0, service.config.agents.command_ttl))
    return {"host_reroute": host, **dict.fromkeys(SwitchActuator.kinds, SwitchActuator(service))}
