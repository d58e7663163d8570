"""Link state changes from the kernel: an rtnetlink socket subscribed to RTMGRP_LINK.

RTM_NEWLINK/RTM_DELLINK messages carry an ifinfomsg and attributes; IFLA_IFNAME and
IFLA_OPERSTATE (RFC 2863 states) are all we need. The kernel also sends RTM_NEWLINK for changes
other than the state (statistics, flags), so callers compare with the last state they saw.
"""

from __future__ import annotations

import socket
import struct

RTMGRP_LINK = 1
RTM_NEWLINK, RTM_DELLINK = 16, 17
IFLA_IFNAME, IFLA_OPERSTATE = 3, 16
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
RTATTR = struct.Struct("=HH")
# IF_OPER_* -> the OperStatus names of nms.records
OPERSTATE = {0: "unknown", 1: "notPresent", 2: "down", 3: "lowerLayerDown", 4: "testing", 5: "dormant", 6: "up"}


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse(data: bytes) -> list[tuple[str, str]]:
    """(interface name, oper status) for each link message in a netlink datagram."""
    out = []
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length, type_, _flags, _seq, _pid = NLMSG_HDR.unpack_from(data, offset)
        if length < NLMSG_HDR.size or offset + length > len(data):
            break
        if type_ in (RTM_NEWLINK, RTM_DELLINK):
            name, oper = None, "unknown"
            pos = offset + NLMSG_HDR.size + IFINFO.size
            end = offset + length
            while pos + RTATTR.size <= end:
                alen, atype = RTATTR.unpack_from(data, pos)
                if alen < RTATTR.size:
                    break
                payload = data[pos + RTATTR.size:pos + alen]
                if atype == IFLA_IFNAME:
                    name = payload.split(b"\0", 1)[0].decode(errors="replace")
                elif atype == IFLA_OPERSTATE and payload:
                    oper = OPERSTATE.get(payload[0], "unknown")
                pos += _align(alen)
            if name is not None:
                out.append((name, "notPresent" if type_ == RTM_DELLINK else oper))
        offset += _align(length)
    return out


class LinkMonitor:
    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.NETLINK_ROUTE)
        self.sock.bind((0, RTMGRP_LINK))  # port id 0: the kernel picks one

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[tuple[str, str]]:
        out = []
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return out
            except OSError:  # ENOBUFS: we fell behind; the next periodic sample still catches up
                return out
            out += parse(data)

    def close(self) -> None:
        self.sock.close()
