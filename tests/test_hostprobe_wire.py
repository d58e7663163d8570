"""Probe packet format and its keyed MAC (hostprobe/wire.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostprobe import wire

KEY = b"fabric-probe-key-0123456789"


def test_round_trip_of_every_message_type():
    for type_ in (wire.PROBE, wire.REPLY, wire.ECHO, wire.HOP):
        pkt = wire.encode(KEY, type_, 0xDEADBEEF12345678, 42, flags=wire.SECOND, aux=3, rsession=7, ta=-123456789)
        assert len(pkt) == wire.MIN_LEN
        msg = wire.decode(KEY, pkt)
        assert (msg.type, msg.flags, msg.aux, msg.session, msg.rsession, msg.seq, msg.ta, msg.entries) == \
            (type_, wire.SECOND, 3, 0xDEADBEEF12345678, 7, 42, -123456789, ())


def test_followup_carries_several_stamps():
    entries = [(10, 1_700_000_000_000_000_001), (11, 1_700_000_000_000_009_999)]
    msg = wire.decode(KEY, wire.encode(KEY, wire.FOLLOWUP, 5, 10, entries=entries))
    assert msg.entries == tuple(entries)


def test_wrong_key_is_forged():
    pkt = wire.encode(b"someone-elses-key-000000", wire.PROBE, 1, 1)
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(KEY, pkt)
    assert e.value.kind == "forged"


@given(st.integers(min_value=0, max_value=wire.MIN_LEN - 1), st.integers(min_value=0, max_value=7))
def test_any_flipped_bit_is_forged(byte, bit):
    pkt = bytearray(wire.encode(KEY, wire.REPLY, 99, 1234, ta=555))
    pkt[byte] ^= 1 << bit
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(KEY, bytes(pkt))
    # the magic itself flipped: not ours at all; anything else: ours, but not from a key holder
    assert e.value.kind == ("foreign" if byte < 2 else "forged")


def test_foreign_packets():
    for data in (b"", b"NP", b"\x00" * 80, b"GET / HTTP/1.1\r\n\r\n" * 3,
                 wire.encode(KEY, wire.PROBE, 1, 1)[:-1]):
        with pytest.raises(wire.BadPacket) as e:
            wire.decode(KEY, data)
        assert e.value.kind in ("foreign", "forged")
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(KEY, b"\x00" * 80)
    assert e.value.kind == "foreign"


def test_other_version_with_a_valid_mac_is_counted_as_version():
    body = wire.HEADER.pack(wire.MAGIC, wire.VERSION + 1, wire.PROBE, 0, 0, 0, 1, 0, 1, 0)
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(KEY, body + wire.mac(KEY, body))
    assert e.value.kind == "version"


def test_entry_count_must_match_length():
    body = wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.FOLLOWUP, 0, 0, 2, 1, 0, 1, 0) + wire.ENTRY.pack(1, 2)
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(KEY, body + wire.mac(KEY, body))
    assert e.value.kind == "foreign"


def test_peek_reads_a_quoted_packet_without_its_mac():
    pkt = wire.encode(KEY, wire.ECHO, 77, 4242, aux=3)
    assert wire.peek(pkt[:wire.HEADER.size]) == (wire.ECHO, 3, 77, 4242)
    assert wire.peek(pkt[:8]) is None  # a switch that quotes only the UDP header
    assert wire.peek(b"XX" + pkt[2:]) is None


def test_the_mac_is_keyed_blake2b_and_takes_keys_of_any_length():
    import hashlib

    body = wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.PROBE, 0, 0, 0, 1, 0, 1, 0)
    assert wire.mac(KEY, body) == hashlib.blake2b(body, key=KEY, digest_size=16).digest()  # RFC 7693 keyed mode
    long_a, long_b = b"a" * 100, b"a" * 99 + b"b"  # beyond BLAKE2b's 64-byte key: hashed down, still distinct
    pkt = wire.encode(long_a, wire.PROBE, 1, 1)
    assert wire.decode(long_a, pkt).seq == 1
    with pytest.raises(wire.BadPacket) as e:
        wire.decode(long_b, pkt)
    assert e.value.kind == "forged"
