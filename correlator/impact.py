"""Job impact: which active jobs talk across a faulty element.

A job is attached when two of its hosts are the ends of a probe path crossing the element (the
probe mesh samples the same links their traffic hashes onto), or when one of its hosts sits right
at the element (its NIC, its access link, its leaf). Jobs outside [start, end) are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from correlator.fabric import FabricIndex
from correlator.paths import Geometry
from nms.records import Job


def job_hosts(job: Job) -> set[str]:
    hosts = set(job.hosts)
    hosts.update(n.split(":", 1)[0] for n in job.nics)
    hosts.update(r.host for r in job.ranks)
    return hosts


def attach(drafts, jobs: Sequence[Job], now_ns: int, geo: Geometry, index: FabricIndex, keys) -> dict[int, list[str]]:
    """Draft position -> sorted job ids."""
    active = [j for j in jobs if j.start <= now_ns and (j.end is None or j.end > now_ns)]
    if not active:
        return {}
    by_host: dict[str, set[str]] = {}
    for job in active:
        for host in job_hosts(job):
            by_host.setdefault(host, set()).add(job.id)
    out: dict[int, list[str]] = {}
    for pos, d in enumerate(drafts):
        found: set[str] = set()
        for host in _hosts_at(d, index):
            found |= by_host.get(host, set())
        if d.eid is not None and geo.ET is not None and d.eid < geo.ET.shape[0]:
            rows = geo.ET.indices[geo.ET.indptr[d.eid]:geo.ET.indptr[d.eid + 1]]
            pairs = {(keys[i][0], keys[i][2]) for i in np.asarray(rows).tolist()}
            for a, b in pairs:
                ja, jb = by_host.get(a), by_host.get(b)
                if ja and jb:
                    found |= ja & jb
        if found:
            out[pos] = sorted(found)
    return out


def _hosts_at(d, index: FabricIndex) -> set[str]:
    if d.element_kind == "nic":
        return {d.element.split(":", 1)[0]}
    if d.element_kind == "device":
        return {h for (h, _), sw in index.nic_switch.items() if sw == d.element}
    a, _, b = d.element.partition("--")
    return {end.split(":", 1)[0] for end in (a, b)} & index.hosts


def path_hosts(path: str) -> tuple[str, str]:
    """'src_host:src_nic>dst_host:dst_nic/path_id' (Finding.paths) -> (src_host, dst_host)."""
    src, _, rest = path.partition(">")
    return src.split(":", 1)[0], rest.split(":", 1)[0]


def on_job_paths(finding, job_id: str, host_pairs: Sequence[str]) -> bool:
    """Whether a fabric finding lies on the paths a job's ranks use: the job is attached to it
    (`attach`), and when the ranks' peer pairs are known (`host>host`, from the QPs' peers), one of
    the finding's probe paths joins such a pair (either way), or the finding sits at one of the job's
    hosts (a NIC, an access link: no path between two of its hosts needed)."""
    if job_id not in finding.jobs:
        return False
    if not host_pairs:
        return True
    pairs = set()
    for pair in host_pairs:
        a, _, b = pair.partition(">")
        pairs |= {(a, b), (b, a)}
    if any(path_hosts(p) in pairs for p in finding.paths):
        return True
    hosts = {h for pair in pairs for h in pair}
    if finding.element_kind == "nic":
        return finding.element.split(":", 1)[0] in hosts
    if finding.element_kind == "link":
        return any(end.split(":", 1)[0] in hosts for end in finding.element.split("--"))
    return False
