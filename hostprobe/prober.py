"""The probing side: source-port sockets per NIC, paths per peer, coded pairs, windows, path events.

Per local NIC, `probe.sports` UDP sockets (one per source port) are shared by all peers. Every
(source port, peer) 5-tuple is traced (trace.py); source ports that share a round-trip path id
are one path, and one of them probes it. Each path sends `rate` exchanges per second as coded
pairs; each exchange's four stamps land in the 1 s window (local clock) it was sent in. A window
closes `timeout` after its end: its numbers become a ProbeWindow. A path that was answering and
then gets no reply for `down_after` is down (PathEvent at once); its next reply brings it back.
A window whose last exchanges are all unanswered while its path is still up waits until the path
answers again or goes down: a window a link died in is then never reported before the PathEvent,
so its partial loss is not mistaken for a lossy link.
"""

from __future__ import annotations

import heapq
import logging
import random
import time
from collections import deque
from itertools import count

from hostprobe import tstamp, wire
from hostprobe.stats import Exchange, judge_pair, window_stats
from hostprobe.trace import TraceJob, Tracer, hops_text, int_to_ip
from hostprobe.verbs import ROCE_V2_PORT
from nms.records import PathEvent, ProbePath, ProbeWindow

log = logging.getLogger(__name__)

WINDOW_NS = 1_000_000_000
CLOSE_GRACE_NS = 100_000_000
CATCH_UP = 0.05  # seconds of send backlog made up for (the loop runs every few ms), beyond it skipped
NEVER_UP_AFTER = 3.0  # seconds: a path that never answered is reported down after this long
RETRACE_UNREACHED = 15.0  # seconds: peers whose traces missed a hop or the peer are traced again this soon


class LocalNic:
    """A local NIC: its UDP source-port sockets and, with an RDMA device, its RoCE v2 source ports
    (hostprobe.verbs.VerbsPort, all on one prober QP, `verbs`)."""

    def __init__(self, name: str, address: str, sockets: list[tstamp.StampedSocket], verbs=None,
                 verbs_ports: list | None = None):
        self.name, self.address, self.sockets = name, address, sockets
        self.verbs, self.verbs_ports = verbs, verbs_ports or []


class Target:
    """One (local NIC, peer NIC) pair and the paths between them."""

    def __init__(self, nic: LocalNic, host: str, nic_name: str, addr: str, port: int, qpn: int | None = None):
        self.nic, self.host, self.nic_name, self.addr = nic, host, nic_name, addr
        # over RDMA UD (the peer's responder QP is known and we have a RoCE device): probes go to that
        # QP from the RoCE source ports, and paths are the RoCE 5-tuples (dport 4791)
        self.verbs = qpn is not None and bool(nic.verbs_ports)
        self.sockets = nic.verbs_ports if self.verbs else nic.sockets
        self.dest = (addr, qpn) if self.verbs else (addr, port)
        self.wire_port = ROCE_V2_PORT if self.verbs else port
        self.paths: dict[str, PathState] = {}  # probed, by path id
        self.announced: dict[str, ProbePath] = {}  # what the service was told of each path
        self.retired: list[PathState] = []  # no longer probed; kept until their windows close
        self.jobs: list[TraceJob] = []  # the current trace round
        self.tracing = 0
        self.traced_at = 0.0
        self.reached = False
        self.complete = False  # every trace reached the peer and back without a silent hop
        self.unreachable = False  # the peer answered "port unreachable": no agent listening

    @property
    def key(self) -> tuple[str, str, str]:
        return self.nic.name, self.host, self.nic_name

    def routers(self) -> int | None:
        """How many routers every path to the peer crosses, from complete traces without a silent hop
        (ECMP paths are equal-cost); None when no such trace or the paths disagree."""
        counts = {len(r.fwd_hops.split(",")) for r in self.announced.values()
                  if r.fwd_complete and r.fwd_hops and "*" not in r.fwd_hops.split(",")}
        return counts.pop() if len(counts) == 1 else None


