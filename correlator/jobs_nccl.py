"""Jobs and collective performance from the NCCL plugin's records (ingest kinds nccl_*).

- Jobs: every record names its job (the launcher's environment at plugin init). NcclComm says
  which rank of which communicator runs on which host; proxy steps, or the agent's per-second step
  stats (NcclStepStats), add the QPs (IB) or sockets and network devices each rank used, proxy ops
  the peers it talked to. A job appears in the state
  store on its own (labels `source: nccl`). A job registered by hand (POST /jobs) with the same id
  is merged, never duplicated: the hand-registered name, start, end, labels, hosts, NICs and rank
  placements win; the plugin adds the hosts and ranks it lacks, and QPs/peers/devices to ranks it
  placed on the same host (`merge_jobs`).
- Collectives: a rank's part of a collective is done when its proxy ops stopped coming for
  `settle_s`, or a later collective of the same process has proxy ops (a communicator's collectives
  run in order), or after `max_wait_s`; its duration runs from its start to its last proxy op's stop
  (NCCL's Coll stop only means enqueued), or to its stop when it has none (intra-node, or proxy
  events masked). The collective (same communicator and seq) is assembled when all its ranks are
  done, or `max_wait_s` after its first part came; its duration is the slowest rank's. The result is an
  NcclCollectivePerf point (duration, algbw, busbw), fed to the slowdown detector
  (correlator/slowdown.py) and stored.
Records without a job id are stored as they came, nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from correlator.qp_join import join_qps
from correlator.slowdown import DetectorConfig, SlowdownDetector, bandwidths, op_bytes, size_bucket
from nms.records import (
    Job,
    JobSlowdown,
    NcclCollective,
    NcclCollectivePerf,
    NcclComm,
    NcclProxyOp,
    NcclProxyStep,
    NcclRdmaQp,
    NcclStepStats,
    QpRoute,
    RankPlacement,
)

log = logging.getLogger(__name__)

# a job's slowdowns as shared (share_slowdowns): {"active": [...], "cleared": [...]}
_SLOWDOWNS = TypeAdapter(dict[str, list[JobSlowdown]])
SOURCE_LABEL = "source"
ORPHAN_S = 60.0  # proxy ops whose collective has not come after this long are dropped
MAX_PENDING = 200_000  # rank records waiting for their proxy ops; the oldest are assembled early beyond
MAX_QPS = 200_000  # the agents' latest QP lists (NcclRdmaQp); the oldest are forgotten beyond
QP_STALE_NS = 120 * 10**9  # a QP not reported for this long is gone (agents report every nccl.qp_interval, 10 s)


@dataclass
class _RankColl:
    rec: NcclCollective
    end_ns: int  # its stop, then its proxy ops' latest stop
    touched: float  # monotonic time of the last record that belonged to it
    arrived: float
    ops: int = 0  # proxy ops seen


@dataclass
class _Comm:
    job_id: str
    nranks: int = 0
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> host


@dataclass
class _RankInfo:
    peers: set[int] = field(default_factory=set)
    qps: set[int] = field(default_factory=set)
    devices: set[int] = field(default_factory=set)


class NcclJobs:
    """Fed by Service.on_ingest (any thread); `flush` assembles settled collectives (called on ingest
    and by the correlation step). `write` stores the NcclCollectivePerf points."""

    def __init__(self, state, write: Callable[[list[NcclCollectivePerf]], None],
                 detector: DetectorConfig = DetectorConfig(), settle_s: float = 1.0, max_wait_s: float = 10.0,
                 recent: int = 512):
        self.state, self.write, self.settle_s, self.max_wait_s = state, write, settle_s, max_wait_s
        self.detector = SlowdownDetector(detector)
        self._lock = threading.Lock()
        self._comms: dict[str, _Comm] = {}  # comm_id -> its job and placements
        self._ranks: dict[tuple[str, str, int], _RankInfo] = {}  # (job, comm, rank) -> what it used
        self._job_start: dict[str, int] = {}
        self._dirty_jobs: set[str] = set()
        self._pending: dict[tuple[str, int, int], _RankColl] = {}  # (host, pid, event_id) -> rank's collective
        # proxy ops that came before their collective (the agent posts each kind on its own): parent -> last stop
        self._early: dict[tuple[str, int, int], tuple[int, float, int]] = {}  # (latest stop, seen, ops)
        self._op_seq: dict[tuple[str, int, str], int] = {}  # (host, pid, comm) -> newest seq with a proxy op
        self._parts: dict[tuple, list[_RankColl]] = {}  # (job, comm, seq) -> ranks done, waiting for the others
        self._recent: dict[str, deque[NcclCollectivePerf]] = {}  # job -> recent assembled collectives
        self._qps: dict[tuple[str, str, str], NcclRdmaQp] = {}  # (host, device, lqpn) -> the agent's latest
        self._shared: dict[str, str] = {}  # job -> its slowdowns as last written to the state (share_slowdowns)
        self.detects_here = True  # False in a cluster member that does not correlate (nms.app.service)

    # --- intake -------------------------------------------------------------------------------

    def add(self, records: Iterable) -> None:
        now = time.monotonic()
        with self._lock:
            for r in records:
                if r.job_id is None:
                    continue
                if isinstance(r, NcclRdmaQp):
                    self._add_qp(r)
                    continue
                self._job_start[r.job_id] = min(self._job_start.get(r.job_id, r.start_ns), r.start_ns)
                if isinstance(r, NcclComm):
                    comm = self._comm(r.job_id, r.comm_id)
                    comm.nranks = max(comm.nranks, r.nranks)
                    self._place(comm, r)
                elif isinstance(r, NcclCollective):
                    self._place(self._comm(r.job_id, r.comm_id), r)
                    key = (r.host, r.pid, r.event_id)
                    stop, _, ops = self._early.pop(key, (0, now, 0))
                    if r.kind == "coll" and r.bytes is not None:
                        self._pending[key] = _RankColl(r, max(r.stop_ns, stop), now, now, ops)
                        if ops and r.seq is not None:
                            proc = (r.host, r.pid, r.comm_id)
                            self._op_seq[proc] = max(self._op_seq.get(proc, -1), r.seq)
                elif isinstance(r, NcclProxyOp):
                    info = self._rank(r)
                    if r.peer not in info.peers:
                        info.peers.add(r.peer)
                        self._dirty_jobs.add(r.job_id)
                    if r.parent_id is not None:
                        parent = (r.host, r.pid, r.parent_id)
                        if (p := self._pending.get(parent)) is not None:
                            p.end_ns, p.touched, p.ops = max(p.end_ns, r.stop_ns), now, p.ops + 1
                            seq = p.rec.seq if p.rec.seq is not None else -1
                            proc = (r.host, r.pid, r.comm_id)
                            self._op_seq[proc] = max(self._op_seq.get(proc, -1), seq)
                        elif len(self._early) < MAX_PENDING:
                            stop, seen, ops = self._early.get(parent, (0, now, 0))
                            self._early[parent] = (max(stop, r.stop_ns), now, ops + 1)
                elif isinstance(r, (NcclProxyStep, NcclStepStats)):
                    info = self._rank(r)
                    before = (len(info.qps), len(info.devices), len(info.peers))
                    if r.connection is not None and len(info.qps) < 4096:
                        info.qps.add(int(r.connection))
                    if r.net_device is not None and len(info.devices) < 64:
                        info.devices.add(r.net_device)
                    if r.peer is not None:
                        info.peers.add(int(r.peer))
                    if (len(info.qps), len(info.devices), len(info.peers)) != before:
                        self._dirty_jobs.add(r.job_id)  # the job is rewritten only when it learned something

    def _add_qp(self, r: NcclRdmaQp) -> None:
        key = (r.host, r.device, r.lqpn)
        old = self._qps.get(key)
        if old is None or (old.rqpn, old.state, old.path_id) != (r.rqpn, r.state, r.path_id):
            self._dirty_jobs.add(r.job_id)
        self._qps[key] = r
        if len(self._qps) > MAX_QPS:
            for k in sorted(self._qps, key=lambda k: self._qps[k].ts)[:MAX_QPS // 10]:
                del self._qps[k]

    def _routes(self, job_id: str) -> list[QpRoute]:
        return join_qps(q for q in self._qps.values() if q.job_id == job_id)

    def qp_targets(self, host: str, limit: int = 4096, now_ns: int | None = None) -> list[dict]:
        """This host's joined QPs with where their packets go (the peer end's netdev address): what
        its agent traces (hostprobe/qp_trace.py; handed out with its peer list). QPs whose agents have
        not reported them for QP_STALE_NS (destroyed) are not traced."""
        since = (time.time_ns() if now_ns is None else now_ns) - QP_STALE_NS
        with self._lock:
            mine = [q for q in self._qps.values() if q.host == host and q.rqpn is not None and q.sport is not None
                    and q.src_addr and q.ts >= since]
            out = []
            for job_id in sorted({q.job_id for q in mine if q.job_id is not None}):
                for route in self._routes(job_id):
                    if route.host != host:
                        continue
                    own = self._qps.get((route.host, route.device, str(route.lqpn)))
                    peer = self._qps.get((route.peer_host, route.peer_device, str(route.rqpn)))
                    if (own is None or peer is None or not own.src_addr or not peer.src_addr or own.sport is None
                            or min(own.ts, peer.ts) < since):
                        continue
                    out.append({"device": route.device, "lqpn": route.lqpn, "sport": own.sport,
                                "src_addr": own.src_addr, "dst_addr": peer.src_addr, "peer_host": route.peer_host})
            return out[:limit]

    def _comm(self, job_id: str, comm_id: str) -> _Comm:
        comm = self._comms.get(comm_id)
        if comm is None:
            comm = self._comms[comm_id] = _Comm(job_id)
        return comm

    def _place(self, comm: _Comm, r) -> None:
        rank = int(r.rank)
        if comm.ranks.get(rank) != r.host:
            comm.ranks[rank] = r.host
            self._dirty_jobs.add(r.job_id)

    def _rank(self, r) -> _RankInfo:
        return self._ranks.setdefault((r.job_id, r.comm_id, int(r.rank)), _RankInfo())

    # --- assembly -----------------------------------------------------------------------------

    def flush(self, force: bool = False) -> list[NcclCollectivePerf]:
        """Assemble the collectives whose records settled; upsert the jobs that changed."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, seen, _) in self._early.items() if now - seen > ORPHAN_S]:
                del self._early[key]  # a parent that never came (p2p ops in other processes, lost records)
            overflow = len(self._pending) - MAX_PENDING
            ready = [k for k, p in self._pending.items() if force or self._rank_done(p, now)]
            if overflow > 0:
                chosen = set(ready)
                ready += sorted((k for k in self._pending if k not in chosen),
                                key=lambda k: self._pending[k].touched)[:overflow]
            for k in ready:
                p = self._pending.pop(k)
                r = p.rec
                seq = r.seq if r.seq is not None else -1
                # one collective of a comm = one seq; without seq each rank's record stands alone
                gkey = (r.job_id, r.comm_id, seq) if seq >= 0 else (r.job_id, r.comm_id, r.host, r.pid, r.event_id)
                self._parts.setdefault(gkey, []).append(p)
            groups = []
            for gkey, parts in list(self._parts.items()):
                comm = self._comms.get(parts[0].rec.comm_id)
                want = max(comm.nranks, len(comm.ranks)) if comm else 1
                waited = now - min(p.arrived for p in parts)
                if force or len(gkey) > 3 or len(parts) >= want or waited >= self.max_wait_s:
                    groups.append(self._parts.pop(gkey))
            perfs = sorted((self._perf(g) for g in groups), key=lambda c: c.start_ns)
            out = []
            for c in perfs:
                c, change = self.detector.observe(c)
                if change:
                    log.info("job %s: %s %s %s slowdown %s", c.job_id, c.comm_id, c.op, c.size_bucket, change)
                self._recent.setdefault(c.job_id, deque(maxlen=512)).append(c)
                out.append(c)
            dirty, self._dirty_jobs = self._dirty_jobs, set()
            jobs = [self._job(j) for j in dirty]
        for job in jobs:
            self._upsert(job)
        if out:
            self.write(out)
        return out

    def _rank_done(self, p: _RankColl, now: float) -> bool:
        """A rank's collective is done when its proxy ops stopped coming (settle_s after the last),
        or when one of its process's later collectives has proxy ops (NCCL runs a communicator's
        collectives in order), or after max_wait_s (no proxy ops: intra-node, or events masked)."""
        if now - p.arrived >= self.max_wait_s:
            return True
        if p.ops and now - p.touched >= self.settle_s:
            return True
        seq = p.rec.seq if p.rec.seq is not None else -1
        return self._op_seq.get((p.rec.host, p.rec.pid, p.rec.comm_id), -1) > seq >= 0

    def _perf(self, ranks: list[_RankColl]) -> NcclCollectivePerf:
        first = ranks[0].rec
        comm = self._comms.get(first.comm_id)
        nranks = max(comm.nranks if comm else 0, len(comm.ranks) if comm else 0, len(ranks))
        start = min(p.rec.start_ns for p in ranks)
        duration = max(max(p.end_ns - p.rec.start_ns for p in ranks), 1)
        size = op_bytes(first.op, first.bytes, nranks)
        algbw, busbw = bandwidths(first.op, size, nranks, duration)
        return NcclCollectivePerf(job_id=first.job_id, comm_id=first.comm_id, op=first.op,
                                  size_bucket=size_bucket(size), start_ns=start,
                                  seq=first.seq if first.seq is not None else -1, bytes=size, nranks=nranks,
                                  ranks_seen=len(ranks), duration_ns=duration, algbw_gbps=algbw, busbw_gbps=busbw)

    # --- jobs ---------------------------------------------------------------------------------

    def _job(self, job_id: str) -> Job:
        ranks, hosts = [], set()
        host_qps: dict[tuple[str, int], set[int]] = {}  # QPs from the hosts' RDMA netlink, joined
        for route in self._routes(job_id):
            if route.comm_id is not None and route.rank is not None:
                host_qps.setdefault((route.comm_id, route.rank), set()).add(route.lqpn)
        for comm_id, comm in self._comms.items():
            if comm.job_id != job_id:
                continue
            for rank, host in sorted(comm.ranks.items()):
                info = self._ranks.get((job_id, comm_id, rank), _RankInfo())
                hosts.add(host)
                qps = sorted(info.qps | host_qps.get((comm_id, rank), set()))[:4096]
                ranks.append(RankPlacement(rank=rank, host=host, comm_id=comm_id, peers=sorted(info.peers)[:4096],
                                           qps=qps, net_devices=sorted(info.devices)))
        return Job(id=job_id, hosts=sorted(hosts), ranks=ranks, start=self._job_start[job_id],
                   labels={SOURCE_LABEL: "nccl"})

    def _upsert(self, found: Job) -> None:
        # read, merged and written at once: flushes run on several threads (and correlate members), and
        # a merge into a job another flush just rewrote would drop what that one learned (QPs are learned once)
        self.state.update_job(found.id, lambda current: found if current is None else merge_jobs(current, found))

    def register(self, job: Job) -> bool:
        """A hand-registered job (POST /jobs): merged with what the plugin found. True when new."""
        def merged(current: Job | None) -> Job:
            found = current is not None and current.labels.get(SOURCE_LABEL) in ("nccl", "api+nccl")
            return merge_jobs(job, current) if found else job
        return self.state.update_job(job.id, merged)

    # --- reads --------------------------------------------------------------------------------

    def recent(self, job_id: str, limit: int = 100) -> list[NcclCollectivePerf]:
        with self._lock:
            return list(self._recent.get(job_id, ()))[-limit:]

    def slowdowns(self, job_id: str | None = None) -> tuple[list[JobSlowdown], list[JobSlowdown]]:
        """(active, cleared) slowdowns, each with the host pairs its ranks' QPs connect."""
        with self._lock:
            active = [self._with_pairs(s) for s in self.detector.active(job_id)]
            cleared = [self._with_pairs(s) for s in self.detector.history if job_id is None or s.job_id == job_id]
        return active, cleared

    def share_slowdowns(self, active: list[JobSlowdown], cleared: list[JobSlowdown]) -> int:
        """Each job's slowdowns into the shared state where they changed since this process last
        wrote them: what API workers of a cluster serve. Returns the jobs written; raises what the
        state store raises (nothing counts as written then)."""
        jobs = sorted({s.job_id for s in active} | {s.job_id for s in cleared})
        bodies = {}
        for job in jobs:
            body = _SLOWDOWNS.dump_json({"active": [s for s in active if s.job_id == job],
                                         "cleared": [s for s in cleared if s.job_id == job]}).decode()
            if self._shared.get(job) != body:
                bodies[job] = body
        if bodies:
            self.state.put_slowdowns(bodies, time.time_ns())
            self._shared.update(bodies)
        return len(bodies)

    def _with_pairs(self, s: JobSlowdown) -> JobSlowdown:
        """The slowdown with its communicator's host pairs and QPs (each joined with its peer's end;
        a QP whose communicator the hosts cannot tell counts when both its hosts hold ranks of it)."""
        comm = self._comms.get(s.comm_id)
        pairs = set()
        qps = []
        if comm is not None:
            for rank, host in comm.ranks.items():
                for peer in self._ranks.get((s.job_id, s.comm_id, rank), _RankInfo()).peers:
                    other = comm.ranks.get(peer)
                    if other is not None and other != host:
                        pairs.add(f"{host}>{other}")
            hosts = set(comm.ranks.values())
            for route in self._routes(s.job_id):
                if route.comm_id == s.comm_id or (route.comm_id is None and {route.host, route.peer_host} <= hosts):
                    qps.append(route)
                    if route.host != route.peer_host:
                        pairs.add(f"{route.host}>{route.peer_host}")
        return s.model_copy(update={"host_pairs": sorted(pairs), "qps": qps[:10_000]})


