"""Probe mesh coverage: every host pair probed (either way), and every ECMP path between them."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from nms.app.audits.model import AuditFinding, AuditResult, Snapshot, result
from nms.config.models import ProbeCoverageAudit
from nms.topology import ecmp_paths

NAME = "probe_coverage"


def check(snap: Snapshot, settings: ProbeCoverageAudit) -> AuditResult:
    if snap.probed is None:
        return result(NAME, [], 0, no_data="probe windows cannot be read (no telemetry store)")
    if not snap.probed:
        return result(NAME, [], 0, no_data=f"no probe window in the last {settings.max_age:g} s: no host agent "
                                           "is reporting")
    hosts = sorted(h.name for h in snap.fabric.hosts)
    paths: dict[tuple[str, str], set[str]] = defaultdict(set)  # ordered pair -> path ids probed
    for p in snap.probed:
        paths[(p.src_host, p.dst_host)].add(p.path_id)
    active = {h for pair in paths for h in pair}
    findings = []
    for h in hosts:
        if h not in active:
            findings.append(AuditFinding(
                audit=NAME, severity="minor", element=h, element_kind="host", evidence={},
                message="no probe window from or to this host: its paths are not watched",
                remediation="Start nms-agent on the host (and check its token and peers: nms agents list)."))
    checked = 0
    for a, b in combinations([h for h in hosts if h in active], 2):
        checked += 1
        probed = max(len(paths.get((a, b), ())), len(paths.get((b, a), ())))
        pair = f"{a}<>{b}"
        if probed == 0:
            findings.append(AuditFinding(
                audit=NAME, severity="warning", element=pair, element_kind="host_pair", evidence={},
                message="the pair is not probed either way",
                remediation="Raise agents.peers (random peers per agent) or add the pair to the peer plan."))
            continue
        expected = len(ecmp_paths(snap.topology, a, b)) if snap.topology else 0
        if probed < expected:
            findings.append(AuditFinding(
                audit=NAME, severity="warning", element=pair, element_kind="host_pair",
                evidence={"paths_probed": probed, "ecmp_paths": expected},
                message=f"probes cover {probed} of {expected} ECMP paths",
                remediation="Raise the agents' paths per peer (source ports) so that every ECMP path is hashed "
                            "onto at least once."))
    notes = [] if snap.topology else ["topology unknown: ECMP path counts not compared"]
    return result(NAME, findings, checked + len(hosts) - len(active), notes)
