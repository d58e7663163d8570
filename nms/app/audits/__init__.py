"""Fabric audits (docs/audits.md): pure checks over a snapshot of what the service knows, run on a
schedule and on demand, reports kept with history, findings escalated to incidents.

Modules: `model` (snapshot, findings, reports), one module per family of checks (`cabling`,
`ports`: MTU, speed, errors; `balance`: ECMP; `clock`; `drift`: firmware/config; `coverage`: probe
mesh), `snapshot` (the service's parts -> Snapshot), `runner` (runs, history, escalation),
`history` (SQLite), `escalation` (findings -> correlator Finding records -> incidents), `report`
(md / json / html)."""

from __future__ import annotations

from collections.abc import Callable

from nms.app.audits import balance, cabling, clock, coverage, drift, ports
from nms.app.audits.model import AuditResult, Snapshot

CHECKS: dict[str, Callable[[Snapshot, object], AuditResult]] = {
    "cabling": cabling.check,
    "mtu": ports.check_mtu,
    "speed": ports.check_speed,
    "errors": ports.check_errors,
    "ecmp_balance": balance.check,
    "clock": clock.check,
    "config_drift": drift.check,
    "probe_coverage": coverage.check,
}
