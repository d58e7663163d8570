"""Incident events as `incident_event` points, so that dashboards read incidents from the store.

The incident manager's record stays in SQLite (nms/state.py); this listener adds one point per
event (opened, updated, resolved, acknowledged). `element` is a tag as well: one element has one
open incident at a time, so (kind, element, event, time) never names two events.
"""

from __future__ import annotations

import logging

from nms.records import IncidentEvent
from nms.store.base import Point, TimeSeriesStore, declare_fields

log = logging.getLogger(__name__)

MEASUREMENT = "incident_event"
TAGS = ("kind", "element_kind", "element", "severity", "event")
declare_fields(MEASUREMENT, {"id": "integer", "summary": "string", "state": "string", "confidence": "float",
                             "duration_s": "float", "updates": "integer", "paths": "integer", "jobs": "string",
                             "direction": "string", "parent_id": "integer"})


def incident_point(event: IncidentEvent) -> Point:
    inc = event.incident
    fields = {"id": inc.id, "summary": inc.summary, "state": inc.state, "confidence": float(inc.confidence),
              "duration_s": max(0, event.ts - inc.opened_ns) / 1e9, "updates": inc.updates,
              "paths": len(inc.paths), "jobs": ",".join(inc.jobs)}
    if inc.direction:
        fields["direction"] = inc.direction
    if inc.parent_id is not None:  # a child (docs/correlator.md): count failures with `parent_id` absent
        fields["parent_id"] = inc.parent_id
    tags = {"kind": inc.kind, "element_kind": inc.element_kind, "element": inc.element[:256],
            "severity": inc.severity, "event": event.event}
    return Point(MEASUREMENT, tags, fields, event.ts)


class IncidentPoints:
    """An IncidentManager listener writing each event to the telemetry store."""

    def __init__(self, store: TimeSeriesStore) -> None:
        self.store = store

    def __call__(self, event: IncidentEvent) -> None:
        result = self.store.write([incident_point(event)])
        if result.rejected:
            log.warning("incident %d %s not stored: %s", event.incident.id, event.event, result.rejected[0][1])
