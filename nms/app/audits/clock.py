"""Clock sync health: the newest network-effect solution per host (nms.app.clock_service)."""

from __future__ import annotations

from nms.app.audits.model import SEVERITY_RANK, AuditFinding, AuditResult, Snapshot, result
from nms.config.models import ClockAudit

NAME = "clock"


def check(snap: Snapshot, settings: ClockAudit) -> AuditResult:
    if snap.clock is None:
        return result(NAME, [], 0, no_data="clock sync is disabled (clock.enabled)")
    if not snap.clock:
        return result(NAME, [], 0, no_data="no clock solution yet: no host agent sends clock edges")
    findings = []
    for s in sorted(snap.clock, key=lambda s: s.host):
        age_s = (snap.now_ns - s.window_start) / 1e9
        problems: list[tuple[str, str]] = []
        if age_s > settings.max_age:
            problems.append(("minor", f"newest solution is {age_s:.0f} s old (sync stopped)"))
        if s.bound_ns > settings.max_bound_us * 1e3:
            problems.append(("major", f"error bound {s.bound_ns / 1e3:.1f} us above {settings.max_bound_us:g} us"))
        if abs(s.offset_ns) > settings.max_offset_us * 1e3:
            problems.append(("minor", f"offset {s.offset_ns / 1e3:.0f} us from fabric time"))
        if abs(s.drift_ppb) > settings.max_drift_ppm * 1e3:
            problems.append(("minor", f"drift {s.drift_ppb / 1e3:.1f} ppm"))
        if not problems:
            continue
        findings.append(AuditFinding(
            audit=NAME, severity=max((p[0] for p in problems), key=SEVERITY_RANK.get), element=s.host,
            element_kind="host", message="; ".join(p[1] for p in problems),
            evidence={"offset_ns": s.offset_ns, "drift_ppb": s.drift_ppb, "bound_ns": s.bound_ns,
                      "age_s": round(age_s, 1)},
            remediation="Check the host's agent is running and probing (probe_coverage), its NTP/PTP "
                        "daemon and that no process steps the clock; a large bound means noisy probes "
                        "(CPU load, software timestamps)."))
    hosts = {h.name for h in snap.fabric.hosts}
    without = sorted(hosts - {s.host for s in snap.clock})
    notes = [f"no clock solution for {len(without)} host(s): {', '.join(without[:10])}"] if without else []
    return result(NAME, findings, len(snap.clock), notes)
