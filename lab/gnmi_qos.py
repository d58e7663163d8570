"""The openconfig-qos part of the lab's gNMI target (lab/gnmi_target.py): egress queue counters of
the namespace's real qdiscs (`tc -s -j qdisc show`, read as nms/qdisc.py reads them) at

    /qos/interfaces/interface[interface-id=PORT]/output/queues/queue[name=Q]/state/<leaf>

Leaves: name, transmit-pkts, transmit-octets, dropped-pkts, and ecn-marked-pkts where the qdisc counts
marks (none of this kernel's qdiscs does: see docs/lab.md); dropped-octets is never served (Linux does
not count dropped bytes). A queue is a leaf qdisc, named `root` or after its parent class.

The kernel's drop counter is 32-bit; openconfig's are counter64, so the target widens it: a drop
count that went back while the 64-bit transmit counters did not is a wrap (+2^32 from then on); one
that went back with them is a re-created qdisc, and every counter starts again from the kernel's value
(the collector sees a reset and drops that interval).
"""

from __future__ import annotations

import functools
import subprocess
import time
from dataclasses import dataclass

from pygnmi.spec.v080 import gnmi_pb2

from lab.gnmi_tree import PathError, path_text
from nms import qdisc

MODEL = "openconfig-qos"
# QueueSample attribute -> leaf under .../queue[name=Q]/
LEAVES = {"transmit_pkts": "state/transmit-pkts", "transmit_octets": "state/transmit-octets",
          "dropped_pkts": "state/dropped-pkts", "ecn_marked_pkts": "state/ecn-marked-pkts"}
ALL_LEAVES = ("state/name", *LEAVES.values())
# the path down to a queue's leaves: (element, its key or None)
SHAPE = (("qos", None), ("interfaces", None), ("interface", "interface-id"), ("output", None), ("queues", None),
         ("queue", "name"))
U32 = 1 << 32

QueueKey = tuple[str, str]  # (port, queue)
QueueSnapshot = dict[QueueKey, tuple[int, dict[str, int | str]]]  # -> (when read, leaf -> value)


@dataclass(frozen=True)
class QosSelection:
    """What a /qos path selects: a port and a queue (None = every one) and leaves under the queue."""

    interface: str | None
    queue: str | None
    leaves: frozenset[str]


def _names(prefix, path) -> list:
    return [*(prefix.elem if prefix is not None else ()), *path.elem]


def is_qos(prefix, path) -> bool:
    elems = _names(prefix, path)
    return bool(elems) and elems[0].name.split(":", 1)[-1] == "qos"


def select(prefix, path) -> QosSelection:
    """The selection of a /qos path; raises PathError for anything but the output queues' state."""
    text = path_text(prefix, path)
    elems = _names(prefix, path)
    names = [e.name.split(":", 1)[-1] for e in elems]
    keys: dict[str, str | None] = {}
    for i, (name, key) in enumerate(SHAPE):
        if i >= len(elems):
            break
        if names[i] != name:
            raise PathError("NOT_FOUND", f"no such path {text}: this target serves the output queues of "
                                         "/qos/interfaces/interface (openconfig-qos)")
        if set(elems[i].key) - ({key} if key else set()):
            raise PathError("NOT_FOUND", f"no such path {text}: {name} has {'one key, ' + key if key else 'no key'}")
        if key:
            value = elems[i].key.get(key)
            keys[key] = None if value in (None, "*") else value
    rest = names[len(SHAPE):]
    leaves = frozenset(leaf for leaf in ALL_LEAVES if leaf.split("/")[:len(rest)] == rest)
    if not leaves:
        raise PathError("NOT_FOUND", f"no such path {text}")
    return QosSelection(keys.get("interface-id"), keys.get("name"), leaves)


class Queues:
    """Reads the namespace's egress queues (the ports `wanted` keeps) and keeps drop counters 64-bit."""

    def __init__(self, wanted, command=("tc", "-s", "-j", "qdisc", "show")):
        self.wanted, self.command = wanted, list(command)
        self._raw: dict[QueueKey, dict[str, int]] = {}  # the kernel's values last read
        self._wraps: dict[QueueKey, dict[str, int]] = {}  # 32-bit counter -> wraps seen

    def read(self) -> QueueSnapshot:
        out = subprocess.run(self.command, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command)}: exit status {out.returncode}: {out.stderr.strip()[:200]}")
        ts, notes = time.time_ns(), []
        snapshot: QueueSnapshot = {}
        for s in qdisc.queue_samples("lab", out.stdout, ts, self.wanted, notes):
            key = (s.port, s.queue)
            raw = {attr: v for attr in LEAVES if (v := getattr(s, attr)) is not None}
            values: dict[str, int | str] = {"state/name": s.queue}
            for attr, value in self._widen(key, raw).items():
                values[LEAVES[attr]] = value
            snapshot[key] = (ts, values)
        for gone in set(self._raw) - {k for k in snapshot}:
            self._raw.pop(gone, None)
            self._wraps.pop(gone, None)
        return snapshot

    def _widen(self, key: QueueKey, raw: dict[str, int]) -> dict[str, int]:
        prev, wraps = self._raw.get(key, {}), self._wraps.setdefault(key, {})
        if any(raw.get(a, 0) < prev.get(a, 0) for a in raw if a not in qdisc.COUNTER_BITS):
            wraps.clear()  # the 64-bit counters went back too: a new qdisc, not a wrap
        else:
            for attr in qdisc.COUNTER_BITS:
                if attr in raw and raw[attr] < prev.get(attr, 0):
                    wraps[attr] = wraps.get(attr, 0) + 1
        self._raw[key] = raw
        return {a: v + wraps.get(a, 0) * U32 if a in qdisc.COUNTER_BITS else v for a, v in raw.items()}


def wanted_of(selections: list[QosSelection], snapshot: QueueSnapshot) -> dict[QueueKey, frozenset[str]]:
    out: dict[QueueKey, frozenset[str]] = {}
    for sel in selections:
        for key in snapshot:
            if sel.interface in (None, key[0]) and sel.queue in (None, key[1]):
                out[key] = out.get(key, frozenset()) | sel.leaves
    return out


@functools.lru_cache(maxsize=65536)
def prefix_of(port: str, queue: str) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=n, key={k: v} if k else {})
                               for (n, k), v in zip(SHAPE, (None, None, port, None, None, queue))])


LEAF_PATH = {leaf: gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=p) for p in leaf.split("/")]) for leaf in ALL_LEAVES}


def responses(snapshot: QueueSnapshot, selections: list[QosSelection]) -> list[gnmi_pb2.SubscribeResponse]:
    """A SubscribeResponse per selected queue: prefix = the queue, typed scalar updates per leaf."""
    out = []
    for key, leaves in sorted(wanted_of(selections, snapshot).items()):
        ts, values = snapshot[key]
        r = gnmi_pb2.SubscribeResponse()
        n = r.update
        n.timestamp = ts
        n.prefix.CopyFrom(prefix_of(*key))
        for leaf in ALL_LEAVES:
            if leaf in leaves and leaf in values:
                u = n.update.add()
                u.path.CopyFrom(LEAF_PATH[leaf])
                if isinstance(values[leaf], int):
                    u.val.uint_val = values[leaf]
                else:
                    u.val.string_val = values[leaf]
        out.append(r)
    return out
