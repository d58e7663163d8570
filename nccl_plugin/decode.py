"""The plugin's wire format (v1) -> records of nms.records.

One Unix datagram per batch: a 128-byte header, then `record_count` records of 128 bytes each,
every integer little-endian, strings NUL-padded (nccl_plugin/src/wire.h is the writer):

    header  magic "NMSN", version u16 (1), header_size u16 (128), record_size u16 (128),
            record_count u16, pid u32, batch_seq u64, dropped_ring u64, dropped_slots u64,
            dropped_send u64 (the three cumulative per process), sent_ns u64, job_id char[64],
            abi_version u32, reserved u32
    record  kind u8 (1 coll, 2 p2p, 3 proxy op, 4 proxy step, 5 comm), flags u8 (bit 0: parent
            known), reserved u16, rank i32, comm_id u64, event_id u64, parent_id u64, start_ns u64,
            stop_ns u64, then 80 bytes that depend on the kind (the structs below)

A header that is wrong refuses the whole batch (WireError); a record that is wrong is reported by
index and the others are kept. A newer version with a larger header or records is read as far as
this version knows (the sizes in the header say where things are).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from nms.records import NcclCollective, NcclComm, NcclProxyOp, NcclProxyStep

MAGIC = b"NMSN"
VERSION = 1
HEADER = struct.Struct("<4sHHHHIQQQQQ64sII")
COMMON = struct.Struct("<BBHiQQQQQ")
COLL = struct.Struct("<QQiBB2x16s16s16s8s")
PROXY_OP = struct.Struct("<iiiiBBHIQ")
PROXY_STEP = struct.Struct("<iiBBBBIQiiQ6I")
COMM = struct.Struct("<ii64s")
RECORD_SIZE = 128
assert HEADER.size == 128 and COMMON.size + COLL.size == RECORD_SIZE

KIND_NAMES = {1: "coll", 2: "p2p", 3: "proxy_op", 4: "proxy_step", 5: "comm"}
# POST /ingest/<kind> for each record kind
INGEST_KIND = {"coll": "nccl_collectives", "p2p": "nccl_collectives", "proxy_op": "nccl_proxy_ops",
               "proxy_step": "nccl_proxy_steps", "comm": "nccl_comms"}
STEP_STATES = ("send_gpu_wait_ns", "send_peer_wait_ns", "send_wait_ns", "recv_wait_ns", "recv_flush_wait_ns",
               "recv_gpu_wait_ns")
NETS = {0: None, 1: "ib", 2: "socket"}
DATATYPE_BYTES = {"ncclInt8": 1, "ncclUint8": 1, "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1, "ncclFloat16": 2,
                  "ncclBfloat16": 2, "ncclInt32": 4, "ncclUint32": 4, "ncclFloat32": 4, "ncclInt64": 8,
                  "ncclUint64": 8, "ncclFloat64": 8}


class WireError(ValueError):
    """The datagram is not a batch this decoder can read."""


@dataclass
class Batch:
    pid: int
    batch_seq: int
    dropped_ring: int
    dropped_slots: int
    dropped_send: int
    sent_ns: int
    job_id: str | None
    abi_version: int
    events: list[dict[str, Any]] = field(default_factory=list)  # decoded records, wire names
    errors: list[str] = field(default_factory=list)  # "record N: why"

    @property
    def dropped(self) -> int:
        return self.dropped_ring + self.dropped_slots + self.dropped_send


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def decode_batch(data: bytes) -> Batch:
    if len(data) < HEADER.size:
        raise WireError(f"{len(data)} bytes: shorter than the {HEADER.size}-byte header")
    (magic, version, header_size, record_size, count, pid, seq, d_ring, d_slots, d_send, sent_ns, job, abi,
     _) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"magic {magic!r} is not {MAGIC!r}: not an NMS NCCL plugin batch")
    if version < VERSION:
        raise WireError(f"wire version {version} is not supported (this decoder reads {VERSION})")
    if header_size < HEADER.size or record_size < RECORD_SIZE:
        raise WireError(f"header {header_size} / record {record_size} bytes: smaller than version 1's")
    if len(data) != header_size + count * record_size:
        raise WireError(f"{len(data)} bytes for {count} records of {record_size} bytes after a {header_size}-byte "
                        "header: truncated or padded")
    batch = Batch(pid, seq, d_ring, d_slots, d_send, sent_ns, _text(job) or None, abi)
    for index in range(count):
        offset = header_size + index * record_size
        try:
            batch.events.append(_decode_record(data, offset))
        except ValueError as e:
            batch.errors.append(f"record {index}: {e}")
    return batch


def _decode_record(data: bytes, offset: int) -> dict[str, Any]:
    kind_code, flags, _, rank, comm_id, event_id, parent_id, start_ns, stop_ns = COMMON.unpack_from(data, offset)
    kind = KIND_NAMES.get(kind_code)
    if kind is None:
        raise ValueError(f"unknown record kind {kind_code}")
    if stop_ns < start_ns:
        raise ValueError(f"stop_ns {stop_ns} is before start_ns {start_ns}")
    out: dict[str, Any] = {"kind": kind, "rank": rank, "comm_id": f"{comm_id:016x}", "event_id": event_id,
                           "start_ns": start_ns, "stop_ns": stop_ns}
    if flags & 1 and kind in ("proxy_op", "proxy_step"):
        out["parent_id"] = parent_id
    body = offset + COMMON.size
    if kind in ("coll", "p2p"):
        seq, count, root_or_peer, nchannels, nwarps, func, datatype, algo, proto = COLL.unpack_from(data, body)
        datatype = _text(datatype)
        size = DATATYPE_BYTES.get(datatype)
        out.update(op=_text(func), count=count, datatype=datatype, bytes=None if size is None else count * size)
        if kind == "coll":
            out.update(seq=seq, root=root_or_peer, algo=_text(algo) or None, proto=_text(proto) or None,
                       channels=nchannels, warps=nwarps)
        else:
            out.update(peer=root_or_peer, channels=nchannels or None)
    elif kind == "proxy_op":
        peer, n_steps, chunk, pid, channel, is_send, _, steps, trans = PROXY_OP.unpack_from(data, body)
        out.update(peer=peer, n_steps=n_steps, chunk_size=chunk, channel=channel, is_send=bool(is_send), steps=steps,
                   trans_bytes=trans)
    elif kind == "proxy_step":
        (step, peer, channel, is_send, net, _, net_events, trans_size, connection, device, net_bytes,
         *states) = PROXY_STEP.unpack_from(data, body)
        if net not in NETS:
            raise ValueError(f"unknown network type {net}")
        out.update(step=step, trans_size=trans_size, net=NETS[net], net_events=net_events, net_bytes=net_bytes)
        if flags & 1:
            out.update(peer=peer, channel=channel, is_send=bool(is_send))
        if net:
            out.update(connection=connection, net_device=device if net == 1 else None)
        out.update({name: ns for name, ns in zip(STEP_STATES, states) if ns})
    else:
        nranks, nnodes, name = COMM.unpack_from(data, body)
        out.update(nranks=nranks, nnodes=nnodes, comm_name=_text(name) or None)
    return out


MODELS = {"coll": NcclCollective, "p2p": NcclCollective, "proxy_op": NcclProxyOp, "proxy_step": NcclProxyStep,
          "comm": NcclComm}


def to_records(batch: Batch, host: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """(ingest kind, record) for every good event of the batch, and why each bad one was dropped."""
    good: list[tuple[str, Any]] = []
    errors = list(batch.errors)
    for _index, event in enumerate(batch.events):
        kind = event["kind"]
        data = {k: v for k, v in event.items() if v is not None}
        data.update(host=host, pid=batch.pid, rank=str(event["rank"]))
        if batch.job_id is not None:
            data["job_id"] = batch.job_id
        if kind == "comm":
            data.pop("kind")
            data["abi_version"] = batch.abi_version
        elif kind not in ("coll", "p2p"):
            data.pop("kind")
        try:
            good.append((INGEST_KIND[kind], MODELS[kind].model_validate(data)))
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            errors.append(f"{kind} event {event['event_id']}: {problems}")
    return good, errors
