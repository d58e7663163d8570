"""The wire decoder on datagrams built here from the documented format (not by the plugin): bad
headers refuse the batch, bad records are named and the good ones kept."""

from __future__ import annotations

import struct

import pytest

from nccl_plugin.decode import COMMON, HEADER, WireError, decode_batch, to_records


def header(count: int, job: bytes = b"job-1", **kw) -> bytes:
    values = dict(magic=b"NMSN", version=1, header_size=128, record_size=128, count=count, pid=4242, seq=9,
                  d_ring=1, d_slots=2, d_send=3, sent=10**18, job=job, abi=6)
    values.update(kw)
    return HEADER.pack(*values.values(), 0)


def coll(event_id: int, start: int = 1000, stop: int = 2000, kind: int = 1, datatype: bytes = b"ncclBfloat16") -> bytes:
    common = COMMON.pack(kind, 0, 0, 3, 0xABCDEF, event_id, 0, start, stop)
    body = struct.pack("<QQiBB2x16s16s16s8s", 5, 1000, 0, 4, 16, b"AllGather", datatype, b"NVLS", b"LL128")
    return common + body


def step(event_id: int) -> bytes:
    common = COMMON.pack(4, 1, 0, 0, 1, event_id, 77, 100, 900)
    body = struct.pack("<iiBBBBIQiiQ6I", 2, 5, 3, 0, 1, 0, 2, 65536, 0x1234, 0, 131072, 10, 0, 30, 0, 0, 0)
    return common + body + bytes(80 - 64)


def test_a_good_batch():
    batch = decode_batch(header(2) + coll(1) + step(2))
    assert (batch.pid, batch.batch_seq, batch.job_id, batch.abi_version, batch.dropped) == (4242, 9, "job-1", 6, 6)
    records, errors = to_records(batch, "gpu7")
    assert errors == []
    (kind_a, a), (kind_b, b) = records
    assert kind_a == "nccl_collectives" and kind_b == "nccl_proxy_steps"
    assert (a.host, a.job_id, a.comm_id, a.rank, a.op, a.count, a.bytes, a.algo, a.proto, a.channels, a.seq) == (
        "gpu7", "job-1", "0000000000abcdef", "3", "AllGather", 1000, 2000, "NVLS", "LL128", 4, 5)
    assert (b.parent_id, b.peer, b.channel, b.is_send, b.net, b.connection, b.net_device, b.trans_size) == (
        77, 5, 3, False, "ib", 0x1234, 0, 65536)
    assert (b.send_gpu_wait_ns, b.send_peer_wait_ns, b.send_wait_ns, b.recv_wait_ns) == (10, None, 30, None)
    point = a.to_point()
    assert point.measurement == "nccl_collective" and point.ts == 1000 and point.fields["stop_ns"] == 2000
    assert point.tags == {"host": "gpu7", "job_id": "job-1", "comm_id": "0000000000abcdef", "rank": "3"}


@pytest.mark.parametrize("data, why", [
    (b"", "shorter than the 128-byte header"),
    (header(0, magic=b"XXXX"), "not an NMS NCCL plugin batch"),
    (header(0, version=0), "wire version 0 is not supported"),
    (header(2) + coll(1), "truncated or padded"),
    (header(0, record_size=64), "smaller than version 1's"),
])
def test_bad_headers_refuse_the_batch(data, why):
    with pytest.raises(WireError, match=why):
        decode_batch(data)


def test_bad_records_are_named_and_the_others_kept():
    data = header(4) + coll(1) + coll(2, kind=9) + coll(3, start=5, stop=4) + coll(4, datatype=b"ncclMystery")
    batch = decode_batch(data)
    assert batch.errors == ["record 1: unknown record kind 9", "record 2: stop_ns 4 is before start_ns 5"]
    records, errors = to_records(batch, "gpu7")
    assert [r.event_id for _, r in records] == [1, 4] and records[1][1].bytes is None  # unknown size: no bytes
    assert errors == batch.errors


def test_a_record_the_model_refuses_is_reported_with_its_field():
    batch = decode_batch(header(2, job=b"bad\\job") + coll(1) + coll(2))  # a backslash is not a valid job id
    records, errors = to_records(batch, "gpu7")
    assert records == [] and len(errors) == 2 and "job_id" in errors[0] and "event 1" in errors[0]


def test_a_newer_version_with_longer_records_is_read_as_far_as_known():
    extended = header(1, version=2, record_size=160) + coll(1) + bytes(32)
    batch = decode_batch(extended)
    assert [e["event_id"] for e in batch.events] == [1] and batch.errors == []
