"""Paris traceroute of each (source port, peer) 5-tuple, both directions, and stable path ids.

Forward: probes from the source port's own socket with IP TTL 1, 2, ... (same 5-tuple as the
probes, so the same ECMP hash); each router's ICMP time-exceeded comes back on that socket's error
queue (IP_RECVERR, no raw socket). The peer's reply to the TTL that reaches it ends the trace.

Reverse: the peer sends an ECHO with IP TTL k back along the reply's 5-tuple (its probe port to
our source port) and reports, in a HOP message, the router whose time-exceeded it received; the
ECHO that reaches us ends the trace. So each probed path is known hop by hop in both directions.

Over RDMA UD (hostprobe.verbs) the 5-tuple is our RoCE source port to the peer's port 4791: the
forward trace sends the same kernel UDP packets there, but the peer's NIC consumes them silently.
Such a trace ends at the first of two silent TTLs in a row (the peer, one hop past the last
router), and there is no reverse trace.

One TTL is outstanding per job, so an ICMP error is matched by (socket, destination) even when a
router quotes too little of the probe to read its sequence number. Jobs run concurrently, paced
by a token bucket (routers rate-limit ICMP generation).
"""

from __future__ import annotations

import hashlib
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass

from hostprobe import wire

STEP_TIMEOUT = 0.25  # seconds to wait for one TTL's answer
STEP_TRIES = 3
BURST_S = 0.05  # the token bucket holds this many seconds of trace_rate: routers police ICMP in bursts


def path_id(src: str, dst: str, fwd: list[str | None], rev: list[str | None]) -> str:
    """Stable id of a round-trip path: endpoints and both hop lists ('*' for silent hops)."""
    text = f"{src}>{dst}|{','.join(h or '*' for h in fwd)}|{','.join(h or '*' for h in rev)}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def hops_text(hops: list[str | None]) -> str:
    return ",".join(h or "*" for h in hops)


@dataclass
class Dest:
    """A trace target that is not a probed peer (a steer's candidate flow, a QP's flow): the peer's
    address and port; `verbs` makes a trace end at two silent TTLs in a row (the receiver consumes
    packets to that port without an answer, as a RoCE NIC does on 4791), or at its `known_hops`-th
    router."""
    addr: str
    wire_port: int
    verbs: bool = True
    known_hops: int | None = None  # routers on every path to the peer, when the prober's traces tell


class TraceJob:
    __slots__ = ("sock", "target", "fwd", "rev", "fwd_done", "rev_done", "phase", "ttl", "tries",
                 "seq", "deadline", "finished", "unreachable")

    def __init__(self, sock, target):
        self.sock, self.target = sock, target
        self.fwd: list[str | None] = []
        self.rev: list[str | None] = []
        self.fwd_done = self.rev_done = False  # the destination (resp. we) was reached
        self.phase, self.ttl, self.tries, self.seq, self.deadline = "fwd", 1, 0, 0, 0.0
        self.finished = False
        self.unreachable = False  # the peer answered "port unreachable": no agent there

    @property
    def sport(self) -> int:
        return self.sock.port

    @property
    def path_id(self) -> str:
        return path_id(self.sock.addr, self.target.addr, self.fwd, self.rev)

    @property
    def gaps(self) -> bool:
        return None in self.fwd or None in self.rev

    def fits(self, other: TraceJob) -> bool:
        """Same path as `other` where this trace has answers (its silent hops may be anything)."""
        return all(len(a) == len(b) and all(x is None or x == y for x, y in zip(a, b))
                   for a, b in ((self.fwd, other.fwd), (self.rev, other.rev)))

    def _record(self, hop: str | None) -> None:
        hops = self.fwd if self.phase == "fwd" else self.rev
        del hops[self.ttl - 1:]
        hops.append(hop)


