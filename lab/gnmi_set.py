"""gNMI Set (and Get of the same leaves) for the lab target: the two things the actuators change
(docs/gnmi.md "Set").

* `/interfaces/interface[name=X]/config/enabled` (openconfig-interfaces, boolean): `ip link set X
  up|down` in the switch's namespace: isolate a port and bring it back. Taking a port down deletes
  the kernel's routes through it, so in a lab (--lab-dir) enabling it reprograms this switch's routes.
* `/ecmp/uplinks/uplink[name=X]/config/weight` (lab-specific, no OpenConfig model exists for ECMP
  nexthop weights: REFERENCE.md), uint 0..256 on a leaf's uplink port: that nexthop's weight in
  every ECMP route (`ip route replace P nexthop via .. weight W ..`); 0 drains the uplink both
  ways, as a graceful shutdown of its BGP session: its nexthop leaves this leaf's groups, and the
  other leaves stop reaching this leaf through that spine (every leaf's routes are reprogrammed).
  Kept in the lab state (`ecmp_weights`), so lab/routing.py applies it on every recompute (a
  failover does not undo it). Served only with --lab-dir and --node.

Values are accepted typed (bool_val, uint_val / int_val) or as JSON (json_val, json_ietf_val);
Get answers typed scalars whatever the encoding. A SetRequest is checked whole before anything is
applied: an unknown path is NOT_FOUND, a bad value INVALID_ARGUMENT, draining a leaf's last uplink in
service FAILED_PRECONDITION, delete UNIMPLEMENTED.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pygnmi.spec.v080 import gnmi_pb2

from lab.gnmi_tree import PathError, path_text

IFF_UP = 0x1
MAX_WEIGHT = 256  # the kernel's nexthop weight range is 1..256


def _names(prefix, path) -> list[str]:
    elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
    return [e.name.split(":", 1)[-1] for e in elems]


def handles(prefix, path) -> bool:
    """Whether prefix + path is one of this module's leaves (config/enabled, /ecmp)."""
    names = _names(prefix, path)
    return bool(names) and (names[0] == "ecmp" or (names[:2] == ["interfaces", "interface"]
                                                     and names[2:3] == ["config"]))


@dataclass(frozen=True)
class Leaf:
    kind: str  # "enabled" | "weight"
    port: str
    path: gnmi_pb2.Path  # the full path, as it goes back in answers


def parse(prefix, path) -> Leaf:
    text = path_text(prefix, path)
    elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
    names = _names(prefix, path)
    full = gnmi_pb2.Path(elem=elems)
    if names[:2] == ["interfaces", "interface"] and names[2:] == ["config", "enabled"]:
        kind = "enabled"
    elif names == ["ecmp", "uplinks", "uplink", "config", "weight"]:
        kind = "weight"
    else:
        raise PathError("NOT_FOUND", f"no such path {text}: this target sets /interfaces/interface[name=X]/config/"
                                     "enabled and /ecmp/uplinks/uplink[name=X]/config/weight")
    key = dict(elems[2 if kind == "weight" else 1].key)
    if set(key) != {"name"} or key["name"] in ("", "*"):
        raise PathError("INVALID_ARGUMENT", f"{text}: name one {'uplink' if kind == 'weight' else 'interface'} "
                                            "(key name, no wildcard)")
    return Leaf(kind, key["name"], full)


def _decode(tv: gnmi_pb2.TypedValue, text: str):
    which = tv.WhichOneof("value")
    if which in ("json_val", "json_ietf_val"):
        try:
            return json.loads(getattr(tv, which))
        except ValueError:
            raise PathError("INVALID_ARGUMENT", f"{text}: the JSON value does not parse") from None
    if which in ("bool_val", "uint_val", "int_val"):
        return getattr(tv, which)
    raise PathError("INVALID_ARGUMENT", f"{text}: unsupported value type {which}")


