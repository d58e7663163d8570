"""Probe packet format: a fixed header, an optional list of follow-up stamps, and a keyed MAC.

    offset size  field
    0      2     magic b"NP"
    2      1     version (1)
    3      1     type: PROBE, REPLY, FOLLOWUP, ECHO, HOP
    4      2     flags: PROBE: SECOND (second probe of a coded pair), TRACE (traceroute probe);
                 REPLY and FOLLOWUP: the responder's clock epoch (bumped on each clock step, mod 2^16);
                 HOP: ICMP type << 8 | code
    6      1     aux: PROBE: echo_ttl (0 = normal reply; k = answer with an ECHO sent with IP TTL k);
                      ECHO and HOP: that TTL k
    7      1     count: FOLLOWUP entries after the header
    8      8     session: the prober's session id (random per agent run); every message of an
                 exchange carries the prober's session, so a restarted prober ignores old answers
    16     8     rsession: the responder's session id (0 in PROBE)
    24     4     seq: the prober's exchange number
    28     8     ta (signed ns): REPLY: t2, the responder's kernel RX stamp of the probe (0 = none);
                 HOP: the IPv4 address of the router that answered, as an integer;
                 PROBE over RDMA UD: the flow label the answers are to be sent with (hostprobe.verbs)
    36     12*n  FOLLOWUP: n x (seq u32, t3 i64): the responder's kernel TX stamps of its replies
    end-16 16    keyed BLAKE2b-128(probe key, everything before) (RFC 7693's keyed mode is a MAC; four
                 times cheaper than HMAC-SHA256 in Python, which was a tenth of the agent's CPU)

A packet that is too short or has another magic is "foreign"; one with our magic and a wrong MAC
is "forged"; both are dropped and counted by the caller. Times are the sender's (possibly emulated)
clock in ns since the epoch.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from typing import NamedTuple

MAGIC = b"NP"
VERSION = 2  # 2: BLAKE2b MAC (1 was HMAC-SHA256)
PROBE, REPLY, FOLLOWUP, ECHO, HOP = 1, 2, 3, 4, 5
SECOND = 0x1  # PROBE flag: second packet of a coded pair
TRACE = 0x2  # PROBE flag: a traceroute probe: answered without stamps (REPLY, or ECHO if aux > 0)

HEADER = struct.Struct("!2sBBHBBQQIq")
ENTRY = struct.Struct("!Iq")
MAC_LEN = 16
MIN_LEN = HEADER.size + MAC_LEN
MAX_FOLLOWUPS = 16


class Message(NamedTuple):
    type: int
    flags: int
    aux: int
    session: int
    rsession: int
    seq: int
    ta: int
    entries: tuple[tuple[int, int], ...]  # FOLLOWUP only


class BadPacket(Exception):
    """kind: 'foreign' (not our format), 'version' (our format, other version), 'forged' (bad MAC)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


@functools.lru_cache(maxsize=16)
def _mac_key(key: bytes) -> bytes:
    """BLAKE2b takes keys of up to 64 bytes: a longer probe key is hashed down (alike on every agent)."""
    return key if len(key) <= 64 else hashlib.blake2b(key, person=b"nms-probe-key").digest()


def mac(key: bytes, body: bytes) -> bytes:
    return hashlib.blake2b(body, key=_mac_key(key), digest_size=MAC_LEN).digest()


def encode(key: bytes, type_: int, session: int, seq: int, *, flags: int = 0, aux: int = 0, rsession: int = 0,
           ta: int = 0, entries: tuple[tuple[int, int], ...] | list = ()) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, type_, flags, aux, len(entries), session, rsession, seq, ta)
    if entries:
        body += b"".join(ENTRY.pack(s, t) for s, t in entries)
    return body + mac(key, body)


def decode(key: bytes, data: bytes) -> Message:
    """Check and parse a packet; raises BadPacket."""
    if len(data) < MIN_LEN or data[:2] != MAGIC:
        raise BadPacket("foreign")
    body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
    if not hmac.compare_digest(mac(key, body), tag):
        # checked before the version so that nobody without the key learns anything from replies
        raise BadPacket("forged")
    _, version, type_, flags, aux, count, session, rsession, seq, ta = HEADER.unpack_from(body)
    if version != VERSION:
        raise BadPacket("version")
    entries: tuple[tuple[int, int], ...] = ()
    if count:
        if len(body) != HEADER.size + count * ENTRY.size or count > MAX_FOLLOWUPS:
            raise BadPacket("foreign")
        entries = tuple(ENTRY.unpack_from(body, HEADER.size + i * ENTRY.size) for i in range(count))
    elif len(body) != HEADER.size:
        raise BadPacket("foreign")
    return Message(type_, flags, aux, session, rsession, seq, ta, entries)


def peek(data: bytes) -> tuple[int, int, int, int] | None:
    """(type, aux, session, seq) of a packet of ours quoted back in an ICMP error, unchecked: the
    MAC is usually cut off (Linux routers quote up to 576 bytes, many switches only 8), and the
    kernel already matched the error to our socket. None when too little was quoted."""
    if len(data) < HEADER.size or data[:2] != MAGIC:
        return None
    _, _, type_, _, aux, _, session, _, seq, _ = HEADER.unpack_from(data)
    return type_, aux, session, seq
