"""Isolate a switch port through UFM (docs/ufm.md "Isolate"): OpenSM's unhealthy ports.

* `PUT /ufmRest/app/unhealthy_ports {"ports": [NAME], "ports_policy": "UNHEALTHY", "action": "isolate"}`
  isolates a port; `{"ports": [NAME], "ports_policy": "HEALTHY"}` restores it (REFERENCE.md).
* `GET /ufmRest/app/unhealthy_ports`: [{"UnhealthyGUID", "UnhealthyPortNumber", "Condition", ...}]:
  a port is isolated while it is listed.
A port is named like the collector's records: switch `system_name` and port `dname` (the label);
UFM's own port name (`<guid>_<number>`) comes from GET /resources/ports.
"""

from __future__ import annotations

from collectors.base import CollectorBadResponse
from nms.config.models import SwitchConfig


async def _port(client, system: str, dname: str) -> dict:
    for p in await client.get_list("/resources/ports"):
        if isinstance(p, dict) and p.get("system_name") == system and p.get("dname") == dname:
            if not p.get("guid") or not isinstance(p.get("number"), int):
                break
            return p
    raise CollectorBadResponse(client.device, f"UFM knows no port {dname} on {system}")


async def port_isolated(collector, server: SwitchConfig, system: str, dname: str) -> bool:
    client = await collector._client(server)
    port = await _port(client, system, dname)
    listed = await client.get_list("/app/unhealthy_ports")
    return any(isinstance(e, dict) and str(e.get("UnhealthyGUID")) == port["guid"]
               and e.get("UnhealthyPortNumber") == port["number"] for e in listed)


async def set_port_isolated(collector, server: SwitchConfig, system: str, dname: str, isolated: bool) -> None:
    client = await collector._client(server)
    port = await _port(client, system, dname)
    name = port.get("name") or f"{port['guid']}_{port['number']}"
    body = ({"ports": [name], "ports_policy": "UNHEALTHY", "action": "isolate"} if isolated
            else {"ports": [name], "ports_policy": "HEALTHY"})
    await client.put("/app/unhealthy_ports", body)


class UfmIsolator:
    """What the application's switch actuator calls for a UFM-managed device."""

    def __init__(self, collector) -> None:
        self.collector = collector

    async def port_isolated(self, server: SwitchConfig, system: str, dname: str) -> bool:
        return await port_isolated(self.collector, server, system, dname)

    async def set_port_isolated(self, server: SwitchConfig, system: str, dname: str, isolated: bool) -> None:
        await set_port_isolated(self.collector, server, system, dname, isolated)
