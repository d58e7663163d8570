"""Host-bound tokens (`api.tokens[].host`): what a token bound to one host may do.

A host probe agent's token is bound to its host. It may use only `/agents/<its host>/...` (other
hosts' paths and the fleet-wide /agents routes answer 403), and on /ingest each record must be
its host's own, by the rules below; an item that breaks them is rejected with the reason while
the rest of the batch is kept. Tokens without a host keep every right their scopes give.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, HTTPException

from nms.app.auth import Principal, require
from nms.records import (
    ClockEdge,
    ClockSolution,
    GenericPoint,
    HostNicSample,
    NcclCollective,
    NcclComm,
    NcclProxyOp,
    NcclProxyStep,
    NcclRdmaQp,
    NcclStepStats,
    PathEvent,
    PortRates,
    PortSample,
    ProbePath,
    ProbeWindow,
)

# the attribute that names the host a record comes from
HOST_FIELD: dict[type, str] = {ProbeWindow: "src_host", PathEvent: "src_host", ProbePath: "src_host",
                               ClockEdge: "host_a", HostNicSample: "host", NcclComm: "host", NcclCollective: "host",
                               NcclProxyOp: "host", NcclProxyStep: "host",
                               NcclStepStats: "host", NcclRdmaQp: "host"}
REFUSED: dict[type, str] = {
    ClockSolution: "clock solutions are computed by the service",
    PortSample: "switch data is not a host's to send",
    PortRates: "switch data is not a host's to send",
}


def require_unbound(scope: str):
    """A route dependency: `scope` required, and no host-bound token (e.g. job metadata, which is
    fleet-wide: a host's agent token has no business writing it)."""
    check = require(scope)

    def dependency(who: Principal = Depends(check)) -> Principal:
        if who.host is not None:
            raise HTTPException(403, f"token {who.name!r} is bound to host {who.host!r}: not allowed here")
        return who

    return dependency


def check_agent_path(who: Principal, host: str | None) -> None:
    """403 unless `who` may use /agents/{host}/... (host None: a fleet-wide /agents route)."""
    if who.host is None or who.host == host:
        return
    if host is None:
        raise HTTPException(403, f"token {who.name!r} is bound to host {who.host!r}: it may use only "
                                 f"/agents/{who.host}/...")
    raise HTTPException(403, f"token {who.name!r} is bound to host {who.host!r}: it may not act for host {host!r}")


def foreign(record: Any, host: str) -> str | None:
    """Why a token bound to `host` may not send `record`; None when it may."""
    kind = type(record)
    if kind in REFUSED:
        return f"a token bound to host {host!r} may not send {kind.__name__} records: {REFUSED[kind]}"
    if isinstance(record, GenericPoint):
        where, named = "tags.host", record.tags.get("host")
        if named is None:
            return f"tags.host: missing; a token bound to host {host!r} may send only points tagged host={host}"
    elif kind in HOST_FIELD:
        where = HOST_FIELD[kind]
        named = getattr(record, where)
    else:
        return f"a token bound to host {host!r} may not send {kind.__name__} records (no host rule for them)"
    if named != host:
        return f"{where}: {named!r} is not {host!r}, the host this token is bound to"
    return None


def own_records(items: list[tuple[int, Any]], host: str) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """Split validated (index, record) items into those of `host` and (index, reason) for the others."""
    kept, refused = [], []
    for index, record in items:
        reason = foreign(record, host)
        if reason is None:
            kept.append((index, record))
        else:
            refused.append((index, reason))
    return kept, refused
