"""Each NCCL QP's own fabric path: its RoCE v2 5-tuple traced by the agent, ahead of need.

A RoCE v2 QP's packets are UDP from its netdev's address and the kernel's source port
(hostprobe/rdma_qps.py, `rdma_get_udp_sport`) to the peer's address, port 4791; switches hash that
5-tuple. The agent learns each QP's peer address from the service (it joined both ends of the QP
from the two agents' QP lists: `qps` in the peer list, correlator/qp_join.py), binds a UDP socket to
the QP's source port and Paris-traces the same 5-tuple with the prober's tracer (hostprobe/trace.py,
the RDMA UD mode: forward only, the peer's NIC swallows port 4791 silently, so the trace ends at two
silent TTLs or at the router count the prober's own traces to that peer know). The result rides on
the QP's next NcclRdmaQp record: `dst_addr`, `path_id` (trace.path_id with no reverse hops: the
prober's id for the same path over RDMA UD), `fwd_hops`, `fwd_complete`.

Off the critical path: one round at a time in a thread of its own, on sockets of its own, paced by the
tracer's token bucket (`trace_rate`), at most `max_per_round` QPs a round; a QP is traced again after
`every` seconds (routing may change), or when its destination or port changes. A source port this host
already uses for something else (EADDRINUSE) cannot be traced: counted (`qp_trace_port_busy`), skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from hostprobe.trace import Dest, TraceJob, Tracer, hops_text, path_id, run_blocking
from hostprobe.tstamp import StampedSocket

log = logging.getLogger(__name__)

ROCE_V2_PORT = 4791
ROUND_DEADLINE = 30.0  # seconds: a round gives up on traces still running after this


@dataclass(frozen=True)
class QpTarget:
    """One of this host's QPs as the service joined it: where its packets go."""
    device: str
    lqpn: int
    sport: int
    src_addr: str
    dst_addr: str


@dataclass(frozen=True)
class QpPath:
    dst_addr: str
    sport: int
    path_id: str
    fwd_hops: str
    fwd_complete: bool
    traced_at: float  # monotonic


def parse_targets(items: list) -> tuple[list[QpTarget], list[str]]:
    """The service's `qps` list -> targets; entries it cannot use are named, not raised."""
    out, bad = [], []
    for i, item in enumerate(items or []):
        try:
            t = QpTarget(device=str(item["device"]), lqpn=int(item["lqpn"]), sport=int(item["sport"]),
                         src_addr=str(item["src_addr"]), dst_addr=str(item["dst_addr"]))
        except (KeyError, TypeError, ValueError) as e:
            bad.append(f"qps[{i}]: {type(e).__name__}: {e}")
            continue
        if not 0xC000 <= t.sport <= 0xFFFF:
            bad.append(f"qps[{i}]: sport {t.sport} is not a RoCE v2 source port (0xC000..0xFFFF)")
            continue
        out.append(t)
    return out, bad


class QpTracer:
    """The QPs' traces and their latest paths, (device, lqpn) -> QpPath."""

    def __init__(self, key: bytes, session: int, max_hops: int, rate: float, next_seq, stats: dict,
                 every: float = 300.0, max_per_round: int = 256, known_hops=None):
        self.key, self.session, self.max_hops, self.rate, self.next_seq = key, session, max_hops, rate, next_seq
        self.stats, self.every, self.max_per_round = stats, every, max_per_round
        self.known_hops = known_hops or (lambda src, dst: None)  # the prober's router count to a peer
        self.targets: dict[tuple[str, int], QpTarget] = {}
        self.paths: dict[tuple[str, int], QpPath] = {}
        self._thread: threading.Thread | None = None

    def set_targets(self, items: list) -> None:
        targets, bad = parse_targets(items)
        if bad:
            self.stats["qp_trace_bad_targets"] = self.stats.get("qp_trace_bad_targets", 0) + len(bad)
            log.warning("service's QP list: %d entries not usable, first: %s", len(bad), bad[0])
        self.targets = {(t.device, t.lqpn): t for t in targets}  # one assignment: the round's thread reads it

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def due(self, now: float) -> list[QpTarget]:
        out = []
        for key, t in list(self.targets.items()):
            p = self.paths.get(key)
            if p is None or (p.dst_addr, p.sport) != (t.dst_addr, t.sport) or now - p.traced_at >= self.every:
                out.append(t)
        return out[:self.max_per_round]

    def start(self, now: float) -> int:
        """Start a round in a thread when QPs are due and none runs; how many QPs it traces."""
        if self.every <= 0 or self.busy:
            return 0
        due = self.due(now)
        if due:
            self._thread = threading.Thread(target=self._round, args=(due, now), name="qp-trace", daemon=True)
            self._thread.start()
        return len(due)

    def _round(self, due: list[QpTarget], now: float) -> None:
        try:
            self.trace(due, now)
        except Exception:
            log.exception("tracing the QPs' paths failed")

    def trace(self, due: list[QpTarget], now: float | None = None) -> int:
        """Trace these QPs now (blocking); how many got a path. `now`: the caller's clock (the reporter's
        monotonic time), when the paths count as traced."""
        started = time.monotonic() if now is None else now
        tracer = Tracer(self.key, self.session, self.max_hops, self.rate, self.next_seq)
        jobs: list[tuple[QpTarget, TraceJob]] = []
        sockets: dict[tuple[str, int], StampedSocket] = {}
        try:
            for t in due:
                sock = sockets.get((t.src_addr, t.sport))
                if sock is None:
                    try:
                        sock = sockets[(t.src_addr, t.sport)] = StampedSocket(t.src_addr, t.sport)
                    except OSError as e:
                        key = "qp_trace_port_busy" if e.errno == 98 else "qp_trace_errors"
                        self.stats[key] = self.stats.get(key, 0) + 1
                        continue
                elif any(j.target.addr == t.dst_addr and j.sock is sock for _, j in jobs):
                    continue  # two QPs, one 5-tuple (both ends' QP pairs hash alike): traced once
                job = TraceJob(sock, Dest(t.dst_addr, ROCE_V2_PORT, known_hops=self.known_hops(t.src_addr,
                                                                                                t.dst_addr)))
                jobs.append((t, job))
                tracer.add(job)
            run_blocking(tracer, list(sockets.values()), ROUND_DEADLINE)
        finally:
            for sock in sockets.values():
                sock.close()
        by_tuple = {(t.src_addr, t.sport, t.dst_addr): j for t, j in jobs}
        found = 0
        for t in due:
            job = by_tuple.get((t.src_addr, t.sport, t.dst_addr))
            if job is None or not job.finished:
                continue
            self.paths[(t.device, t.lqpn)] = QpPath(t.dst_addr, t.sport, path_id(t.src_addr, t.dst_addr, job.fwd, []),
                                                    hops_text(job.fwd), job.fwd_done and None not in job.fwd,
                                                    started)
            found += 1
        self.stats["qp_traces"] = self.stats.get("qp_traces", 0) + found
        return found

    def path_fields(self, device: str, lqpn: int, sport: int | None) -> dict:
        """The NcclRdmaQp path fields of a QP (empty until traced with its current port)."""
        p = self.paths.get((device, lqpn))
        if p is None or p.sport != sport:
            return {}
        return {"dst_addr": p.dst_addr, "path_id": p.path_id, "fwd_hops": p.fwd_hops[:1024],
                "fwd_complete": p.fwd_complete}