def _union(a: list[int], b: list[int], limit: int) -> list[int]:
    return sorted(set(a) | set(b))[:limit]


def merge_jobs(registered: Job, found: Job) -> Job:
    """The registered job wins on everything it states; the plugin's data fills in the rest
    (hosts and rank placements it lacks; peers/QPs/devices of ranks on the same host, added up)."""
    by_key = {(r.comm_id, r.rank): r for r in found.ranks}
    ranks, taken = [], set()
    for r in registered.ranks:
        f = by_key.get((r.comm_id, r.rank)) or next(
            (x for x in found.ranks if x.rank == r.rank and r.comm_id is None and x.host == r.host), None)
        if f is not None and f.host == r.host:
            taken.add((f.comm_id, f.rank))
            # what the plugin saw only grows: peers, QPs and devices are the union of both
            r = r.model_copy(update={"comm_id": r.comm_id or f.comm_id, "peers": _union(r.peers, f.peers, 4096),
                                     "qps": _union(r.qps, f.qps, 4096),
                                     "net_devices": _union(r.net_devices, f.net_devices, 64)})
        ranks.append(r)
    placed = {(r.comm_id, r.rank) for r in ranks}
    ranks += [f for f in found.ranks if (f.comm_id, f.rank) not in taken and (f.comm_id, f.rank) not in placed]
    hosts = list(registered.hosts) + [h for h in found.hosts if h not in set(registered.hosts)]
    hosts += [r.host for r in ranks if r.host not in set(hosts)]
    plugin_only = registered.labels.get(SOURCE_LABEL) == "nccl"
    labels = {**found.labels, **registered.labels, SOURCE_LABEL: "nccl" if plugin_only else "api+nccl"}
    return registered.model_copy(update={"hosts": list(dict.fromkeys(hosts)), "ranks": ranks, "labels": labels,
                                         "start": min(registered.start, found.start) if plugin_only
                                         else registered.start})
