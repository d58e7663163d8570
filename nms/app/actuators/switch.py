"""The switch actuators: drain_link and isolate_port through the southbound a device has.

* drain_link: the element is a link `dev:port--dev:port`; on each end whose device is in
  action.targets, the port's ECMP nexthop weight goes to 0 (gNMI Set of the lab's
  /ecmp/uplinks/uplink[name=PORT]/config/weight, collectors/gnmi/setter.py). Revert restores the
  weights read before.
* isolate_port: the element is a port `dev:port` (or a link: its ends on the target devices);
  the port is disabled: gNMI Set of /interfaces/interface[name=PORT]/config/enabled = false, or,
  for a device without gNMI that a UFM server manages (the poller saw it in that UFM's answers),
  UFM's `PUT /ufmRest/app/unhealthy_ports` with action isolate (restored with policy HEALTHY).
* A device with neither: ActuatorError saying so. UFM has no ECMP weights: drain_link needs gNMI.

`before` / `after` are {"ports": {"dev:port": {"weight": w} | {"enabled": b} | {"isolated": b}}}.
"""

from __future__ import annotations

from typing import ClassVar

from collectors.base import CollectorError
from correlator.actions.base import Actuator, ActuatorError


def ports_of(element: str, targets: list[str]) -> list[tuple[str, str]]:
    """(device, port) of the element's ends on the target devices."""
    ends = []
    for end in element.split("--"):
        device, sep, port = end.partition(":")
        if not sep or not device or not port:
            raise ActuatorError(f"element {element!r}: want dev:port or dev:port--dev:port")
        if device in targets:
            ends.append((device, port))
    if not ends:
        raise ActuatorError(f"element {element!r} has no end on the target devices {', '.join(targets) or '(none)'}")
    return ends


class SwitchActuator(Actuator):
    kinds: ClassVar[frozenset[str]] = frozenset({"drain_link", "isolate_port"})

    def __init__(self, poller) -> None:
        self.poller = poller  # the poller's collectors are the southbound (gNMI Set, UFM)
        self._setter = None

    # -- the southbound of a device ------------------------------------------------------------
    def _device(self, name: str):
        for switch in self.poller.config.fabric.switches:
            if switch.name == name:
                return switch
        return None

    def _gnmi(self, name: str):
        device = self._device(name)
        if device is None or device.collectors.gnmi is None or "gnmi" not in self.poller.collectors:
            return None, None
        if self._setter is None:
            from collectors.gnmi.setter import GnmiSetter
            self._setter = GnmiSetter(self.poller.collectors["gnmi"])
        return self._setter, device

    def _ufm(self, name: str):
        """The UFM server (a configured device with the ufm collector) whose polls report `name`."""
        if "ufm" not in self.poller.collectors:
            return None, None
        for manager, covered in self.poller.recent.covered.items():
            device = self._device(manager)
            if name in covered and device is not None and device.collectors.ufm is not None:
                from collectors.ufm.isolate import UfmIsolator
                return UfmIsolator(self.poller.collectors["ufm"]), device
        return None, None

    def _southbound(self, kind: str, name: str):
        setter, device = self._gnmi(name)
        if setter is not None:
            return "gnmi", setter, device
        if kind == "isolate_port":
            ufm, server = self._ufm(name)
            if ufm is not None:
                return "ufm", ufm, server
        need = "gNMI" if kind == "drain_link" else "gNMI or a UFM server that manages it"
        raise ActuatorError(f"{kind} on {name}: the device has no southbound that can do it (needs {need})")

    # -- the contract --------------------------------------------------------------------------
    async def _state(self, kind: str, device: str, port: str) -> dict:
        how, south, dev = self._southbound(kind, device)
        try:
            if how == "ufm":
                return {"isolated": await south.port_isolated(dev, device, port)}
            if kind == "drain_link":
                return {"weight": await south.weight(dev, port)}
            return {"enabled": await south.enabled(dev, port)}
        except CollectorError as e:
            raise ActuatorError(f"reading {device}:{port}: {e}") from None

    async def _change(self, kind: str, device: str, port: str, state: dict) -> None:
        how, south, dev = self._southbound(kind, device)
        try:
            if how == "ufm":
                await south.set_port_isolated(dev, device, port, bool(state["isolated"]))
            elif kind == "drain_link":
                await south.set_weight(dev, port, int(state["weight"]))
            else:
                await south.set_enabled(dev, port, bool(state["enabled"]))
        except CollectorError as e:
            raise ActuatorError(f"changing {device}:{port}: {e}") from None

    async def read(self, action) -> dict:
        ends = ports_of(action.element, action.targets)
        return {"ports": {f"{d}:{p}": await self._state(action.kind, d, p) for d, p in ends}}

    async def apply(self, action) -> dict:
        ends = ports_of(action.element, action.targets)
        for d, p in ends:
            how, _, _ = self._southbound(action.kind, d)
            want = ({"weight": 0} if action.kind == "drain_link" else
                    {"isolated": True} if how == "ufm" else {"enabled": False})
            await self._change(action.kind, d, p, want)
        return await self.read(action)

    async def revert(self, action) -> dict:
        before = (action.before or {}).get("ports") or {}
        for d, p in ports_of(action.element, action.targets):
            state = before.get(f"{d}:{p}")
            if state is None:
                raise ActuatorError(f"no recorded state of {d}:{p} to restore")
            await self._change(action.kind, d, p, state)
        return await self.read(action)