class PathState:
    __slots__ = ("target", "sock", "path_id", "state", "last_reply", "last_reply_ns", "down_ns", "unanswered",
                 "first_sent", "windows", "active", "turn", "answered_mono", "focus_rate", "focus_until")

    def __init__(self, target: Target, sock: tstamp.StampedSocket, path_id: str):
        self.target, self.sock, self.path_id = target, sock, path_id
        self.state = "unknown"  # -> up (first reply), down (silence), up (replies again)
        self.last_reply = 0.0  # monotonic
        self.last_reply_ns = 0  # local clock
        self.down_ns = 0
        self.unanswered = 0
        self.first_sent = 0.0
        self.windows: dict[int, list[Exchange]] = {}
        self.active = True
        self.turn = 0  # the schedule entry that counts; older ones (before a rate change) are skipped
        self.answered_mono = 0.0  # send time of the latest exchange that got a reply
        self.focus_rate = 0.0  # exchanges/s while focused (the `focus` command), until focus_until (monotonic)
        self.focus_until = 0.0


class Prober:
    def __init__(self, host: str, nics: list[LocalNic], settings, key: bytes, session: int, clock, stats: dict,
                 emit):
        self.host, self.nics, self.cfg = host, nics, settings
        self.key, self.session, self.clock, self.stats, self.emit = key, session, clock, stats, emit
        self.port = settings.port
        self.rate = settings.rate
        self.guard_ns = int(settings.purity_guard_us * 1000)
        self.timeout_ns = int(settings.timeout * 1e9)
        self.targets: dict[tuple[str, str, str], Target] = {}
        self.inflight: dict[int, Exchange] = {}
        self.sent_order: deque[tuple[float, int]] = deque()
        self.schedule: list[tuple[float, int, int, PathState]] = []
        self._tie = count()
        self._seq = random.getrandbits(31)
        self.tracer = Tracer(key, session, settings.max_hops, settings.trace_rate, self.next_seq)
        self.retired_targets: list[Target] = []  # peers no longer listed, until their windows close
        self.clock_sync = None  # hostprobe.clock_edges.ClockSync: gets each closed window's exchanges
        self.closed_before = 0  # local clock ns: every window starting before it has closed

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    # -- peers and paths ---------------------------------------------------------------------------
    def set_peers(self, peers: list[dict]) -> None:
        """Peers as the service lists them: [{host, nics: [{name, address, qpn?}]}]. Local NIC i probes
        the peer's NIC i (rails), or its first NIC when it has fewer; over RDMA UD when the peer NIC has
        a responder QP (qpn) and ours an RDMA device, else over UDP."""
        wanted: dict[tuple[str, str, str], Target] = {}
        for peer in peers:
            if peer["host"] == self.host or not peer.get("nics"):
                continue
            for i, nic in enumerate(self.nics):
                pnic = peer["nics"][i] if i < len(peer["nics"]) else peer["nics"][0]
                wanted[(nic.name, peer["host"], pnic["name"])] = Target(nic, peer["host"], pnic["name"],
                                                                        pnic["address"], self.port, pnic.get("qpn"))
        for key in list(self.targets):
            if key not in wanted or self.targets[key].dest != wanted[key].dest:
                self._drop_target(self.targets.pop(key))
        new = []
        for key, target in wanted.items():
            if key not in self.targets:
                self.targets[key] = target
                new.append(target)
        if new:
            log.info("probing %d new peer NICs (%d in all)", len(new), len(self.targets))
            self.trace(new)

    def announce_paths(self) -> int:
        """Tell the service every probed path again (it restarted: its correlator knows no path's
        hops until told, and without them it would pin a spine link's loss on the hosts' access
        links). Returns how many."""
        now_ns = self.clock.now()
        records = [r.model_copy(update={"ts": now_ns}) for t in self.targets.values() for r in t.announced.values()]
        for record in records:
            self.emit("probe_paths", record)
        return len(records)

    def _drop_target(self, target: Target) -> None:
        for path in target.paths.values():
            path.active = False
            target.retired.append(path)
        self.retired_targets.append(target)
        target.paths = {}

    def trace(self, targets: list[Target] | None = None) -> None:
        """Start a trace round (all targets by default) unless one is running for them."""
        now = time.monotonic()
        for target in targets if targets is not None else list(self.targets.values()):
            if target.tracing:
                continue
            target.jobs = [TraceJob(sock, target) for sock in target.sockets]
            target.tracing = len(target.jobs)
            target.traced_at = now
            for job in target.jobs:
                self.tracer.add(job)

    def _trace_finished(self, job: TraceJob) -> None:
        target = job.target
        if self.targets.get(target.key) is not target:
            return
        target.tracing -= 1
        if target.tracing == 0:
            self._regroup(target)

    def _regroup(self, target: Target) -> None:
        groups: dict[str, list[TraceJob]] = {}
        whole = [j for j in target.jobs if not j.gaps]
        for job in target.jobs:
            pid = job.path_id
            if job.gaps:  # a silent hop (an ICMP lost to rate limiting) is a gap, not another path
                fits = {w.path_id for w in whole if job.fits(w)}
                if len(fits) == 1:
                    pid = fits.pop()
            groups.setdefault(pid, []).append(job)
        target.reached = any(j.fwd_done and not j.unreachable for j in target.jobs)
        target.complete = target.reached and not any(j.gaps for j in target.jobs)
        target.unreachable = any(j.unreachable for j in target.jobs)
        now_ns = self.clock.now()
        old, target.paths, target.announced = target.paths, {}, {}
        for pid, jobs in groups.items():
            jobs.sort(key=lambda j: (j.gaps, j.sport))  # a complete trace describes the path
            path = old.pop(pid, None)
            if path is None or path.sock.port not in {j.sport for j in jobs}:
                if path is not None:
                    path.active = False
                    target.retired.append(path)
                path = PathState(target, jobs[0].sock, pid)
                self._schedule(path, time.monotonic() + random.random() * 2 / self.rate)
            target.paths[pid] = path
            first = jobs[0]
            target.announced[pid] = ProbePath(
                src_host=self.host, src_nic=target.nic.name, dst_host=target.host, dst_nic=target.nic_name,
                path_id=pid, ts=now_ns, src_addr=target.nic.address, dst_addr=target.addr, dport=target.wire_port,
                sports=",".join(str(sp) for sp in sorted(j.sport for j in jobs)), probed_sport=path.sock.port,
                fwd_hops=hops_text(first.fwd), rev_hops=hops_text(first.rev),
                fwd_complete=first.fwd_done and not first.unreachable, rev_complete=first.rev_done)
            self.emit("probe_paths", target.announced[pid])
        for path in old.values():
            path.active = False
            target.retired.append(path)
        log.debug("%s:%s via %s: %d paths from %d source ports", target.host, target.nic_name, target.nic.name,
                  len(groups), len(target.jobs))

    # -- sending ---------------------------------------------------------------------------------
    def set_rate(self, rate: float) -> None:
        self.rate = rate
        now = time.monotonic()
        for target in self.targets.values():
            for path in target.paths.values():
                self._schedule(path, now + random.random() * 2 / rate)

    def focus(self, path_ids: set[str], rate: float, for_s: float) -> int:
        """Probe these paths (of any target) at `rate` exchanges/s (never slower than the agent's rate)
        for `for_s` seconds, then at the agent's rate again; returns how many of them this agent probes."""
        now = time.monotonic()
        found = 0
        for target in self.targets.values():
            for pid in path_ids & target.paths.keys():
                path = target.paths[pid]
                path.focus_rate, path.focus_until = rate, now + for_s
                self._schedule(path, now + random.random() * 2 / rate)
                found += 1
        return found

    def _schedule(self, path: PathState, due: float) -> None:
        path.turn += 1
        heapq.heappush(self.schedule, (due, next(self._tie), path.turn, path))

    def next_due(self) -> float:
        return self.schedule[0][0] if self.schedule else float("inf")

    def send_due(self, now: float) -> None:
        interval = 2.0 / self.rate  # a pair carries two exchanges
        while self.schedule and self.schedule[0][0] <= now:
            due, _, turn, path = heapq.heappop(self.schedule)
            if turn != path.turn or not path.active or path.target.paths.get(path.path_id) is not path:
                continue
            self._send_pair(path, now)
            if path.focus_until:
                if now < path.focus_until:
                    nxt = due + 2.0 / max(path.focus_rate, self.rate) * (0.9 + 0.2 * random.random())
                    self._schedule(path, nxt if nxt > now - CATCH_UP else now)
                    continue
                path.focus_until = 0.0
            nxt = due + interval * (0.9 + 0.2 * random.random())
            # behind by a pass or two (the loop batches): catch up; far behind (a stall): skip ahead
            self._schedule(path, nxt if nxt > now - CATCH_UP else now + interval * random.random())

    def _send_pair(self, path: PathState, now: float) -> None:
        window = self.clock.now() // WINDOW_NS * WINDOW_NS
        dest, tag = path.target.dest, path.sock.reply_tag
        bucket = path.windows.get(window)
        if bucket is None:
            bucket = path.windows[window] = []
        first = None
        epoch = self.clock.epoch
        for second in (False, True):
            seq = self.next_seq()
            ex = Exchange(seq, path, window, now, second, epoch)
            pkt = wire.encode(self.key, wire.PROBE, self.session, seq, flags=wire.SECOND if second else 0, ta=tag)
            if path.sock.send(pkt, dest, token=ex):
                self.inflight[seq] = ex
                self.sent_order.append((now, seq))
            else:
                self.stats["send_errors"] += 1  # counts as sent and lost: e.g. the NIC lost its route
            bucket.append(ex)
            if first is None:
                first = ex
            else:
                first.mate, ex.mate = ex, first
        path.unanswered += 2
        self.stats["probes_sent"] += 2
        if not path.first_sent:
            path.first_sent = now

    # -- receiving ------------------------------------------------------------------------------
    def on_readable(self, sock: tstamp.StampedSocket) -> None:
        key, clock, stats, inflight, session = self.key, self.clock, self.stats, self.inflight, self.session
        now = time.monotonic()
        # RX stamps (CLOCK_REALTIME: the kernel's, or the NIC's mapped to it) as monotonic times: a path's
        # silence is measured from when its last reply arrived, not from when this (batched) pass got to it
        mono_of_real = now - time.time_ns() / 1e9
        for msg, raw, _addr in sock.receive(key, stats):
            if msg.session != session:
                stats["rx_stale"] += 1  # an answer to an earlier run of this agent
                continue
            kind = msg.type
            if kind == wire.REPLY:
                ex = inflight.get(msg.seq)
                if ex is None:
                    if not self.tracer.on_reply(msg.seq, now):
                        stats["rx_stale"] += 1
                    continue
                if not raw:
                    stats["rx_stamp_missing"] += 1
                ex.t4 = clock.host(raw) if raw else clock.now()
                ex.t2 = msg.ta
                ex.peer_epoch = msg.flags
                path = ex.path
                if path.state != "up":
                    self._path_up(path, now)
                arrived = min(now, raw / 1e9 + mono_of_real) if raw else now
                if arrived > path.last_reply:
                    path.last_reply, path.last_reply_ns = arrived, ex.t4
                path.unanswered = 0
                if ex.sent_mono > path.answered_mono:
                    path.answered_mono = ex.sent_mono
                stats["replies"] += 1
            elif kind == wire.FOLLOWUP:
                for seq, t3 in msg.entries:
                    ex = inflight.get(seq)
                    if ex is not None:
                        ex.t3 = t3
                        if msg.flags != ex.peer_epoch:  # the peer's clock stepped between t2 and t3
                            ex.peer_epoch = -1
            elif kind == wire.ECHO:
                self.tracer.on_echo(msg.seq, now)
            elif kind == wire.HOP:
                self.tracer.on_hop(msg.seq, msg.aux, int_to_ip(msg.ta), now)
            else:
                stats["rx_unexpected"] += 1

    def on_errqueue(self, sock: tstamp.StampedSocket) -> None:
        stamps, errors = sock.drain_errqueue()
        pending, host = sock.pending, self.clock.host
        for key, stamp in stamps:
            ex = pending.pop(key, None)  # None: the lab's second stamp of the same packet
            if ex is not None:
                ex.t1 = host(stamp)
        now = time.monotonic()
        for entry in errors:
            if not self.tracer.on_icmp(sock.port, entry, now):
                if entry.icmp_type == tstamp.ICMP_DEST_UNREACH and entry.icmp_code == 3:
                    self.stats["port_unreachable"] += 1
                    for target in self.targets.values():
                        if target.addr == entry.offender:
                            target.unreachable = True
                else:
                    self.stats["icmp_errors"] += 1

    # -- housekeeping -----------------------------------------------------------------------------
    def check_paths(self, now: float, down_after: float) -> float:
        """Declare silent paths down; return when the next path could go down (the loop wakes then,
        so detection does not wait for a polling tick)."""
        nxt = float("inf")
        for target in self.targets.values():
            for path in target.paths.values():
                if path.state == "up":
                    deadline = path.last_reply + down_after
                    if now >= deadline and path.unanswered >= 2:
                        self._path_down(path, now, f"no reply for {now - path.last_reply:.2f} s "
                                                   f"({path.unanswered} probes unanswered)")
                    elif deadline > now:
                        nxt = min(nxt, deadline)
                elif path.state == "unknown" and path.first_sent:
                    if now - path.first_sent >= NEVER_UP_AFTER:
                        why = "no agent answers on the peer (port unreachable)" if target.unreachable else \
                            f"never answered ({path.unanswered} probes)"
                        self._path_down(path, now, why)
                    else:
                        nxt = min(nxt, path.first_sent + NEVER_UP_AFTER)
        return nxt

    def nic_down(self, nic: str, oper: str) -> None:
        """The kernel says a local NIC went down: its paths are down now, not after down_after."""
        now = time.monotonic()
        for target in self.targets.values():
            if target.nic.name == nic:
                for path in target.paths.values():
                    if path.state == "up":
                        self._path_down(path, now, f"local NIC {nic} is {oper}")

    def _event(self, path: PathState, state: str, reason: str, since_ns: int | None) -> None:
        t = path.target
        self.emit("path_events", PathEvent(
            src_host=self.host, src_nic=t.nic.name, dst_host=t.host, dst_nic=t.nic_name, path_id=path.path_id,
            ts=self.clock.now(), state=state, reason=reason[:512], sport=path.sock.port,
            since_ns=since_ns or None))

    def _path_down(self, path: PathState, now: float, reason: str) -> None:
        path.state = "down"
        path.down_ns = self.clock.now()
        self.stats["path_down_events"] += 1
        log.info("path down: %s -> %s:%s sport %d (%s): %s", path.target.nic.name, path.target.host,
                 path.target.nic_name, path.sock.port, path.path_id, reason)
        self._event(path, "down", reason, path.last_reply_ns)

    def _path_up(self, path: PathState, now: float) -> None:
        previous, path.state = path.state, "up"
        if path.target.unreachable and not path.target.tracing:
            # traced before the peer's agent listened: trace again now rather than announce an
            # unreached path until RETRACE_UNREACHED runs out
            self.trace([path.target])
        if previous == "down":
            self.stats["path_up_events"] += 1
            down_for = (self.clock.now() - path.down_ns) / 1e9
            log.info("path up: %s -> %s:%s sport %d (%s) after %.2f s", path.target.nic.name, path.target.host,
                     path.target.nic_name, path.sock.port, path.path_id, down_for)
            self._event(path, "up", f"replies again after {down_for:.2f} s down", path.down_ns)

    def expire(self, now: float) -> None:
        """Forget exchanges older than the timeout (unanswered ones count as lost)."""
        limit = now - self.timeout_ns / 1e9
        order, inflight = self.sent_order, self.inflight
        while order and order[0][0] < limit:
            inflight.pop(order.popleft()[1], None)
        for nic in self.nics:
            for sock in [*nic.sockets, *([nic.verbs] if nic.verbs else [])]:
                if len(sock.pending) > 8192:  # stamps that never came
                    for k in [k for k in sock.pending if k < sock.next_key - 4096]:
                        del sock.pending[k]

    @property
    def close_lag_ns(self) -> int:
        """A window starting before now - close_lag_ns has closed."""
        return WINDOW_NS + self.timeout_ns + CLOSE_GRACE_NS

    def close_windows(self, final: bool = False) -> int:
        """Close the windows that are due; return how many closed. `closed_before` then says from when
        on windows may still be open."""
        now = self.clock.now()
        horizon = now - self.close_lag_ns
        # a window waiting for its path's verdict (see the module doc) closes anyway this late
        overdue = horizon - int((self.cfg.down_after + 0.5) * 1e9)
        closed, open_from = 0, horizon
        for target in [*self.targets.values(), *self.retired_targets]:
            for path in [*target.paths.values(), *target.retired]:
                for window in sorted(w for w in path.windows if final or w <= horizon):
                    exchanges = path.windows[window]
                    if (not final and window > overdue and path.state == "up" and path.active
                            and target.paths.get(path.path_id) is path and exchanges
                            and path.answered_mono < exchanges[-1].sent_mono):
                        open_from = min(open_from, window)
                        break
                    self._close(path, window)
                    closed += 1
            target.retired = [p for p in target.retired if p.windows]
        self.retired_targets = [t for t in self.retired_targets if t.retired]
        self.closed_before = open_from
        return closed

    def _close(self, path: PathState, window: int) -> None:
        exchanges = path.windows.pop(window)
        for ex in exchanges:
            if ex.second and ex.mate is not None:
                judge_pair(ex.mate, ex, self.guard_ns)
        for ex in exchanges:
            ex.mate = None  # break the pair's reference cycle: freed by refcount, no work for the GC
        numbers = window_stats(exchanges)
        t = path.target
        self.emit("probe_windows", ProbeWindow(
            src_host=self.host, src_nic=t.nic.name, dst_host=t.host, dst_nic=t.nic_name, path_id=path.path_id,
            window_start=window, window_s=WINDOW_NS / 1e9, sport=path.sock.port, **numbers))
        if self.clock_sync is not None:
            self.clock_sync.add(t.host, exchanges)

    def retrace_due(self, now: float, interval: float) -> list[Target]:
        due = []
        for target in self.targets.values():
            if target.tracing:
                continue
            wait = interval if target.complete else min(interval, RETRACE_UNREACHED)
            if now - target.traced_at >= wait:
                due.append(target)
        return due

    def tick_tracer(self, now: float) -> None:
        self.tracer.tick(now)
        for job in self.tracer.take_done():
            self._trace_finished(job)

    def snapshot(self) -> dict:
        paths = [p for t in self.targets.values() for p in t.paths.values()]
        now = time.monotonic()
        return {"targets": len(self.targets), "paths": len(paths),
                "paths_focused": sum(p.focus_until > now for p in paths),
                "paths_up": sum(p.state == "up" for p in paths), "paths_down": sum(p.state == "down" for p in paths),
                "inflight": len(self.inflight), "tracing": sum(t.tracing > 0 for t in self.targets.values()),
                "rate": self.rate}

    def close(self) -> None:
        for nic in self.nics:
            for sock in [*nic.sockets, *nic.verbs_ports]:
                sock.close()
