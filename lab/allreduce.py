"""A synthetic ring all-reduce between lab hosts, instrumented through NCCL's profiler ABI.

One process per rank (run inside its host's namespace: `ip netns exec <ns> python -m
lab.allreduce ...`). Ranks form a ring over TCP: rank r sends to r+1 from a fixed source port
(so the lab can predict which spine its flow hashes onto) and receives from r-1. Each all-reduce
of a float32 buffer is NCCL's ring algorithm: n-1 reduce-scatter steps then n-1 all-gather steps,
each sending one 1/n chunk while receiving another; the data is really summed and checked.

The real plugin (`nccl_plugin.library_path()`) is loaded with ctypes and driven as NCCL 2.27 drives
`ncclProfiler_v4`: init with the communicator's hash and rank, then per all-reduce a Group event,
the Coll event (stopped right away: NCCL's stop means enqueued), one send and one recv ProxyOp
(parent: the collective) and, per ring step, a ProxyStep under each with its wait states and a
socket NetPlugin event carrying the TCP socket's fd. Only the events of the mask the plugin asks for
are raised. The plugin ships to the agent's socket (NMS_NCCL_SOCKET); the job id comes from the
environment as with any launcher (SLURM_JOB_ID here).
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import os
import signal
import socket
import threading
import time

import numpy as np

from nccl_plugin import library_path

# --- the v4 ABI (nccl_plugin/src/nccl_abi.h, from NVIDIA's profiler_v4.h) -------------------------
GROUP, COLL, PROXY_OP, PROXY_STEP, NET_PLUGIN = 1 << 0, 1 << 1, 1 << 3, 1 << 4, 1 << 7
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_GPU_WAIT, SEND_PEER_WAIT, NET_UPDATE = 8, 9, 10, 12, 20, 21
NET_TYPE_SOCK = 2 << 16


class _Coll(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p), ("recvBuff", C.c_void_p),
                ("count", C.c_size_t), ("root", C.c_int), ("datatype", C.c_char_p), ("nChannels", C.c_uint8),
                ("nWarps", C.c_uint8), ("algo", C.c_char_p), ("proto", C.c_char_p)]


class _ProxyOp(C.Structure):
    _fields_ = [("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int), ("nSteps", C.c_int),
                ("chunkSize", C.c_int), ("isSend", C.c_int)]


class _NetPlugin(C.Structure):
    _fields_ = [("id", C.c_int64), ("data", C.c_void_p)]


class _Union(C.Union):
    _fields_ = [("coll", _Coll), ("proxyOp", _ProxyOp), ("step", C.c_int), ("netPlugin", _NetPlugin)]


class Descr(C.Structure):
    _fields_ = [("type", C.c_uint8), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", _Union)]


class _Sock(C.Structure):
    _fields_ = [("fd", C.c_int), ("op", C.c_int), ("length", C.c_size_t)]


class SockDescr(C.Structure):  # ncclProfilerNetSockDescr_v1_t
    _fields_ = [("type", C.c_uint8), ("sock", _Sock)]


class StateArgs(C.Structure):  # ncclProfilerEventStateArgs_v4_t (its largest member is 8 bytes)
    _fields_ = [("transSize", C.c_size_t)]


_INIT = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_int), C.c_char_p, C.c_uint64, C.c_int, C.c_int,
                    C.c_int, C.c_void_p)
_START = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(Descr))
_STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)
_STATE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgs))
_FINALIZE = C.CFUNCTYPE(C.c_int, C.c_void_p)


class ProfilerV4(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", _INIT), ("startEvent", _START), ("stopEvent", _STOP),
                ("recordEventState", _STATE), ("finalize", _FINALIZE)]


class Profiler:
    """The plugin as NCCL sees it: one context per communicator."""

    def __init__(self, comm_hash: int, nranks: int, rank: int, nnodes: int, path: str | None = None):
        self.lib = C.CDLL(path or str(library_path()))
        self.p = ProfilerV4.in_dll(self.lib, "ncclProfiler_v4")
        self.ctx, mask = C.c_void_p(), C.c_int(0)
        rc = self.p.init(C.byref(self.ctx), C.byref(mask), b"allreduce", comm_hash, nnodes, nranks, rank, None)
        if rc != 0:
            raise RuntimeError(f"profiler init failed ({rc})")
        self.mask, self.rank = mask.value, rank

    def start(self, kind: int, parent, fill=None):
        if not self.mask & kind:
            return None
        d = Descr(type=kind, parentObj=parent, rank=self.rank)
        if fill:
            fill(d.u)
        handle = C.c_void_p()
        self.p.startEvent(self.ctx, C.byref(handle), C.byref(d))
        return handle.value

    def stop(self, handle) -> None:
        if handle:
            self.p.stopEvent(handle)

    def state(self, handle, state: int, trans: int = 0) -> None:
        if handle:
            self.p.recordEventState(handle, state, C.byref(StateArgs(trans)))

    def finalize(self) -> None:
        self.p.finalize(self.ctx)


def _fill_coll(seq: int, count: int):
    def fill(u):
        u.coll = _Coll(seqNumber=seq, func=b"AllReduce", count=count, root=0, datatype=b"ncclFloat32", nChannels=1,
                       nWarps=8, algo=b"RING", proto=b"SIMPLE")
    return fill


def _fill_op(peer: int, steps: int, chunk: int, send: bool):
    def fill(u):
        u.proxyOp = _ProxyOp(pid=os.getpid(), channelId=0, peer=peer, nSteps=steps, chunkSize=chunk, isSend=int(send))
    return fill


class Ring:
    def __init__(self, rank: int, addrs: list[str], port: int, sport: int):
        self.rank, self.n = rank, len(addrs)
        self.next, self.prev = (rank + 1) % self.n, (rank - 1) % self.n
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addrs[rank], port))
        listener.listen(1)
        self.tx = socket.socket()
        self.tx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tx.bind((addrs[rank], sport))
        deadline = time.monotonic() + 60
        while True:
            try:
                self.tx.connect((addrs[self.next], port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.rx, _ = listener.accept()
        listener.close()
        for s in (self.tx, self.rx):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def exchange(self, out: memoryview, into: memoryview) -> None:
        failed: list[OSError] = []

        def send():
            try:
                self.tx.sendall(out)
            except OSError as e:
                failed.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        got = 0
        while got < len(into):
            k = self.rx.recv_into(into[got:])
            if k == 0:
                raise ConnectionError("ring peer closed")
            got += k
        sender.join()
        if failed:
            raise failed[0]


def allreduce(ring: Ring, prof: Profiler, buf: np.ndarray, seq: int, rate_bps: float = 0.0) -> int:
    """One ring all-reduce of buf (in place), profiled; returns its duration in ns. `rate_bps` paces
    each step's send (0: as fast as TCP goes), so that the job alone does not congest the lab."""
    n, r = ring.n, ring.rank
    chunks = np.array_split(buf, n)
    t0 = time.perf_counter_ns()
    group = prof.start(GROUP, None)
    coll = prof.start(COLL, group, _fill_coll(seq, buf.size))
    prof.stop(coll)  # enqueued: the network does the rest
    prof.stop(group)
    steps = 2 * (n - 1)
    chunk_bytes = chunks[0].nbytes
    send_op = prof.start(PROXY_OP, coll, _fill_op(ring.next, steps, chunk_bytes, True))
    recv_op = prof.start(PROXY_OP, coll, _fill_op(ring.prev, steps, chunk_bytes, False))
    scratch = np.empty_like(chunks[0])
    for step in range(steps):
        if step < n - 1:  # reduce-scatter: afterwards rank r holds the sum of chunk r+1
            out_i, in_i = (r - step) % n, (r - step - 1) % n
        else:  # all-gather: pass the summed chunks on
            s = step - (n - 1)
            out_i, in_i = (r - s + 1) % n, (r - s) % n
        s_step = prof.start(PROXY_STEP, send_op, lambda u, step=step: setattr(u, "step", step))
        r_step = prof.start(PROXY_STEP, recv_op, lambda u, step=step: setattr(u, "step", step))
        prof.state(s_step, SEND_GPU_WAIT)
        prof.state(s_step, SEND_PEER_WAIT)
        prof.state(r_step, RECV_WAIT)
        for handle, sock, length in ((s_step, ring.tx, chunks[out_i].nbytes), (r_step, ring.rx, chunks[in_i].nbytes)):
            sd = SockDescr(type=1, sock=_Sock(fd=sock.fileno(), op=0, length=length))
            net = prof.start(NET_PLUGIN, handle, lambda u, sd=sd: setattr(u, "netPlugin",
                                                                          _NetPlugin(NET_TYPE_SOCK | 1,
                                                                                     C.addressof(sd))))
            prof.state(net, NET_UPDATE)
            prof.stop(net)
        into = scratch[:chunks[in_i].size]
        step_started = time.perf_counter()
        ring.exchange(memoryview(chunks[out_i]).cast("B"), memoryview(into).cast("B"))
        if step < n - 1:
            chunks[in_i] += into  # reduce-scatter: accumulate
        else:
            chunks[in_i][:] = into  # all-gather: take the reduced chunk
        if rate_bps:
            time.sleep(max(0.0, chunks[out_i].nbytes * 8 / rate_bps - (time.perf_counter() - step_started)))
        prof.state(s_step, SEND_WAIT, chunks[out_i].nbytes)
        prof.state(r_step, RECV_GPU_WAIT, chunks[in_i].nbytes)
        prof.stop(s_step)
        prof.stop(r_step)
    prof.stop(send_op)
    prof.stop(recv_op)
    return time.perf_counter_ns() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--addrs", required=True, help="every rank's address, comma-separated, in rank order")
    ap.add_argument("--port", type=int, default=47000)
    ap.add_argument("--sport", type=int, required=True, help="source port of this rank's connection to the next")
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--comm", type=lambda s: int(s, 0), default=0x5EED0001)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--rate-mbps", type=float, default=0.0, help="pace each rank's sending (0: unpaced)")
    args = ap.parse_args(argv)
    addrs = args.addrs.split(",")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    prof = Profiler(args.comm, len(addrs), args.rank, len(addrs))
    ring = Ring(args.rank, addrs, args.port, args.sport)
    n = len(addrs)
    values = np.full(args.bytes // 4, float(args.rank + 1), np.float32)
    expected = n * (n + 1) / 2
    seq, bad, durations = 0, 0, []
    deadline = time.monotonic() + args.seconds
    try:
        while not stopping.is_set() and time.monotonic() < deadline:
            buf = values.copy()
            durations.append(allreduce(ring, prof, buf, seq, args.rate_mbps * 1e6))
            bad += int(not np.all(buf == expected))
            seq += 1
    except OSError:  # a peer stopped first (ConnectionError included): the ring is over
        pass
    ring.tx.close()
    prof.finalize()
    print(json.dumps({"rank": args.rank, "collectives": seq, "wrong": bad,
                      "median_ms": float(np.median(durations)) / 1e6 if durations else None}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
