"""Alertmanager webhook v4 payload (kind `alertmanager`): what Alertmanager POSTs to its
webhook receivers, so any receiver written for Alertmanager takes our incidents as they are.

One message per incident event, one alert in it. status: `resolved` for resolved events, else
`firing` (acknowledged adds an `acknowledged_by` annotation). labels: alertname (the fault kind),
element, element_kind, severity, site, incident_id. endsAt is 0001-01-01T00:00:00Z while firing.
fingerprint: FNV-1a 64 of the identity labels (all but severity, which may change while the
incident is open) as Prometheus computes label-set fingerprints, 16 hex digits.
"""

from __future__ import annotations

from nms.app.notify.base import HttpRequest, Sink, iso_utc, truncate
from nms.records import IncidentEvent

ZERO_TIME = "0001-01-01T00:00:00Z"
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fingerprint(labels: dict[str, str]) -> str:
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in part:
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class AlertmanagerSink(Sink):
    kind = "alertmanager"

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        inc = event.incident
        resolved = event.event == "resolved"
        status = "resolved" if resolved else "firing"
        identity = {"alertname": inc.kind, "element": inc.element, "element_kind": inc.element_kind,
                    "site": self.site, "incident_id": str(inc.id)}
        labels = {**identity, "severity": inc.severity}
        annotations = {"summary": truncate(inc.summary, 1024),
                       "description": f"{inc.kind} on {inc.element} ({inc.element_kind}), confidence "
                                      f"{inc.confidence:.2f}, {len(inc.paths)} paths, jobs: "
                                      f"{', '.join(inc.jobs[:50]) or 'none'}"}
        if inc.direction:
            annotations["direction"] = inc.direction
        if inc.acknowledged_by:
            annotations["acknowledged_by"] = inc.acknowledged_by
        if inc.children:
            annotations["children"] = " ".join(f"#{i}" for i in inc.children[:100])
        if event.absorbed:
            annotations["absorbed"] = " ".join(f"#{i}" for i in event.absorbed[:100])
        base = self.external_url or ""
        group_labels = {"alertname": inc.kind, "incident_id": str(inc.id), "site": self.site}
        alert = {
            "status": status, "labels": labels, "annotations": annotations,
            "startsAt": iso_utc(inc.opened_ns),
            "endsAt": iso_utc(inc.resolved_ns if inc.resolved_ns is not None else event.ts) if resolved else ZERO_TIME,
            "generatorURL": f"{base}/incidents/{inc.id}" if base else "",
            "fingerprint": fingerprint(identity),
        }
        doc = {
            "version": "4",
            "groupKey": "{}:{" + ", ".join(f"{k}={_quote(v)}" for k, v in sorted(group_labels.items())) + "}",
            "truncatedAlerts": 0, "status": status, "receiver": self.name,
            "groupLabels": group_labels, "commonLabels": labels, "commonAnnotations": annotations,
            "externalURL": base, "alerts": [alert],
        }
        return self.post(doc)
