"""Firmware and configuration drift between switches of one role: each switch against the role's
majority (DeviceFacts' system description; the CLI collector's configuration snapshots)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from nms.app.audits.model import AuditFinding, AuditResult, Snapshot, result
from nms.config.models import ConfigDriftAudit

NAME = "config_drift"
MAX_LINES = 20  # lines listed per finding
_ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?:/\d+)?\b|\b[0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{0,4}){2,7}(?:/\d+)?\b"
                      r"|\b(?:[0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}\b")


def masked(device: str, line: str) -> str:
    """A line with the switch's own name and addresses masked (they differ by design)."""
    return _ADDRESS.sub("<addr>", line.replace(device, "<self>"))


def normalized_lines(device: str, text: str, ignore: list[re.Pattern]) -> set[str]:
    """The comparable lines of one switch's configuration: its own name and addresses masked
    (they differ by design), blanks, comments and ignored lines left out."""
    out = set()
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if not line or line[0] in "#!" or any(p.search(line) for p in ignore):
            continue
        out.add(masked(device, line))
    return out


def _roles(snap: Snapshot) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = defaultdict(list)
    for s in snap.fabric.switches:
        roles[s.role].append(s.name)
    return roles


def _firmware(snap: Snapshot, role: str, members: list[str]) -> list[AuditFinding]:
    descr = {d: masked(d, snap.facts[d].sys_descr) for d in members if d in snap.facts and snap.facts[d].sys_descr}
    counts = Counter(descr.values()).most_common()
    if len(counts) < 2:
        return []
    if counts[0][1] == counts[1][1]:  # no majority: the role as a whole
        return [AuditFinding(audit=NAME, severity="minor", element=role, element_kind="role",
                             evidence={"firmware": descr},
                             message=f"{len(counts)} different firmware versions among the {role} switches, none "
                                     f"in the majority",
                             remediation="Upgrade the role's switches to one approved version.")]
    common = counts[0][0]
    return [AuditFinding(audit=NAME, severity="minor", element=d, element_kind="device",
                         evidence={"firmware": value, "role_majority": common, "role": role},
                         message=f"firmware differs from the other {role} switches: {value!r} vs {common!r}",
                         remediation=f"Upgrade {d} to the role's version, or the role to {d}'s.")
            for d, value in sorted(descr.items()) if value != common]


def _configs(snap: Snapshot, role: str, members: list[str], ignore: list[re.Pattern]) -> list[AuditFinding]:
    lines = {d: normalized_lines(d, snap.configs[d], ignore) for d in members if d in snap.configs}
    if len(lines) < 2:
        return []
    counts = Counter(line for ls in lines.values() for line in ls)
    standard = {line for line, n in counts.items() if 2 * n > len(lines)}
    findings = []
    for d, mine in sorted(lines.items()):
        missing, extra = sorted(standard - mine), sorted(mine - standard)
        if not missing and not extra:
            continue
        findings.append(AuditFinding(
            audit=NAME, severity="minor", element=d, element_kind="device",
            evidence={"role": role, "compared_with": len(lines) - 1, "missing": missing[:MAX_LINES],
                      "extra": extra[:MAX_LINES], "missing_count": len(missing), "extra_count": len(extra)},
            message=f"configuration differs from the other {role} switches: {len(missing)} line(s) missing, "
                    f"{len(extra)} extra",
            remediation="Review the listed lines; apply the role's template, or add intended differences to "
                        "audits.config_drift.ignore."))
    return findings


def check(snap: Snapshot, settings: ConfigDriftAudit) -> AuditResult:
    ignore = [re.compile(p) for p in settings.ignore]
    findings, checked, notes = [], 0, []
    for role, members in sorted(_roles(snap).items()):
        have_facts = [d for d in members if d in snap.facts and snap.facts[d].sys_descr]
        have_config = [d for d in members if d in snap.configs]
        checked += (len(have_facts) >= 2) + (len(have_config) >= 2)
        findings += _firmware(snap, role, members) + _configs(snap, role, members, ignore)
        if len(members) > 1 and len(have_config) < 2:
            notes.append(f"{role}: configuration snapshots of {len(have_config)} of {len(members)} switches "
                         f"(the CLI collector takes them)")
    return result(NAME, findings, checked, notes,
                  no_data=None if checked else "no role has two switches with firmware facts or configuration "
                                               "snapshots")
