"""Kernel software timestamps (SO_TIMESTAMPING) and the socket error queue, from Python.

Python's socket module lacks these constants; the values are the kernel's (include/uapi/linux/
net_tstamp.h, errqueue.h, in.h). Receive stamps come as an SO_TIMESTAMPING cmsg with the packet.
Transmit stamps are requested per packet (an SO_TIMESTAMPING cmsg on sendmsg), so follow-ups and
traceroute probes are not stamped, and come back on the error queue with a sock_extended_err whose
ee_data is the OPT_ID key: a per-socket counter of stamped sends that succeeded (a send that
fails takes no key). The same queue carries ICMP errors (IP_RECVERR), e.g. time exceeded from a
router for a traceroute probe, with the router's address as the "offender".

In the fabric lab a packet's TX stamp is reported twice (the host's veth and the lab's wire veth
both stamp it): the first report of a key is the host's and is the one used.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

from hostprobe import wire

SO_TIMESTAMPING = 37
SOF_TX_SOFTWARE = 1 << 1
SOF_RX_SOFTWARE = 1 << 3
SOF_SOFTWARE = 1 << 4
SOF_OPT_ID = 1 << 7
SOF_OPT_TSONLY = 1 << 11
IP_RECVERR = 11
IP_TTL = 2
MSG_ERRQUEUE = 0x2000
SO_EE_ORIGIN_ICMP = 2
SO_EE_ORIGIN_TIMESTAMPING = 4
ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3

SOCKET_FLAGS = SOF_RX_SOFTWARE | SOF_SOFTWARE | SOF_OPT_ID | SOF_OPT_TSONLY
ERRQUEUE_FLAGS = MSG_ERRQUEUE | int(socket.MSG_DONTWAIT)  # a plain int: IntFlag `|` is slow per call
TX_STAMP_CMSG = (socket.SOL_SOCKET, SO_TIMESTAMPING, struct.pack("I", SOF_TX_SOFTWARE))

_TIMESPECS = struct.Struct("qqqqqq")  # scm_timestamping: software, legacy (unused), raw hardware
_EE = struct.Struct("IBBBBII")  # sock_extended_err: errno, origin, type, code, pad, info, data
_OFFENDER = struct.Struct("=HH4s")  # sockaddr_in right after it: family, port, address
_KEY = struct.Struct("I")  # ee_data, at offset 12 of sock_extended_err
_SEC_NSEC = struct.Struct("qq")
CMSG_SPACE = 512
# errors a pending ICMP leaves on a UDP socket (sk_err): the next send or recv reports it once
TRANSIENT = {errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETUNREACH, errno.EPROTO, errno.EMSGSIZE}


class ErrQueueEntry(NamedTuple):
    origin: int  # SO_EE_ORIGIN_*
    key: int  # OPT_ID key (timestamps)
    stamp_ns: int  # the TX stamp; for ICMP errors the time the ICMP arrived (0 if none)
    icmp_type: int
    icmp_code: int
    offender: str | None  # router that sent the ICMP error
    dest: tuple[str, int] | None  # destination of the packet that failed (ICMP errors)
    data: bytes  # quoted payload of the failed packet (ICMP errors)


def enable(sock: socket.socket) -> None:
    """Kernel RX stamps on every packet, TX stamps on request, ICMP errors on the error queue."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SOCKET_FLAGS)
    sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)


def software_stamp(ancdata: list) -> int:
    """The kernel software stamp (ns) from recvmsg ancillary data; 0 when absent or zero."""
    for level, type_, data in ancdata:
        if level == socket.SOL_SOCKET and type_ == SO_TIMESTAMPING and len(data) >= 16:
            sec, nsec = _TIMESPECS.unpack_from(data.ljust(_TIMESPECS.size, b"\0"))[:2]
            return sec * 1_000_000_000 + nsec
    return 0


def parse_errqueue(data: bytes, ancdata: list, address) -> ErrQueueEntry | None:
    """One error-queue message: a TX timestamp or an ICMP error; None for anything else."""
    stamp = software_stamp(ancdata)
    for level, type_, cdata in ancdata:
        if level == socket.IPPROTO_IP and type_ == IP_RECVERR and len(cdata) >= _EE.size:
            _errno, origin, icmp_type, icmp_code, _pad, _info, key = _EE.unpack_from(cdata)
            offender = None
            if origin == SO_EE_ORIGIN_ICMP and len(cdata) >= _EE.size + _OFFENDER.size:
                family, _port, addr = _OFFENDER.unpack_from(cdata, _EE.size)
                if family == socket.AF_INET:
                    offender = socket.inet_ntoa(addr)
            if origin not in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_TIMESTAMPING):
                return None
            dest = tuple(address) if origin == SO_EE_ORIGIN_ICMP and address else None
            return ErrQueueEntry(origin, key, stamp, icmp_type, icmp_code, offender, dest, data)
    return None


