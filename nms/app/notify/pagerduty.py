"""PagerDuty Events API v2 (kind `pagerduty`; url normally https://events.pagerduty.com/v2/enqueue).

`secret` is the integration's routing key. opened/updated -> `trigger`, acknowledged ->
`acknowledge`, resolved -> `resolve`, all with `dedup_key` = `nms:<site>:<incident id>`, so updates
change the open PagerDuty alert and the resolve closes it. Severity: critical -> critical,
major -> error, minor -> warning, warning -> warning (PagerDuty's `info` is not used).
PagerDuty answers 202 when it accepted the event; 400 (invalid event) is permanent, 429 retried.
"""

from __future__ import annotations

from nms.app.notify.base import HttpRequest, Sink, incident_key, iso_utc, truncate
from nms.records import IncidentEvent

ACTIONS = {"opened": "trigger", "updated": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}
SEVERITY = {"critical": "critical", "major": "error", "minor": "warning", "warning": "warning"}
MAX_LIST = 100


class PagerDutySink(Sink):
    kind = "pagerduty"

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        inc = event.incident
        doc = {"routing_key": self.config.secret.get_secret_value(), "event_action": ACTIONS[event.event],
               "dedup_key": incident_key(self.site, inc.id)}
        if doc["event_action"] == "trigger":
            doc["payload"] = {
                "summary": truncate(f"[{self.site}] {inc.kind} on {inc.element}: {inc.summary}", 1024),
                "source": truncate(inc.element, 255),
                "severity": SEVERITY[inc.severity],
                "timestamp": iso_utc(event.ts),
                "component": inc.element_kind,
                "group": self.site,
                "class": inc.kind,
                "custom_details": {
                    "incident_id": inc.id, "state": inc.state, "event": event.event, "severity": inc.severity,
                    "confidence": inc.confidence, "direction": inc.direction, "evidence": inc.evidence,
                    "jobs": inc.jobs[:MAX_LIST], "jobs_count": len(inc.jobs), "paths_count": len(inc.paths),
                    "opened": iso_utc(inc.opened_ns), "updates": inc.updates,
                    "children": inc.children[:MAX_LIST], "absorbed": event.absorbed[:MAX_LIST],
                },
            }
            doc["client"] = "fabric-nms"
            if self.external_url:
                doc["client_url"] = f"{self.external_url}/incidents/{inc.id}"
        return self.post(doc)
