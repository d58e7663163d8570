"""ECMP balance: the utilization skew of each switch's parallel uplinks (the flows it hashes)."""

from __future__ import annotations

from collections import defaultdict

from nms.app.audits.model import AuditFinding, AuditResult, Snapshot, result
from nms.app.audits.ports import present_links
from nms.config.models import EcmpBalanceAudit

NAME = "ecmp_balance"
UPSTREAM = {"leaf": {"spine"}, "spine": {"superspine"}}  # a role's ECMP next hops


def check(snap: Snapshot, settings: EcmpBalanceAudit) -> AuditResult:
    roles = {s.name: s.role for s in snap.fabric.switches}
    uplinks: dict[str, list[str]] = defaultdict(list)  # device -> its ports towards the next tier
    for _, a, b in present_links(snap):
        for near, far in ((a, b), (b, a)):
            if roles.get(far[0]) in UPSTREAM.get(roles.get(near[0], ""), ()):
                uplinks[near[0]].append(near[1])
    groups = {d: ports for d, ports in uplinks.items() if len(ports) > 1}
    if not groups:
        return result(NAME, [], 0, no_data="no switch has two or more uplinks to the next tier (roles "
                                           "leaf -> spine -> superspine in fabric.switches)")
    findings, checked, idle = [], 0, 0
    for device, ports in sorted(groups.items()):
        util = {}
        for port in ports:
            r = snap.rates.get((device, port))
            sample = snap.samples.get((device, port))
            if r is None or r.out_bps is None:
                continue
            if r.out_utilization is not None:
                util[port] = r.out_utilization
            elif sample is not None and sample.speed_bps:
                util[port] = r.out_bps / sample.speed_bps
        if len(util) < 2:
            continue
        checked += 1
        hot, cold = max(util.values()), min(util.values())
        if hot < settings.min_utilization:
            idle += 1
            continue
        skew = hot / max(cold, 1e-9)
        if skew >= settings.skew_threshold:
            busiest = max(util, key=util.get)
            findings.append(AuditFinding(
                audit=NAME, severity="minor", element=device, element_kind="device",
                evidence={"out_utilization": {p: round(u, 4) for p, u in sorted(util.items())},
                          "skew": round(min(skew, 1e9), 2), "skew_threshold": settings.skew_threshold},
                message=f"uplinks unevenly used: {busiest} at {hot:.0%}, the least busy at {cold:.0%} "
                        f"(skew {min(skew, 1e9):.1f})",
                remediation="Check the ECMP hash fields (include L4 ports), that every uplink is in the "
                            "route's next-hop group, and large elephant flows; consider adaptive routing or "
                            "more QPs per connection."))
    notes = [f"{idle} switch(es) below {settings.min_utilization:.0%} utilization: balance not judged"] if idle else []
    return result(NAME, findings, checked, notes,
                  no_data=None if checked else "no uplink rates yet (two polls needed)")
