"""The answering side: one listening socket per NIC on the fabric-wide probe port.

PROBE -> REPLY carrying t2 (our kernel RX stamp), sent with a TX stamp request; once the stamps
(t3) come back on the error queue, one FOLLOWUP per prober carries all of them (a coded pair's two
replies usually share one). Traceroute probes get an unstamped REPLY, or an ECHO sent with the
requested IP TTL; a router's time-exceeded for that ECHO comes back here and is reported to the
prober as a HOP. Packets that are not ours, or whose MAC is wrong, are dropped and counted.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from hostprobe import tstamp, wire
from hostprobe.trace import ip_to_int

log = logging.getLogger(__name__)


class Responder:
    def __init__(self, sock, key: bytes, session: int, clock, stats: dict):
        self.sock = sock  # a tstamp.StampedSocket, or a hostprobe.verbs.Endpoint
        self.key, self.session, self.clock, self.stats = key, session, clock, stats
        self.echoes: dict[tuple[str, int], tuple[int, int, int]] = {}  # dest -> (session, seq, ttl)

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self) -> None:
        key, clock, stats = self.key, self.clock, self.stats
        # an error an ICMP left on the socket (e.g. an ECHO expired) is skipped by receive
        for msg, raw, addr in self.sock.receive(key, stats):
            if msg.type != wire.PROBE:
                stats["rx_unexpected"] += 1
                continue
            stats["probes_answered"] += 1
            if msg.flags & wire.TRACE:
                self._answer_trace(msg, addr)
                continue
            if not raw:
                stats["rx_stamp_missing"] += 1
            t2 = clock.host(raw) if raw else 0
            reply = wire.encode(key, wire.REPLY, msg.session, msg.seq, flags=clock.epoch & 0xFFFF,
                                rsession=self.session, ta=t2)
            if not self.sock.send(reply, addr, token=(addr, msg.session, msg.seq)):
                stats["send_errors"] += 1

    def _answer_trace(self, msg: wire.Message, addr) -> None:
        if msg.aux:  # reverse trace step: an ECHO with IP TTL aux
            self.echoes[addr] = (msg.session, msg.seq, msg.aux)
            if len(self.echoes) > 4096:
                self.echoes.pop(next(iter(self.echoes)))
            pkt = wire.encode(self.key, wire.ECHO, msg.session, msg.seq, aux=msg.aux, rsession=self.session)
            self.sock.send(pkt, addr, ttl=msg.aux)
        else:
            pkt = wire.encode(self.key, wire.REPLY, msg.session, msg.seq, rsession=self.session)
            self.sock.send(pkt, addr)

    def on_errqueue(self) -> None:
        followups: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        pending = self.sock.pending
        stamps, errors = self.sock.drain_errqueue()
        host = self.clock.host
        for key, stamp in stamps:
            token = pending.pop(key, None)  # None: the lab's second stamp of a packet
            if token is not None:
                addr, session, seq = token
                followups[(addr, session)].append((seq, host(stamp)))
        for entry in errors:
            if entry.icmp_type == tstamp.ICMP_TIME_EXCEEDED and entry.dest and entry.offender:
                self._report_hop(entry)
        for (addr, session), stamps in followups.items():
            for i in range(0, len(stamps), wire.MAX_FOLLOWUPS):
                chunk = stamps[i:i + wire.MAX_FOLLOWUPS]
                pkt = wire.encode(self.key, wire.FOLLOWUP, session, chunk[0][0], flags=self.clock.epoch & 0xFFFF,
                                  rsession=self.session, entries=chunk)
                if not self.sock.send(pkt, addr):
                    self.stats["send_errors"] += 1
        if len(pending) > 8192:  # stamps that never came (e.g. dropped before the driver)
            for k in [k for k in pending if k < self.sock.next_key - 4096]:
                del pending[k]

    def _report_hop(self, entry) -> None:
        dest = (entry.dest[0], entry.dest[1])
        quoted = wire.peek(entry.data)
        if quoted is not None and quoted[0] == wire.ECHO:
            _, ttl, session, seq = quoted
        elif dest in self.echoes:
            session, seq, ttl = self.echoes[dest]
        else:
            return
        icmp = entry.icmp_type << 8 | entry.icmp_code
        pkt = wire.encode(self.key, wire.HOP, session, seq, aux=ttl, flags=icmp, rsession=self.session,
                          ta=ip_to_int(entry.offender))
        self.sock.send(pkt, dest)

    def close(self) -> None:
        self.sock.close()


def make_responders(nics, port: int, key: bytes, session: int, clock, stats: dict) -> list[Responder]:
    out = []
    for nic in nics:
        try:
            out.append(Responder(tstamp.StampedSocket(nic.address, port), key, session, clock, stats))
        except OSError as e:
            for r in out:
                r.close()
            raise OSError(e.errno, f"cannot listen on {nic.address}:{port} ({nic.name}): {e.strerror}") from None
    return out
