"""Probe path -> directed links, NICs and switches it crosses, and the path x element matrices.

A ProbePath lists the routers each way by the address each answered from: the address of its
ingress port (the lab's switches, and most routers, answer from the interface the probe came in
on). InterfaceAddress turns an address into (device, port), and the cable on that port is the link
the probe arrived by, even when the previous hop was silent ('*'). When the address is not on a
cable joining the previous device, the cable between the two devices is used if it is the only
one; parallel cables with no port to pick one are skipped: neither blamed nor cleared.

The access links (NIC <-> its switch port, from the inventory) are always known, so a path without
a ProbePath, or with unknown addresses, still maps to its two NICs' links and leaves.
Device sequence forward: [src NIC's switch, fwd hops..., dst]; reverse: [dst NIC's switch, rev hops
(peer side first)..., src].
"""

from __future__ import annotations

from itertools import chain

import numpy as np
from scipy import sparse

from correlator.context import Context
from correlator.fabric import End, FabricIndex, Nic


def route(index: FabricIndex, addresses: dict[str, End], src: Nic, dst: Nic, hops: str | None,
           devices: set[int]) -> list[int]:
    """Directed link ids from NIC `src` to NIC `dst` through `hops` (None: unknown). Also places the
    NCCL QPs' traced paths (correlator/qp_paths.py)."""
    out: list[int] = []
    up = index.nic_access.get(src)
    if up is not None:
        out.append(index.into(up, index.other(up, src)))
    prev = index.nic_switch.get(src)
    for hop in hops.split(",") if hops else ():
        end = addresses.get(hop)
        if end is None:
            prev = None
            continue
        dev = end[0]
        if (d := index.device_id.get(dev)) is not None:
            devices.add(d)
        lid = index.by_end.get(end)
        if lid is not None and (prev is None or index.other(lid, end)[0] == prev):
            out.append(index.into(lid, end))
        elif prev is not None:
            cands = index.between.get(tuple(sorted((prev, dev))), [])
            if len(cands) == 1 and prev != dev:
                a, b = index.links[cands[0]]
                out.append(index.into(cands[0], a if a[0] == dev else b))
        prev = dev
    down = index.nic_access.get(dst)
    if down is not None:
        out.append(index.into(down, dst))
    return list(dict.fromkeys(out))  # the first hop's ingress is the access link again


def _csr(rows: list[tuple[int, ...]], ncols: int) -> sparse.csr_matrix:
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices = np.fromiter(chain.from_iterable(rows), np.int64, int(indptr[-1]))
    data = np.ones(len(indices), np.float64)
    return sparse.csr_matrix((data, indices, indptr), shape=(len(rows), ncols))


class Geometry:
    """Per-path directed links (fwd, rev) and elements; matrices rebuilt when anything changed."""

    def __init__(self):
        self.fwd: list[tuple[int, ...]] = []
        self.rev: list[tuple[int, ...]] = []
        self.elems: list[tuple[int, ...]] = []  # links, then L + nic, then L + N + device
        self._seen = (-1, -1)
        self.U: sparse.csr_matrix | None = None  # paths x directed links (fwd or rev)
        self.E: sparse.csr_matrix | None = None  # paths x elements
        self.L = self.N = self.D = 0

    def update(self, ctx: Context, index: FabricIndex) -> None:
        P, n = len(self.fwd), ctx.P
        version = (index.version, ctx.addr_version)
        if version != self._seen:
            todo = range(n)
            self.fwd, self.rev, self.elems = [()] * n, [()] * n, [()] * n
        else:
            self.fwd += [()] * (n - P)
            self.rev += [()] * (n - P)
            self.elems += [()] * (n - P)
            todo = sorted(set(range(P, n)) | {i for i in ctx.dirty_paths if i < n})
        ctx.dirty_paths.clear()
        if not todo and self.U is not None:
            return
        self._seen = version
        for i in todo:
            self._resolve(i, ctx, index)
        self.L, self.N, self.D = len(index.links), len(index.nics), len(index.devices)
        both = [tuple(set(f) | set(r)) for f, r in zip(self.fwd, self.rev)]
        self.U = _csr(both, 2 * self.L)
        self.E = _csr(self.elems, self.L + self.N + self.D)
        self.UT = self.U.T.tocsr()
        self.ET = self.E.T.tocsr()

    def _resolve(self, i: int, ctx: Context, index: FabricIndex) -> None:
        sh, sn, dh, dn, _ = ctx.keys[i]
        src, dst = (sh, sn), (dh, dn)
        pp = ctx.probe_paths.get(i)
        devices: set[int] = set()
        for nic in (src, dst):
            if (s := index.nic_switch.get(nic)) is not None and s in index.device_id:
                devices.add(index.device_id[s])
        fwd = route(index, ctx.addresses, src, dst, pp[1] if pp else None, devices)
        rev = route(index, ctx.addresses, dst, src, pp[2] if pp else None, devices)
        L, N = len(index.links), len(index.nics)
        links = {d >> 1 for d in chain(fwd, rev)}
        nics = {L + index.nic_id[n] for n in (src, dst) if n in index.nic_id}
        self.fwd[i], self.rev[i] = tuple(fwd), tuple(rev)
        self.elems[i] = tuple(sorted(links | nics | {L + N + d for d in devices}))
