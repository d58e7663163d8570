"""Job slowdowns joined with the fabric's findings of the same window.

A slowdown (correlator/slowdown.py) is explained by a fabric finding on the paths its ranks use
(`impact.on_job_paths`): that finding carries the slowdown as evidence (`job_slowdowns`: the
collective, its baseline and current bus bandwidth, the slow collectives' sequence numbers) and
its summary names the job, and the job's QPs whose traced path is one of the finding's paths
(`crossing_qps`: QP, rank and peer rank, in the evidence). A slowdown that no fabric finding
explains becomes a finding of its own, kind `job_slowdown` on the element `job:<id>`, saying so:
it is not blamed on the network. That finding waits until the slowdown is NO_CAUSE_AFTER_NS old,
so that a fabric fault still being localized is not first reported as a host-side slowdown.

A fault's finding can miss a window while its incident stays open (the incident resolves only after
N clean windows), and a job's collectives take a few more to recover after the fault heals. So an
open fabric incident on the job's paths explains a slowdown too, and a slowdown the fabric has
explained once stays explained until it clears (`SlowdownJoin` remembers it): the recovery tail of
a fabric fault is never reported as a host-side slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from correlator.impact import on_job_paths
from nms.records import Finding, Incident, JobSlowdown, QpRoute


def slowdown_evidence(s: JobSlowdown, crossing: Sequence[QpRoute] = ()) -> dict:
    out = {"job": s.job_id, "comm": s.comm_id, "op": s.op, "size_bucket": s.size_bucket, "since_ns": s.since_ns,
           "baseline_busbw_gbps": round(s.baseline_busbw_gbps, 6), "busbw_gbps": round(s.busbw_gbps, 6),
           "ratio": round(s.ratio, 4), "slow_collectives": list(s.slow_collectives)}
    if crossing:
        out["qps"] = [{"host": q.host, "device": q.device, "qpn": q.lqpn, "rank": q.rank, "peer_host": q.peer_host,
                       "peer_rank": q.peer_rank, "sport": q.sport} for q in crossing[:100]]
    return out


def crossing_qps(finding: Finding, s: JobSlowdown) -> list[QpRoute]:
    """The slowdown's QPs that cross the finding's element: named in its evidence (`qps`: the QPs
    whose traced path the correlator mapped onto it, correlator/qp_paths.py), or whose traced 5-tuple
    is one of the finding's paths (by path id: the prober's id when both were traced over RDMA UD)."""
    ids = {p.rsplit("/", 1)[-1] for p in finding.paths}
    named = {(q.get("host"), q.get("device"), q.get("qpn")) for q in finding.evidence.get("qps", [])
             if isinstance(q, dict)}
    return [q for q in s.qps if (q.host, q.device, q.lqpn) in named or (q.path_id is not None and q.path_id in ids)]


def _qps_text(qps: Sequence[QpRoute]) -> str:
    ranks = sorted({f"{q.rank}>{q.peer_rank}" for q in qps if q.rank is not None})
    return f" over {len(qps)} QP(s)" + (f" (ranks {', '.join(ranks[:8])})" if ranks else "")


def describe(s: JobSlowdown) -> str:
    return f"{s.op} {s.size_bucket} at {s.ratio:.0%} of its baseline bus bandwidth"


# the fabric's own detection takes a few windows (a congested cut: 2-3 s on an idle lab, over 5 s on
# a loaded one; sub-percent loss: the sequential test's windows up to 5 s): wait this long before "no cause"
NO_CAUSE_AFTER_NS = 10 * 10**9


SlowdownKey = tuple[str, str, str, str, int]  # job, comm, op, size bucket, since


def _key(s: JobSlowdown) -> SlowdownKey:
    return s.job_id, s.comm_id, s.op, s.size_bucket, s.since_ns


def join(findings: Sequence[Finding], slowdowns: Sequence[JobSlowdown], now_ns: int,
         no_cause_after_ns: int = NO_CAUSE_AFTER_NS, open_incidents: Sequence[Incident] = (),
         explained: set[SlowdownKey] | None = None) -> list[Finding]:
    """The window's findings with the slowdowns they explain attached, plus one `job_slowdown`
    finding per job whose slowdowns none explains (once the slowdown is `no_cause_after_ns` old:
    a fabric fault that slows a job is usually localized within a few windows, not at once).
    A slowdown is also explained by an open fabric incident on the job's paths, and by being in
    `explained` (the keys of slowdowns explained before; this call adds the ones it explains)."""
    out = list(findings)
    unexplained: dict[str, list[JobSlowdown]] = {}
    explained = set() if explained is None else explained
    for s in slowdowns:
        causes = [i for i, f in enumerate(out) if f.element_kind != "job" and on_job_paths(f, s.job_id, s.host_pairs)]
        for i in causes:
            f = out[i]
            crossing = crossing_qps(f, s)
            evidence = {**f.evidence,
                        "job_slowdowns": [*f.evidence.get("job_slowdowns", []), slowdown_evidence(s, crossing)]}
            summary = f"{f.summary}; slows job {s.job_id}: {describe(s)}"
            summary = (summary + (_qps_text(crossing) if crossing else ""))[:1024]
            out[i] = f.model_copy(update={"evidence": evidence, "summary": summary})
        if causes or any(i.element_kind != "job" and on_job_paths(i, s.job_id, s.host_pairs) for i in open_incidents):
            explained.add(_key(s))
        elif _key(s) not in explained and now_ns - s.since_ns >= no_cause_after_ns:
            unexplained.setdefault(s.job_id, []).append(s)
    for job_id, found in sorted(unexplained.items()):
        worst = min(found, key=lambda s: s.ratio)
        out.append(Finding(
            kind="job_slowdown", element=job_id, element_kind="job", ts=now_ns, severity="warning",
            confidence=max(0.0, min(1.0, 1.0 - worst.ratio)),
            summary=(f"job {job_id}: {describe(worst)}"
                     + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
                     + "; no fabric element on its paths explains it (not a network fault)")[:1024],
            evidence={"job_slowdowns": [slowdown_evidence(s) for s in found], "fabric_cause": None,
                      "host_pairs": sorted({p for s in found for p in s.host_pairs})[:1000]},
            jobs=[job_id]))
    return out


class SlowdownJoin:
    """`join` with its memory: the slowdowns the fabric explained, kept while they are active."""

    def __init__(self, no_cause_after_ns: int = NO_CAUSE_AFTER_NS) -> None:
        self.no_cause_after_ns = no_cause_after_ns
        self.explained: set[SlowdownKey] = set()

    def __call__(self, findings: Sequence[Finding], slowdowns: Sequence[JobSlowdown], now_ns: int,
                 open_incidents: Sequence[Incident] = ()) -> list[Finding]:
        self.explained &= {_key(s) for s in slowdowns}  # a cleared slowdown is forgotten
        return join(findings, slowdowns, now_ns, self.no_cause_after_ns, open_incidents, self.explained)
