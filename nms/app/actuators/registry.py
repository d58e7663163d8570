"""Which actuator carries out which action kind: built with the Service (one line per actuator)."""

from __future__ import annotations

from correlator.actions.base import Actuator
from nms.app.actuators.host import HostRerouteActuator
from nms.app.actuators.switch import SwitchActuator


def build_actuators(agents, poller, command_ttl: float) -> dict[str, Actuator]:
    """kind -> actuator: host_reroute by signed agent commands (the agent registry), drain_link /
    isolate_port by the switches' southbound (the poller's gNMI and UFM collectors)."""
    host = HostRerouteActuator(agents, timeout=min(60.0, command_ttl))
    return {"host_reroute": host, **dict.fromkeys(SwitchActuator.kinds, SwitchActuator(poller))}
