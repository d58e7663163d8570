"""Probe mesh coverage: every host pair probed (either way), and every ECMP path between them."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from nms.app.audits.model import AuditFinding, AuditResult, Snapshot, result
from nms.config.models import ProbeCoverageAudit
from nms.topology import PathFinder, parse_end

NAME = "probe_coverage"
MAX_LISTED = 20  # peers listed per finding


class PathCounter:
    """ECMP path counts between hosts, one enumeration per pair of attachments: hosts do not
    forward, so the count depends only on the switches each host is cabled to (with multiplicity),
    unless the two hosts are cabled to each other."""

    def __init__(self, topology):
        self.finder = PathFinder(topology)
        self.attached: dict[str, list[str]] = defaultdict(list)
        for link in topology.links:
            a, b = parse_end(link.a)[0], parse_end(link.b)[0]
            self.attached[a].append(b)
            self.attached[b].append(a)
        self._cache: dict[tuple, int] = {}

    def __call__(self, a: str, b: str) -> int:
        if b in self.attached[a]:
            return len(self.finder.paths(a, b))
        key = (tuple(sorted(self.attached[a])), tuple(sorted(self.attached[b])))
        if key not in self._cache:
            self._cache[key] = len(self.finder.paths(a, b))
        return self._cache[key]


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
    path_count = PathCounter(snap.topology) if snap.topology else None
    findings = []
    for h in hosts:
        if h not in active:
            findings.append(AuditFinding(
                audit=NAME, severity="minor", element=h, element_kind="host", evidence={},
                message="no probe window from or to this host: its paths are not watched",
                remediation="Start nms-agent on the host (and check its token and peers: nms agents list)."))
    # unprobed pairs: one finding per host (a full list of pairs grows as hosts squared)
    live = [h for h in hosts if h in active]
    unprobed: dict[str, list[str]] = defaultdict(list)
    for a, b in combinations(live, 2):
        probed = max(len(paths.get((a, b), ())), len(paths.get((b, a), ())))
        if probed == 0:
            unprobed[a].append(b)
            unprobed[b].append(a)
            continue
        expected = path_count(a, b) if path_count else 0
        if probed < expected:
            findings.append(AuditFinding(
                audit=NAME, severity="warning", element=f"{a}<>{b}", element_kind="host_pair",
                evidence={"paths_probed": probed, "ecmp_paths": expected},
                message=f"probes cover {probed} of {expected} ECMP paths",
                remediation="Raise the agents' paths per peer (source ports) so that every ECMP path is hashed "
                            "onto at least once."))
    for h, peers in sorted(unprobed.items()):
        findings.append(AuditFinding(
            audit=NAME, severity="warning", element=h, element_kind="host",
            evidence={"unprobed_peers": peers[:MAX_LISTED], "unprobed_count": len(peers), "hosts": len(live)},
            message=f"not probed with {len(peers)} of {len(live) - 1} other probing hosts (either way)",
            remediation="Raise agents.peers_random (random peers per agent) so that every pair is probed."))
    checked = len(live) * (len(live) - 1) // 2 + len(hosts) - len(live)
    notes = [] if snap.topology else ["topology unknown: ECMP path counts not compared"]
    return result(NAME, sorted(findings, key=lambda f: (f.element_kind, f.element)), checked, notes)