class Tracer:
    """Runs trace jobs inside the agent's event loop (no thread, no blocking)."""

    def __init__(self, key: bytes, session: int, max_hops: int, rate: float, next_seq):
        self.key, self.session, self.max_hops = key, session, max_hops
        self.rate, self.last_refill = rate, 0.0
        self.tokens = self.burst = max(1.0, rate * BURST_S)
        self.next_seq = next_seq  # shared with the prober: one sequence space per session
        self.waiting: deque[TraceJob] = deque()
        self.active: dict[int, TraceJob] = {}  # seq -> job
        self.by_dest: dict[tuple[int, str], TraceJob] = {}  # (our port, peer address) -> job
        self.done: list[TraceJob] = []
        self.sent = 0

    def add(self, job: TraceJob) -> None:
        self.waiting.append(job)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    # -- sending -------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Refill tokens, time out steps, start steps of waiting jobs."""
        if self.last_refill:
            self.tokens = min(self.burst, self.tokens + (now - self.last_refill) * self.rate)
        self.last_refill = now
        for job in [j for j in self.active.values() if now >= j.deadline]:
            self._forget(job)
            if job.tries >= STEP_TRIES:
                job._record(None)  # silent hop
                if job.target.verbs and job.ttl >= 2 and job.fwd[-2:] == [None, None]:
                    del job.fwd[job.ttl - 2:]  # the peer's NIC took the last two: it is one past the last router
                    job.fwd_done = True
                self._advance(job, now)
            else:
                self._send(job, now)
        while self.waiting and self.tokens >= 1:
            job = self.waiting.popleft()
            job.tries = 0
            self._send(job, now)

    def _send(self, job: TraceJob, now: float) -> None:
        self.tokens -= 1
        job.tries += 1
        job.seq = self.next_seq()
        dest = (job.target.addr, job.target.wire_port)
        if job.phase == "fwd":
            pkt = wire.encode(self.key, wire.PROBE, self.session, job.seq, flags=wire.TRACE)
            job.sock.send(pkt, dest, ttl=job.ttl)
        else:  # ask the peer for an ECHO with IP TTL = job.ttl
            pkt = wire.encode(self.key, wire.PROBE, self.session, job.seq, flags=wire.TRACE, aux=job.ttl)
            job.sock.send(pkt, dest)
        self.sent += 1
        job.deadline = now + STEP_TIMEOUT
        self.active[job.seq] = job
        self.by_dest[(job.sock.port, job.target.addr)] = job

    def _forget(self, job: TraceJob) -> None:
        self.active.pop(job.seq, None)
        if self.by_dest.get((job.sock.port, job.target.addr)) is job:
            del self.by_dest[(job.sock.port, job.target.addr)]

    def _advance(self, job: TraceJob, now: float) -> None:
        """Next TTL, next phase, or finished."""
        if job.phase == "fwd" and job.fwd_done and not job.unreachable and not job.target.verbs:
            job.phase, job.ttl = "rev", 1
        elif job.phase == "fwd" and (job.fwd_done or job.unreachable or job.ttl >= self.max_hops):
            job.finished = True  # nobody answers at the far end (or RDMA UD): no reverse trace
        elif job.phase == "rev" and (job.rev_done or job.ttl >= self.max_hops):
            job.finished = True
        else:
            job.ttl += 1
        if job.finished:
            self.done.append(job)
            return
        job.tries = 0
        if self.tokens >= 1:
            self._send(job, now)
        else:
            self.waiting.appendleft(job)

    # -- answers -------------------------------------------------------------------------------
    def on_reply(self, seq: int, now: float) -> bool:
        """A REPLY to a forward trace probe: the destination is ttl hops away."""
        job = self.active.get(seq)
        if job is None or job.phase != "fwd":
            return job is not None
        self._forget(job)
        del job.fwd[job.ttl - 1:]
        job.fwd_done = True
        self._advance(job, now)
        return True

    def on_echo(self, seq: int, now: float) -> bool:
        """An ECHO reached us: the reverse path has ttl - 1 routers."""
        job = self.active.get(seq)
        if job is None or job.phase != "rev":
            return job is not None
        self._forget(job)
        del job.rev[job.ttl - 1:]
        job.rev_done = True
        self._advance(job, now)
        return True

    def on_hop(self, seq: int, ttl: int, router: str, now: float) -> bool:
        """The peer reports which router dropped its ECHO with IP TTL ttl."""
        job = self.active.get(seq)
        if job is None or job.phase != "rev" or ttl != job.ttl:
            return job is not None
        self._forget(job)
        job._record(router)
        self._advance(job, now)
        return True

    def on_icmp(self, port: int, entry, now: float) -> bool:
        """An ICMP error on our source port's socket: a forward hop, or the peer has no agent."""
        if entry.dest is None:
            return False
        job = self.by_dest.get((port, entry.dest[0]))
        quoted = wire.peek(entry.data)
        if job is None or job.phase != "fwd" or (quoted is not None and quoted[3] != job.seq):
            return False
        self._forget(job)
        if entry.icmp_type == 11:  # time exceeded: a router
            job._record(entry.offender)
            # a silent far end (RDMA UD) whose router count is known already (the prober's own traces
            # to that peer: ECMP paths are equal-cost): done at its last router, not two silent TTLs
            # (1.5 s) later
            known = getattr(job.target, "known_hops", None)
            if job.target.verbs and known and job.ttl >= known and None not in job.fwd:
                job.fwd_done = True
        else:  # unreachable from the destination itself: reached, but nobody listens
            del job.fwd[job.ttl - 1:]
            job.fwd_done = entry.offender == job.target.addr
            job.unreachable = True
        self._advance(job, now)
        return True

    def take_done(self) -> list[TraceJob]:
        out, self.done = self.done, []
        return out


def run_blocking(tracer: Tracer, sockets: list, deadline_s: float) -> None:
    """Run the tracer's jobs to their end (or `deadline_s`) in the calling thread, on sockets of
    their own (a steer's candidate ports, a QP's source port): their ICMP errors fed to the tracer,
    anything else that arrives dropped. Blocks; callers run it in a thread of their own."""
    by_fd = {sk.fileno(): sk for sk in sockets}
    poller = select.epoll()
    try:
        for fd in by_fd:
            poller.register(fd, select.EPOLLERR | select.EPOLLIN)
        deadline = time.monotonic() + deadline_s
        while tracer.busy and time.monotonic() < deadline:
            for fd, ev in poller.poll(0.02):
                sk = by_fd[fd]
                if ev & select.EPOLLERR:
                    now = time.monotonic()
                    for entry in sk.drain_errqueue()[1]:
                        tracer.on_icmp(sk.port, entry, now)
                if ev & select.EPOLLIN:
                    _discard(sk)
            tracer.tick(time.monotonic())
    finally:
        poller.close()


def _discard(sock) -> None:
    """Nothing is expected on a trace socket but ICMP errors; drop whatever arrives."""
    while True:
        try:
            sock.sock.recv(2048, socket.MSG_DONTWAIT)
        except OSError:  # BlockingIOError (nothing left), or any other error: stop
            return


def ip_to_int(addr: str) -> int:
    return struct.unpack("!I", socket.inet_aton(addr))[0]


def int_to_ip(value: int) -> str:
    return socket.inet_ntoa(struct.pack("!I", value & 0xFFFFFFFF))
