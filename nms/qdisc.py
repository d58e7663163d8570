"""Linux egress queues: `tc -s -j qdisc show` -> QueueSample, for the CLI collector's linux platform
(collectors/cli/linux.py) and the lab's gNMI target (lab/gnmi_qos.py), so both read a Linux
switch's queues the same way.

A port's queues are its egress qdiscs that hold packets themselves: the leaves of its qdisc tree
(a TBF or pfifo at the root is the port's one queue; under HTB, the qdisc of each class). Ingress and
clsact (filters, no queue) and noqueue are not queues. A queue is named after where it hangs, so the
name survives a qdisc being replaced: `root`, or the parent class (`1:10`). Classes without a qdisc of
their own (HTB's default pfifo is not listed) are not seen.

Counters: `bytes` -> transmit_octets and `packets` -> transmit_pkts (64-bit: TCA_STATS_BASIC and
TCA_STATS_PKT64), `drops` -> dropped_pkts (32-bit: gnet_stats_queue). ECN marks exist only in the
extended statistics of an AQM qdisc (fq_codel, codel, pie, fq_pie: `ecn_mark`; red, choke: `marked`,
32-bit); other qdiscs (tbf, htb, pfifo) leave ecn_marked_pkts absent. Linux counts no dropped octets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nms.records import U64_MAX, QueueSample

# the counter widths the kernel gives (a 32-bit one wraps; nms/counters.py handles it)
COUNTER_BITS = {"dropped_pkts": 32, "ecn_marked_pkts": 32}
NOT_QUEUES = ("ingress", "clsact", "noqueue")
ECN_KEYS = ("ecn_mark", "marked")  # extended statistics of the AQM qdiscs that mark
BASIC = {"bytes": "transmit_octets", "packets": "transmit_pkts", "drops": "dropped_pkts"}


class QdiscError(ValueError):
    """Output that cannot be used at all."""


def _counter(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX else None


def _major(handle: str) -> str:
    return handle.split(":", 1)[0]


def queues(items: Any, notes: list[str], dev: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(port, queue name) -> the qdisc's JSON object, for the leaf egress qdiscs of the parsed output
    (`dev`: the output of `tc ... show dev DEV`, whose items name no device)."""
    if not isinstance(items, list):
        raise QdiscError(f"expected a JSON list of qdiscs, got {type(items).__name__}")
    egress: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(items):
        port = item.get("dev", dev) if isinstance(item, dict) else None
        if not isinstance(port, str) or not port or not isinstance(item.get("kind"), str):
            notes.append(f"item {i}: no 'dev' or 'kind'")
            continue
        if item["kind"] not in NOT_QUEUES and not str(item.get("parent", "")).startswith("ffff:"):
            egress.append((port, item))
    parents = {(port, _major(str(item.get("parent", "")))) for port, item in egress if not item.get("root")}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for port, item in egress:
        handle = str(item.get("handle", ""))
        if (port, _major(handle)) in parents and handle not in ("", "0:"):
            continue  # classful, with qdiscs under it: those are the queues
        name = "root" if item.get("root") else str(item.get("parent", ""))
        if not name:
            notes.append(f"{port} {item['kind']} {handle}: neither root nor a parent")
            continue
        out[(port, name)] = item
    return out


def queue_samples(device: str, text: str, ts: int, keep: Callable[[str], bool], notes: list[str],
                  dev: str | None = None) -> list[QueueSample]:
    """`tc -s -j qdisc show [dev DEV]` -> a QueueSample per egress queue of a kept port. A counter that
    is not an unsigned integer is left out with a note; a queue with none is left out."""
    try:
        items = json.loads(text) if text.strip() else []
    except ValueError as e:
        raise QdiscError(f"not JSON ({e})") from None
    out = []
    for (port, name), item in sorted(queues(items, notes, dev).items()):
        if not keep(port):
            continue
        values: dict[str, int] = {}
        for key, field in BASIC.items():
            if key not in item:
                continue
            if (value := _counter(item[key])) is None:
                notes.append(f"{port} queue {name}: {key} {item[key]!r} is not a counter")
            else:
                values[field] = value
        for key in ECN_KEYS:
            if (value := _counter(item.get(key))) is not None:
                values["ecn_marked_pkts"] = value
                break
        if not values:
            notes.append(f"{port} queue {name}: no counters (run tc with -s)")
            continue
        try:
            out.append(QueueSample(device=device, port=port[:128], queue=name[:128], ts=ts, **values))
        except ValueError as e:  # a name the records cannot carry
            notes.append(f"{port!r} queue {name!r}: {str(e).splitlines()[0]}")
    return out
