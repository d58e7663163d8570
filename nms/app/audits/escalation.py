"""Audit findings -> incidents, through the one IncidentManager the correlator feeds.

An audit finding becomes a correlator `Finding` of the fault kind it shows, on the element it names,
so it shares the element's incident (dedup key `element_kind:element`) and its notifications. The
IncidentManager resolves incidents that a window no longer reports, so the audits' findings must be
in every window: `IncidentFeed` sits between the correlator and the manager and adds the audits'
standing findings (the latest run of each audit) to each window's. Without a correlator, the
service applies the standing findings alone once per window (`apply_standing`).

A finding on what the correlator tracks live (`escalates` false: the errors audit's probe loss,
cabling's `missing` on a down or flapping link) does not stand: the correlator's own finding keeps
or resolves that incident.

Every audit has its fault kind; an audit's element kinds beyond the correlator's (a host, a host
pair, a role) are element kinds of their own, so their incidents never merge with a link's."""

from __future__ import annotations

from collections.abc import Callable

from nms.app.audits.model import AuditFinding
from nms.records import Finding

INCIDENT_KIND = {"cabling": "miscabling", "mtu": "mtu_mismatch", "errors": "corrupting_link",
                 "ecmp_balance": "path_imbalance", "speed": "speed_mismatch", "clock": "clock_unsynced",
                 "config_drift": "config_drift", "probe_coverage": "probe_gap"}
INCIDENT_ELEMENT = {"link": "link", "device": "device", "host": "host", "host_pair": "host_pair", "role": "role"}


def can_escalate(f: AuditFinding) -> bool:
    return f.escalates and f.audit in INCIDENT_KIND and f.element_kind in INCIDENT_ELEMENT


def to_finding(f: AuditFinding, window_ns: int) -> Finding:
    return Finding(kind=INCIDENT_KIND[f.audit], element=f.element, element_kind=INCIDENT_ELEMENT[f.element_kind],
                   ts=window_ns, confidence=1.0, severity=f.severity, summary=f"audit {f.audit}: {f.message}"[:1024],
                   evidence={"audit": f.audit, "remediation": f.remediation, **f.evidence})


class IncidentFeed:
    """Stands in for the IncidentManager in the correlation service: each window's findings plus
    the audits' standing ones. Everything else is the manager's."""

    def __init__(self, incidents, standing: Callable[[int], list[Finding]]):
        self.incidents = incidents
        self.standing = standing
        self.correlator_findings: list[Finding] = []  # the correlator's latest window (the errors audit reads it)
        # a sharded correlate member: the findings whose element it owns (correlate_partitions.owned_findings)
        self.owned: Callable[[list[Finding]], list[Finding]] | None = None

    def apply(self, findings: list[Finding], window_ns: int):
        self.correlator_findings = list(findings)
        return self.incidents.apply(self._mine([*findings, *self.standing(window_ns)]), window_ns)

    def apply_standing(self, window_ns: int):
        return self.incidents.apply(self._mine(self.standing(window_ns)), window_ns)

    def _mine(self, findings: list[Finding]) -> list[Finding]:
        return findings if self.owned is None else self.owned(findings)

    def __getattr__(self, name: str):
        return getattr(self.incidents, name)