def drain_errqueue(sock: socket.socket, limit: int = 512) -> tuple[list[tuple[int, int]], list[ErrQueueEntry]]:
    """Drain the error queue (non-blocking): ([(OPT_ID key, TX stamp ns)], [ICMP errors]).

    The hot path of the agent (two TX stamps per exchange, four in the lab): timestamps are picked
    out of the cmsgs directly, ICMP errors get the full parse."""
    stamps: list[tuple[int, int]] = []
    errors: list[ErrQueueEntry] = []
    recvmsg, sol, ipproto = sock.recvmsg, socket.SOL_SOCKET, socket.IPPROTO_IP
    for _ in range(limit):
        try:
            data, ancdata, _flags, address = recvmsg(2048, CMSG_SPACE, ERRQUEUE_FLAGS)
        except (BlockingIOError, InterruptedError):
            break
        except OSError as e:
            if e.errno in TRANSIENT:
                continue
            raise
        key = stamp = -1
        for level, type_, cdata in ancdata:
            if level == ipproto and type_ == IP_RECVERR and len(cdata) >= _EE.size:
                if cdata[4] != SO_EE_ORIGIN_TIMESTAMPING:
                    break
                key = _KEY.unpack_from(cdata, 12)[0]
            elif level == sol and type_ == SO_TIMESTAMPING and len(cdata) >= 16:
                sec, nsec = _SEC_NSEC.unpack_from(cdata)
                stamp = sec * 1_000_000_000 + nsec
        else:
            if key >= 0 and stamp > 0:
                stamps.append((key, stamp))
            continue
        entry = parse_errqueue(data, ancdata, address)
        if entry is not None:
            errors.append(entry)
    return stamps, errors


def read_errqueue(sock: socket.socket, limit: int = 256) -> list[ErrQueueEntry]:
    """Drain the error queue into entries of both kinds (tests and tools; the agent uses drain_errqueue)."""
    stamps, errors = drain_errqueue(sock, limit)
    return [ErrQueueEntry(SO_EE_ORIGIN_TIMESTAMPING, k, t, 0, 0, None, None, b"") for k, t in stamps] + errors


def clear_error(sock: socket.socket) -> None:
    """Reset a pending socket error (level-triggered EPOLLERR with an empty error queue)."""
    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def ttl_cmsg(ttl: int) -> tuple[int, int, bytes]:
    return (socket.IPPROTO_IP, IP_TTL, struct.pack("i", ttl))


class StampedSocket:
    """A UDP socket with kernel stamps, and the bookkeeping to match TX stamps to sends by OPT_ID.
    (hostprobe.verbs.Endpoint and VerbsPort offer the same send/receive/drain_errqueue.)"""

    __slots__ = ("sock", "addr", "port", "next_key", "pending")
    reply_tag = 0  # what PROBEs ask of the reply's path (verbs: a flow label); nothing over UDP

    def __init__(self, addr: str, port: int):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.bind((addr, port))
            enable(self.sock)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.addr, self.port = self.sock.getsockname()
        self.next_key = 0  # the OPT_ID key the next stamped send will get
        self.pending: dict[int, object] = {}  # key -> what was sent (an Exchange or a responder token)

    def send(self, payload: bytes, dest: tuple[str, int], token: object = None, ttl: int | None = None) -> bool:
        """Send; with a token, request a TX stamp and remember the token under its key.

        Retries once on an error left behind by an earlier ICMP (see TRANSIENT); False if not sent."""
        cmsgs = []
        if token is not None:
            cmsgs.append(TX_STAMP_CMSG)
        if ttl is not None:
            cmsgs.append(ttl_cmsg(ttl))
        for _ in range(2):
            try:
                self.sock.sendmsg([payload], cmsgs, 0, dest)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as e:
                if e.errno in TRANSIENT:
                    continue
                return False  # e.g. EPERM from a local firewall: counted by the caller as not sent
            if token is not None:
                self.pending[self.next_key] = token
                self.next_key += 1
            return True
        return False

    def receive(self, key: bytes, stats: dict, batch: int = 256) -> Iterator[tuple[wire.Message, int, tuple]]:
        """(message, kernel RX stamp ns or 0, sender) for each of up to `batch` datagrams of ours
        waiting. Foreign, forged and other-version packets are counted in `stats` (rx_<kind>) and
        skipped; an error an ICMP left on the socket (TRANSIENT) is skipped too: the queue is read on."""
        recvmsg, decode, bad = self.sock.recvmsg, wire.decode, wire.BadPacket
        for _ in range(batch):
            try:
                data, anc, _flags, addr = recvmsg(2048, CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in TRANSIENT:
                    continue
                raise
            try:
                msg = decode(key, data)
            except bad as e:
                stats[f"rx_{e.kind}"] += 1
                continue
            yield msg, software_stamp(anc), addr

    def drain_errqueue(self) -> tuple[list[tuple[int, int]], list[ErrQueueEntry]]:
        """TX stamps and ICMP errors waiting (drain_errqueue); a bare socket error is cleared."""
        stamps, errors = drain_errqueue(self.sock)
        if not stamps and not errors:
            clear_error(self.sock)
        return stamps, errors

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