def value_of(leaf: Leaf, tv: gnmi_pb2.TypedValue):
    text = path_text(None, leaf.path)
    v = _decode(tv, text)
    if leaf.kind == "enabled":
        if not isinstance(v, bool):
            raise PathError("INVALID_ARGUMENT", f"{text}: want a boolean, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_WEIGHT:
        raise PathError("INVALID_ARGUMENT", f"{text}: want a weight 0..{MAX_WEIGHT} (0 drains), got {v!r}")
    return v


class LabSet:
    """Reads and applies the settable leaves in this namespace; `lab_dir`/`node` place it in a lab."""

    def __init__(self, kernel, lab_dir: str | Path | None = None, node: str | None = None):
        self.kernel, self.node = kernel, node
        self.lab_dir = Path(lab_dir) if lab_dir else None

    def _check_port(self, leaf: Leaf, topo=None, state=None) -> None:
        text = path_text(None, leaf.path)
        if leaf.kind == "enabled":
            if not self.kernel.wanted(leaf.port) or leaf.port not in self.kernel.names():
                raise PathError("NOT_FOUND", f"{text}: no interface {leaf.port!r} here")
            return
        if self.lab_dir is None or self.node is None:
            raise PathError("NOT_FOUND", f"{text}: this target serves no ECMP weights (not started with --lab-dir)")
        if leaf.port not in self._uplinks(topo):
            raise PathError("NOT_FOUND", f"{text}: {leaf.port!r} is not an uplink of {self.node} "
                                         f"(uplinks: {', '.join(sorted(self._uplinks(topo))) or 'none'})")

    def _uplinks(self, topo) -> dict[str, str]:
        """This leaf's uplink ports -> their link names."""
        return {link.a.name: link.name for link in topo.links if link.kind == "fabric" and link.a.node == self.node}

    def _lab(self):
        from lab.state import LabDir, topology_of
        lab = LabDir(self.lab_dir)
        return lab, topology_of(lab.load())

    def read(self, leaf: Leaf):
        if leaf.kind == "enabled":
            self._check_port(leaf)
            flags = int(Path(f"{self.kernel.root}/{leaf.port}/flags").read_text(), 16)
            return bool(flags & IFF_UP)
        lab, topo = self._lab()
        self._check_port(leaf, topo)
        return int(lab.load().get("ecmp_weights", {}).get(self.node, {}).get(leaf.port, 1))

    def get(self, prefix, paths) -> gnmi_pb2.GetResponse:
        out = []
        for p in paths:
            leaf = parse(prefix, p)
            v = self.read(leaf)
            n = gnmi_pb2.Notification(timestamp=time.time_ns())
            u = n.update.add()
            u.path.CopyFrom(leaf.path)
            if leaf.kind == "enabled":
                u.val.bool_val = v
            else:
                u.val.uint_val = v
            out.append(n)
        return gnmi_pb2.GetResponse(notification=out)

    def set(self, request: gnmi_pb2.SetRequest) -> gnmi_pb2.SetResponse:
        prefix = request.prefix if request.HasField("prefix") else None
        if request.delete:
            raise PathError("UNIMPLEMENTED", "delete is not supported: set the value (enabled true, weight 1)")
        ops = [(gnmi_pb2.UpdateResult.REPLACE, u) for u in request.replace]
        ops += [(gnmi_pb2.UpdateResult.UPDATE, u) for u in request.update]
        if not ops:
            raise PathError("INVALID_ARGUMENT", "empty SetRequest")
        changes = []
        for op, u in ops:
            leaf = parse(prefix, u.path)
            changes.append((op, leaf, value_of(leaf, u.val)))
        if any(leaf.kind == "weight" for _, leaf, _ in changes):
            lab, topo = self._lab()
            with lab.update() as state:  # check and apply under the lab's lock
                for _, leaf, _ in changes:
                    self._check_port(leaf, topo)
                self._set_weights(topo, state, [(leaf.port, v) for _, leaf, v in changes if leaf.kind == "weight"])
        else:
            for _, leaf, _ in changes:
                self._check_port(leaf)
        for _, leaf, v in changes:
            if leaf.kind == "enabled":
                self._set_enabled(leaf.port, v)
        return gnmi_pb2.SetResponse(prefix=prefix, timestamp=time.time_ns(),
                                    response=[gnmi_pb2.UpdateResult(path=leaf.path, op=op) for op, leaf, _ in changes])

    def _set_weights(self, topo, state: dict, new: list[tuple[str, int]]) -> None:
        from lab import routing
        weights = {k: dict(v) for k, v in state.get("ecmp_weights", {}).items()}
        mine = weights.setdefault(self.node, {})
        for port, w in new:
            if w == 1:
                mine.pop(port, None)
            else:
                mine[port] = w
        uplinks = self._uplinks(topo)
        in_service = [p for p, link in uplinks.items() if link not in state.get("withdrawn", [])]
        if in_service and all(mine.get(p, 1) == 0 for p in in_service):
            raise PathError("FAILED_PRECONDITION", f"draining {', '.join(p for p, _ in new)} would leave "
                                                   f"{self.node} no uplink in service")
        if not mine:
            del weights[self.node]
        # every leaf: a drained uplink is avoided both ways (lab/routing.py, graceful shutdown)
        routing.apply(topo, state.get("withdrawn", []), nodes=[n.name for n in topo.by_role("leaf")],
                      weights=weights)
        state["ecmp_weights"] = weights

    def _set_enabled(self, port: str, up: bool) -> None:
        subprocess.run(["ip", "link", "set", "dev", port, "up" if up else "down"], check=True,
                       capture_output=True, timeout=10)
        if up and self.lab_dir is not None and self.node is not None:
            from lab import routing
            lab, topo = self._lab()
            with lab.update() as state:  # admin-down deleted the routes through the port
                routing.apply(topo, state.get("withdrawn", []), nodes=[self.node],
                              weights=state.get("ecmp_weights"))
