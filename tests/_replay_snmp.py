"""The SNMP collector's replay transport: an SnmpTarget whose agent is a recorded walk.

The recording is `snmpwalk -On -Ox` output (numeric OIDs, every string in hex, so nothing is lost
to quoting or to a MIB's display hint): `.OID = TYPE: value` lines, a hex string continuing on the
lines after. The replay answers at the target's request seam (`SnmpTarget._send`): a GET with each
OID's value or noSuchObject, a GETBULK with the next recorded OIDs after each asked one, as many
as max-repetitions, then endOfMibView, interleaved as an agent sends them. So the collector's own
walk (its cursors, its end-of-column and non-increasing checks), its `_check` of the answer and all
its parsing run on what the agent answered. No UDP, no engine, no daemon.

Recording one (tests/collector_cases/README.md): snmpwalk -v2c -c COMMUNITY -On -Ox HOST SUBTREE...
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Any

from pysnmp.entity.rfc3413.cmdgen import GetCommandGenerator
from pysnmp.proto import rfc1902
from pysnmp.proto.rfc1902 import ObjectName
from pysnmp.proto.rfc1905 import endOfMibView, noSuchObject

from collectors.base import PollResult
from collectors.snmp.collector import SnmpCollector
from collectors.snmp.transport import Oid, SnmpTarget, oid
from nms.config.models import SwitchConfig

LINE = re.compile(r"^(\.[0-9.]+) = (.*)$")
NOT_THERE = ("No Such Object", "No Such Instance", "No more variables")


def _value(kind: str, text: str, where: str) -> Any:
    text = text.strip()
    if kind == "Hex-STRING":
        return rfc1902.OctetString(bytes.fromhex(text))
    if kind == "STRING":  # without -Ox: a printable string, in quotes
        return rfc1902.OctetString(text[1:-1].replace('\\"', '"').encode() if text.startswith('"') else text.encode())
    if kind == "INTEGER":
        return rfc1902.Integer(int(re.sub(r"^\D*\((-?\d+)\)$", r"\1", text)))  # `up(1)` with MIBs loaded
    if kind == "Timeticks":
        return rfc1902.TimeTicks(int(text.split(")")[0].lstrip("(")))  # `(7) 0:00:00.07`
    numbers = {"Counter32": rfc1902.Counter32, "Counter64": rfc1902.Counter64, "Gauge32": rfc1902.Gauge32,
               "Unsigned32": rfc1902.Unsigned32}
    if kind in numbers:
        return numbers[kind](int(text.split()[0]))
    if kind == "IpAddress":
        return rfc1902.IpAddress(text)
    if kind == "OID":
        return rfc1902.ObjectIdentifier(oid(text))
    raise ValueError(f"{where}: SNMP type {kind!r} is not replayed (record with -On -Ox)")


def parse_walk(text: str, where: str = "walk") -> dict[Oid, Any]:
    """`snmpwalk -On [-Ox]` output as {OID: pysnmp value}."""
    found: dict[Oid, Any] = {}
    entries: list[tuple[str, str, int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if m := LINE.match(line):
            entries.append((m.group(1), m.group(2), number))
        elif line.strip():
            if not entries:
                raise ValueError(f"{where}:{number}: not an `.OID = TYPE: value` line: {line[:80]!r}")
            name, value, first = entries[-1]
            entries[-1] = (name, f"{value} {line}", first)  # a hex string (or a quoted one) goes on
    for name, value, number in entries:
        if value.startswith(NOT_THERE):
            continue
        if value == '""':
            found[oid(name)] = rfc1902.OctetString(b"")
            continue
        kind, sep, rest = value.partition(": ")
        if not sep:
            raise ValueError(f"{where}:{number}: no `TYPE: value` after {name}: {value[:80]!r}")
        found[oid(name)] = _value(kind, rest, f"{where}:{number}")
    return found


class ReplayTarget(SnmpTarget):
    """A device whose agent answers from a recorded walk (see the module's docstring)."""

    def __init__(self, device: str, address: str, settings, walk: dict[Oid, Any]):
        super().__init__(None, device, address, settings)
        self.oids = sorted(walk)
        self.walk_values = walk

    async def transport(self):
        return None

    async def _send(self, generator, transport, var_binds: list, *bulk: int):
        names = [name.asTuple() for name, _ in var_binds]
        if isinstance(generator, GetCommandGenerator):
            return None, 0, 0, [(ObjectName(o), self.walk_values.get(o, noSuchObject)) for o in names]
        _non_repeaters, repetitions = bulk
        answer, cursors = [], list(names)
        for _ in range(repetitions):
            for i, cursor in enumerate(cursors):
                at = bisect.bisect_right(self.oids, cursor)
                if at == len(self.oids):
                    answer.append((ObjectName(cursor), endOfMibView))
                    continue
                cursors[i] = self.oids[at]
                answer.append((ObjectName(cursors[i]), self.walk_values[cursors[i]]))
        return None, 0, 0, answer


async def replay_snmp(device: SwitchConfig, responses: Path) -> PollResult:
    collector = SnmpCollector(max_concurrency=1)
    walk = parse_walk(responses.read_text(), str(responses))
    collector._targets.make = lambda device, settings: ReplayTarget(device.name, device.mgmt_address, settings, walk)
    try:
        return await collector.collect(device)
    finally:
        await collector.close()
