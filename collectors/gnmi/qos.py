"""gNMI notifications of openconfig-qos output queues -> QueueSample (collectors/gnmi/collector.py).

    /qos/interfaces/interface[interface-id=PORT]/output/queues/queue[name=Q]/state/<leaf>

Leaves (openconfig-qos-interfaces; ecn-marked-pkts since 0.11.0): transmit-pkts, transmit-octets,
dropped-pkts, dropped-octets, ecn-marked-pkts; a target that lacks one simply leaves that counter
absent (never 0). As for interfaces (collectors/gnmi/model.py), a prefix and the update paths are
joined, module prefixes dropped, values typed or JSON (uint64 as a string); a value of the wrong
kind is noted with its reason and left out, the rest of the notification kept. Input queues and
other /qos containers are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from collectors.gnmi.model import U64, scalar
from nms.records import PollProblem, QueueSample

MODEL = "openconfig-qos"
PATH = "qos/interfaces/interface/output/queues/queue/state"  # subscribed with SAMPLE, like the port counters
# leaf under the queue -> QueueSample attribute
LEAVES = {"state/transmit-pkts": "transmit_pkts", "state/transmit-octets": "transmit_octets",
          "state/dropped-pkts": "dropped_pkts", "state/dropped-octets": "dropped_octets",
          "state/ecn-marked-pkts": "ecn_marked_pkts"}
SHAPE = ("qos", "interfaces", "interface", "output", "queues", "queue")

QueueKey = tuple[str, str]  # (port, queue)


@dataclass
class Queue:
    """The latest value of each counter of one queue, and when the target read them."""

    counters: dict[str, int] = field(default_factory=dict)
    ts: int | None = None


def _name(elem) -> str:
    return elem.name.split(":", 1)[-1]


def locate(elems) -> tuple[QueueKey | None, list[str]] | None:
    """((port, queue), the names under the queue) of a whole path into the output queues (prefix and
    update joined); the key is None when the path lacks one; None for any other path."""
    names = [_name(e) for e in elems]
    if len(names) < len(SHAPE) or names[:len(SHAPE)] != list(SHAPE):
        return None
    port, queue = elems[2].key.get("interface-id"), elems[5].key.get("name")
    return ((port, queue) if port and queue else None), names[len(SHAPE):]


def _counter(raw: Any) -> int:
    number = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= U64:
        raise ValueError(f"expected an unsigned integer, got {raw!r}")
    return number


def apply(queues: dict[QueueKey, Queue], notification,
          wanted=lambda name: True) -> tuple[set[QueueKey], list[PollProblem]]:
    """Fold one Notification into `queues`; returns the queues whose counters it carried, and the
    values it left out (with why)."""
    touched: set[QueueKey] = set()
    problems: list[PollProblem] = []
    prefix = list(notification.prefix.elem) if notification.HasField("prefix") else []
    if prefix and _name(prefix[0]) != "qos":
        return touched, problems  # the common case (interfaces): one look per notification
    for upd in notification.update:
        found = locate(prefix + list(upd.path.elem))
        if found is None or found[0] is None:
            continue
        key, rest = found
        leaf = "/".join(rest)
        if leaf not in LEAVES or not wanted(key[0]):
            continue
        try:
            value = _counter(scalar(upd.val))
        except (ValueError, json.JSONDecodeError) as e:
            problems.append(PollProblem(what=f"{key[0]} queue {key[1]} {leaf}", reason=str(e)))
            continue
        queues.setdefault(key, Queue()).counters[LEAVES[leaf]] = value
        touched.add(key)
    for key in touched:
        queues[key].ts = notification.timestamp or None
    for path in notification.delete:  # a queue removed: forget it
        found = locate(prefix + list(path.elem))
        if found is not None and found[0] is not None and not found[1]:
            queues.pop(found[0], None)
    return touched, problems


def samples(device: str, queues: dict[QueueKey, Queue], keys, now: int) -> list[QueueSample]:
    """A QueueSample per queue of `keys` that has counters, stamped when the target read them; a
    name the records cannot carry is skipped."""
    out = []
    for key in sorted(keys):
        q = queues.get(key)
        if q is None or not q.counters:
            continue
        try:
            out.append(QueueSample(device=device, port=key[0], queue=key[1], ts=q.ts or now, **q.counters))
        except ValueError:
            continue
    return out
