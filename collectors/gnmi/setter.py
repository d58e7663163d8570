"""gNMI Set through the collector's sessions (same target, TLS and credentials as the streams):
what the application's switch actuators (docs/actions.md) read and change (docs/gnmi.md "Set").

* `enabled(device, port)` / `set_enabled(device, port, on)`: openconfig-interfaces
  /interfaces/interface[name=X]/config/enabled (isolate a port, bring it back).
* `weight(device, port)` / `set_weight(device, port, w)`: the lab's ECMP nexthop weight of an uplink,
  /ecmp/uplinks/uplink[name=X]/config/weight (0 drains it). No OpenConfig model exists for this
  (REFERENCE.md): a real fabric needs its vendor's path here (SONiC, Cumulus NVUE).

Get answers are read as typed scalars or JSON; every gRPC failure becomes the collector error of its
kind (auth, timeout, unreachable, bad response), with the target's reason and no secret.
"""

from __future__ import annotations

import json

import grpc
from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import CollectorBadResponse
from nms.config.models import SwitchConfig


def enabled_path(port: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="interfaces"),
                               gnmi_pb2.PathElem(name="interface", key={"name": port}),
                               gnmi_pb2.PathElem(name="config"), gnmi_pb2.PathElem(name="enabled")])


def weight_path(port: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="ecmp"), gnmi_pb2.PathElem(name="uplinks"),
                               gnmi_pb2.PathElem(name="uplink", key={"name": port}),
                               gnmi_pb2.PathElem(name="config"), gnmi_pb2.PathElem(name="weight")])


def _scalar(tv: gnmi_pb2.TypedValue):
    which = tv.WhichOneof("value")
    if which in ("json_val", "json_ietf_val"):
        return json.loads(getattr(tv, which))
    return getattr(tv, which) if which else None


class GnmiSetter:
    """Get/Set of single leaves on the devices the gNMI collector (collectors/gnmi/collector.py) knows."""

    def __init__(self, collector) -> None:
        self.collector = collector

    async def _get(self, device: SwitchConfig, path: gnmi_pb2.Path):
        session = await self.collector.session(device)
        request = gnmi_pb2.GetRequest(path=[path], encoding=gnmi_pb2.JSON_IETF)
        try:
            answer = await session.stub.Get(request, metadata=session.metadata, timeout=session.settings.timeout)
        except grpc.aio.AioRpcError as e:
            raise session.error("Get", e) from None
        for n in answer.notification:
            for u in n.update:
                return _scalar(u.val)
        raise CollectorBadResponse(device.name, f"{session.target}: Get answered no value")

    async def _set(self, device: SwitchConfig, path: gnmi_pb2.Path, value: gnmi_pb2.TypedValue) -> None:
        session = await self.collector.session(device)
        request = gnmi_pb2.SetRequest(update=[gnmi_pb2.Update(path=path, val=value)])
        try:
            await session.stub.Set(request, metadata=session.metadata, timeout=session.settings.timeout)
        except grpc.aio.AioRpcError as e:
            raise session.error("Set", e) from None

    async def enabled(self, device: SwitchConfig, port: str) -> bool:
        v = await self._get(device, enabled_path(port))
        if not isinstance(v, bool):
            raise CollectorBadResponse(device.name, f"config/enabled of {port} is {v!r}, not a boolean")
        return v

    async def set_enabled(self, device: SwitchConfig, port: str, on: bool) -> None:
        await self._set(device, enabled_path(port), gnmi_pb2.TypedValue(bool_val=on))

    async def weight(self, device: SwitchConfig, port: str) -> int:
        v = await self._get(device, weight_path(port))
        if isinstance(v, bool) or not isinstance(v, int):
            raise CollectorBadResponse(device.name, f"ECMP weight of {port} is {v!r}, not an integer")
        return v

    async def set_weight(self, device: SwitchConfig, port: str, weight: int) -> None:
        await self._set(device, weight_path(port), gnmi_pb2.TypedValue(uint_val=weight))
