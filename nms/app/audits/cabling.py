"""Cabling vs LLDP: the reconciled topology's verdict per cable (nms.topology) as findings."""

from __future__ import annotations

from nms.app.audits.model import AuditFinding, AuditResult, Snapshot, result
from nms.config.models import CablingAudit

NAME = "cabling"
_VERDICTS = {
    "miscabled": ("major", "cable plugged into the wrong port: {expected}",
                  "Move the cable to the configured ports, or correct fabric.links if the inventory is wrong."),
    "missing": ("major", "configured cable not seen by LLDP (link state {state})",
                "Check that the cable is seated and the optics are up on both ends; if it was removed on "
                "purpose, delete it from fabric.links."),
    "unexpected": ("minor", "cable seen by LLDP but not in the inventory",
                   "Add the cable to fabric.links if it is meant to be there, else remove it."),
}


def check(snap: Snapshot, settings: CablingAudit) -> AuditResult:
    if snap.topology is None or not snap.polled:
        return result(NAME, [], 0, no_data="no switch has been polled successfully: LLDP neighbours unknown")
    judged = [link for link in snap.topology.links if link.check not in ("unverified", "discovered")]
    notes = []
    if any(link.check == "discovered" for link in snap.topology.links):
        notes.append("the inventory lists no cabling: seen cables cannot be compared")
    unverified = sum(1 for link in snap.topology.links if link.check == "unverified")
    if unverified:
        notes.append(f"{unverified} configured cable(s) have no polled end: not verified")
    findings = []
    for link in judged:
        if link.check not in _VERDICTS:
            continue
        severity, message, remediation = _VERDICTS[link.check]
        findings.append(AuditFinding(
            audit=NAME, severity=severity, element=f"{link.a}--{link.b}", element_kind="link",
            message=message.format(expected=link.expected, state=link.state), remediation=remediation,
            evidence={"check": link.check, "state": link.state, "seen_by": link.seen_by, "expected": link.expected},
            # LLDP cannot see across a link that is down or flapping: the correlator's link_down /
            # link_flapping incident is the live one; standing, a run during a flap held a
            # miscabling incident open for the hour until the next run
            escalates=not (link.check == "missing" and link.state in ("down", "degraded"))))
    return result(NAME, findings, len(judged), notes,
                  no_data=None if judged else "no configured cable could be verified by a polled switch")
