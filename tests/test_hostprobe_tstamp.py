"""Kernel timestamps and the error queue (hostprobe/tstamp.py): cmsg parsing on crafted bytes, and
real stamps on loopback sockets (no root needed)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from hostprobe import tstamp


def _ts_cmsg(sec: int, nsec: int) -> tuple:
    return (socket.SOL_SOCKET, tstamp.SO_TIMESTAMPING, struct.pack("qqqqqq", sec, nsec, 0, 0, 0, 0))


def test_software_stamp_from_cmsg():
    assert tstamp.software_stamp([_ts_cmsg(1_700_000_000, 123_456_789)]) == 1_700_000_000_123_456_789
    assert tstamp.software_stamp([_ts_cmsg(0, 0)]) == 0  # zero-filled: treated as missing
    assert tstamp.software_stamp([]) == 0
    assert tstamp.software_stamp([(socket.IPPROTO_IP, 2, b"\x40\0\0\0")]) == 0


def test_parse_errqueue_timestamp_and_icmp():
    ee_ts = struct.pack("IBBBBII", 42, tstamp.SO_EE_ORIGIN_TIMESTAMPING, 0, 0, 0, 0, 17)
    entry = tstamp.parse_errqueue(b"", [_ts_cmsg(5, 6), (socket.IPPROTO_IP, tstamp.IP_RECVERR, ee_ts)], None)
    assert (entry.origin, entry.key, entry.stamp_ns, entry.offender) == (tstamp.SO_EE_ORIGIN_TIMESTAMPING, 17,
                                                                        5_000_000_006, None)
    ee_icmp = struct.pack("IBBBBII", 113, tstamp.SO_EE_ORIGIN_ICMP, 11, 0, 0, 0, 0)
    offender = struct.pack("=HH4s", socket.AF_INET, 0, socket.inet_aton("198.19.1.128")) + b"\0" * 8
    entry = tstamp.parse_errqueue(b"quoted", [(socket.IPPROTO_IP, tstamp.IP_RECVERR, ee_icmp + offender)],
                                  ("198.19.2.1", 33434))
    assert (entry.icmp_type, entry.offender, entry.dest, entry.data) == (11, "198.19.1.128", ("198.19.2.1", 33434),
                                                                          b"quoted")
    ee_other = struct.pack("IBBBBII", 1, 1, 0, 0, 0, 0, 0)  # SO_EE_ORIGIN_LOCAL: not ours
    assert tstamp.parse_errqueue(b"", [(socket.IPPROTO_IP, tstamp.IP_RECVERR, ee_other)], None) is None


def _drain_stamps(sock: tstamp.StampedSocket, want: int, timeout: float = 2.0) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [e for e in tstamp.read_errqueue(sock.sock) if e.origin == tstamp.SO_EE_ORIGIN_TIMESTAMPING]
        time.sleep(0.005)
    return got


def _warm_rx_stamping(rx: tstamp.StampedSocket, timeout: float = 2.0) -> None:
    """The kernel switches RX stamping on for everyone the first time a socket asks, through deferred
    work: on a fresh machine the first datagrams may arrive unstamped. Send warm-up datagrams from a
    plain socket until one arrives stamped, so the test measures stamping, not its start-up."""
    warm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            warm.sendto(b"warm", ("127.0.0.1", rx.port))
            time.sleep(0.01)
            try:
                _, anc, _, _ = rx.sock.recvmsg(64, tstamp.CMSG_SPACE)
            except BlockingIOError:
                continue
            if tstamp.software_stamp(anc):
                break
        while True:  # leave nothing of the warm-up in the queue
            try:
                rx.sock.recvmsg(64, tstamp.CMSG_SPACE)
            except BlockingIOError:
                return
    finally:
        warm.close()


def test_loopback_rx_and_tx_stamps_matched_by_opt_id():
    rx = tstamp.StampedSocket("127.0.0.1", 0)
    tx = tstamp.StampedSocket("127.0.0.1", 0)
    try:
        _warm_rx_stamping(rx)
        before = time.time_ns()
        assert tx.send(b"a", ("127.0.0.1", rx.port), token="first")
        assert tx.send(b"b", ("127.0.0.1", rx.port))  # no token: no stamp requested, no key used
        assert tx.send(b"c", ("127.0.0.1", rx.port), token="third")
        stamps = _drain_stamps(tx, 2)
        assert sorted(e.key for e in stamps) == [0, 1] and tx.next_key == 2
        by_token = {tx.pending.pop(e.key): e.stamp_ns for e in stamps}
        assert set(by_token) == {"first", "third"}
        assert before <= by_token["first"] <= by_token["third"] <= time.time_ns()
        arrivals = []
        deadline = time.monotonic() + 2
        while len(arrivals) < 3 and time.monotonic() < deadline:
            try:
                data, anc, _, _ = rx.sock.recvmsg(64, tstamp.CMSG_SPACE)
                arrivals.append((data, tstamp.software_stamp(anc)))
            except BlockingIOError:
                time.sleep(0.005)
        assert [d for d, _ in arrivals] == [b"a", b"b", b"c"]
        # the first packets after RX stamping is switched on (kernel-wide, on first use) may carry no
        # stamp (0): tolerated, as the agent does; the stamps present are real and in range
        stamped = [t for _, t in arrivals if t]
        assert stamped and arrivals[-1][1], arrivals
        assert all(before <= t <= time.time_ns() for t in stamped)
        assert all(t >= by_token["first"] for t in stamped)  # received after it was sent (one clock)
    finally:
        rx.close()
        tx.close()


def test_icmp_error_lands_on_the_error_queue_and_the_next_send_survives_it():
    tx = tstamp.StampedSocket("127.0.0.1", 0)
    closed = tstamp.StampedSocket("127.0.0.1", 0)
    port = closed.port
    closed.close()  # nobody listens there now
    try:
        assert tx.send(b"x" * 40, ("127.0.0.1", port))
        time.sleep(0.05)  # the ICMP error is back: it left an error on the socket (sk_err)
        assert tx.send(b"x" * 40, ("127.0.0.1", port))  # absorbed by one retry
        deadline, icmp = time.monotonic() + 2, []
        while not icmp and time.monotonic() < deadline:
            icmp = [e for e in tstamp.read_errqueue(tx.sock) if e.origin == tstamp.SO_EE_ORIGIN_ICMP]
            time.sleep(0.005)
        assert icmp and (icmp[0].icmp_type, icmp[0].icmp_code) == (tstamp.ICMP_DEST_UNREACH, 3)
        assert icmp[0].offender == "127.0.0.1" and icmp[0].dest == ("127.0.0.1", port)
        assert icmp[0].data == b"x" * 40  # the quoted payload
    finally:
        tx.close()


def test_bind_conflict_is_reported():
    a = tstamp.StampedSocket("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            tstamp.StampedSocket("127.0.0.1", a.port)
    finally:
        a.close()
