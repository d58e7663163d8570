"""ServiceNow Event Management (kind `servicenow`): POST url such as
https://<instance>.service-now.com/api/global/em/jsonv2 with {"records": [event]}.

message_key = `nms:<site>:<incident id>` for every event of an incident, so ServiceNow folds them
into one alert; the resolve is severity 0 (Clear) with resolution_state Closing, which closes it.
Severity: critical 1, major 2, minor 3, warning 4 (5 is info, unused), resolved 0. Fields are
strings as ServiceNow's event table takes them; node/type/resource at most 100 characters,
description 4000. Basic auth when username and secret (the password) are set.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from nms.app.notify.base import HttpRequest, Sink, element_node, incident_key, iso_utc, truncate
from nms.records import IncidentEvent

SEVERITY = {"critical": "1", "major": "2", "minor": "3", "warning": "4"}


class ServiceNowSink(Sink):
    kind = "servicenow"

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        inc = event.incident
        resolved = event.event == "resolved"
        info = {"site": self.site, "incident_id": inc.id, "event": event.event, "state": inc.state,
                "element_kind": inc.element_kind, "direction": inc.direction, "confidence": inc.confidence,
                "evidence": inc.evidence, "jobs": inc.jobs[:100], "jobs_count": len(inc.jobs),
                "paths_count": len(inc.paths), "opened": iso_utc(inc.opened_ns),
                "acknowledged_by": inc.acknowledged_by, "children": inc.children[:100],
                "absorbed": event.absorbed[:100]}
        record = {
            "source": "fabric-nms",
            "event_class": truncate(f"fabric-nms:{self.site}", 100),
            "node": truncate(element_node(inc.element), 100),
            "type": inc.kind,
            "resource": truncate(inc.element, 100),
            "metric_name": inc.kind,
            "severity": "0" if resolved else SEVERITY[inc.severity],
            "resolution_state": "Closing" if resolved else "New",
            "message_key": incident_key(self.site, inc.id),
            "description": truncate(f"{'RESOLVED: ' if resolved else ''}{inc.summary}", 4000),
            "additional_info": json.dumps(info, default=str),
            "time_of_event": datetime.fromtimestamp(event.ts / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S"),
        }
        auth = None
        if self.config.username is not None and self.config.secret is not None:
            auth = (self.config.username, self.config.secret.get_secret_value())
        return self.post({"records": [record]}, auth=auth, Accept="application/json")
