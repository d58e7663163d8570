"""RDMA UD probes through pyverbs: NIC completion timestamps, RoCE v2 ECMP paths by flow label.

Per local NIC with a RoCE v2 device, two UD queue pairs: a responder QP (its number is registered
with the service and handed to peers with the peer list) and a prober QP. Probes and answers are
the UDP transport's packets (wire.py, keyed MAC included) in UD SEND payloads, so prober and
responder logic is shared; only the stamps differ: t1..t4 are the NIC's completion timestamps
(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, raw HCA clock cycles), mapped to CLOCK_REALTIME by
`HcaClock`, a least-squares fit of (cycles, realtime) pairs read about once a second.

ECMP: switches hash RoCE v2 packets on their UDP 5-tuple, whose source port the NIC derives from
the address handle's flow label (libibverbs `ibv_flow_label_to_udp_sport`, which mlx5 applies): a
flow label of `sport & 0x3FFF` gives source port `sport` (0xC000..0xFFFF). Each `VerbsPort` is one
such source port; probes ask, in the PROBE's `ta`, for the reply to use the same flow label, so
both directions of a path keep one 5-tuple. Paths are traced with kernel UDP packets of the very
same 5-tuple (our address:sport -> peer:4791, rising TTL) from a socket bound to that port: routers
answer with time-exceeded as for the UDP transport. The peer's NIC consumes UDP 4791 itself and
never answers, so a forward trace ends after two silent hops (trace.py), and the reverse
direction is not traced.

pyverbs is imported lazily: hosts without rdma-core never load it.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np

from hostprobe import tstamp, wire

log = logging.getLogger(__name__)

ROCE_V2_PORT = 4791  # IANA: RoCE v2 UDP destination port
SPORT_MIN = 0xC000  # IB_ROCE_UDP_ENCAP_VALID_PORT_MIN: RoCE v2 source ports are 0xC000..0xFFFF
QKEY = 0x4E4D5350  # "NMSP": every probe QP uses it (the high bit clear: not a controlled QKey)
GRH_LEN = 40  # UD receives start with the 40-byte GRH (RoCE v2 over IPv4: 20 zero bytes + the IPv4 header)
RECV_SLOTS = 1024
RECV_SLOT = 2048 + GRH_LEN
SEND_SLOTS = 512
SEND_SLOT = 512  # our packets are at most 36 + 16 * 12 + 16 bytes
AH_CACHE = 4096
CALIBRATE_EVERY = 0.25  # seconds between (cycles, realtime) samples: the mapping extrapolates no further
CALIBRATION_SAMPLES = 64  # the fit spans the last 16 s
CALIBRATION_MIN_SPAN_NS = 400_000_000  # the nominal rate until the samples span this long
STARTUP_SAMPLES = 6  # taken 0.1 s apart when the device opens: no stamp is converted before a fitted rate
CALIBRATION_STEP_NS = 100_000  # a sample this far off the fit: the NIC clock or the realtime clock stepped


class VerbsError(Exception):
    pass


def flow_label_for_sport(sport: int) -> int:
    """The flow label whose RoCE v2 UDP source port is `sport` (inverse of ibv_flow_label_to_udp_sport)."""
    if not SPORT_MIN < sport <= 0xFFFF:
        raise ValueError(f"RoCE v2 source ports are {SPORT_MIN + 1}..65535, not {sport}")
    return sport & 0x3FFF


def sport_for_flow_label(fl: int) -> int:
    """libibverbs' ibv_flow_label_to_udp_sport (verbs.h), as mlx5 applies it to UD address handles."""
    low, high = fl & 0x3FFF, fl & 0xFC000
    return (low ^ (high >> 14)) | SPORT_MIN


def mapped_gid(ipv4: str) -> str:
    """The GID of an IPv4 address in pyverbs' 8-word form (::ffff:a.b.c.d)."""
    raw = ipaddress.IPv6Address(f"::ffff:{ipv4}").packed
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def _ipv4_of_grh(grh: bytes) -> str | None:
    """The sender's IPv4 address from a UD receive's GRH: for RoCE v2 over IPv4 the last 20 bytes are
    the IPv4 header; otherwise an IPv6 header whose source GID may be IPv4-mapped."""
    if len(grh) < GRH_LEN:
        return None
    if not any(grh[:20]) and grh[20] >> 4 == 4:
        return ".".join(str(b) for b in grh[32:36])
    sgid = ipaddress.IPv6Address(bytes(grh[8:24]))
    return str(sgid.ipv4_mapped) if sgid.ipv4_mapped else None


def device_names(device_module) -> list[str]:
    """Names of the RDMA devices (pyverbs gives bytes); pyverbs raises when the kernel has none."""
    return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in device_module.get_device_list()]


def load_pyverbs() -> SimpleNamespace:
    """The pyverbs classes and enums this transport uses (enums: pyverbs.enums in rdma-core <= 58,
    pyverbs.libibverbs_enums' IntEnum classes in later ones)."""
    from pyverbs import addr, cq, device, mr, pd, qp, wr
    from pyverbs.pyverbs_error import PyverbsError

    try:
        import pyverbs.enums as enums_module
        enums = {k: getattr(enums_module, k) for k in dir(enums_module) if k.startswith("IBV_")}
    except ImportError:
        import enum

        import pyverbs.libibverbs_enums as enums_module
        enums = {}
        for value in vars(enums_module).values():
            if isinstance(value, type) and issubclass(value, enum.Enum):
                enums.update({m.name: int(m.value) for m in value})
        enums.update({k: v for k, v in vars(enums_module).items() if k.startswith("IBV_") and isinstance(v, int)})
    return SimpleNamespace(device=device, pd=pd, cq=cq, qp=qp, addr=addr, mr=mr, wr=wr, PyverbsError=PyverbsError,
                           E=SimpleNamespace(**enums))


class HcaClock:
    """Maps the NIC's raw completion timestamps (HCA clock cycles) to CLOCK_REALTIME ns.

    Samples pair `query_rt_values_ex` (the raw clock, read by the driver from the device) with the
    realtime clock read just before and after (the tightest of a few tries); a least-squares line
    through the latest samples gives rate and offset, as phc2sys does for a PTP clock. One sample
    uses the nominal rate (`hca_core_clock` kHz). A sample far off the line means a clock stepped:
    the history restarts. (Not phc2sys's servo: the agent needs the mapping, not a disciplined clock.)"""

    def __init__(self, ctx, pv: SimpleNamespace):
        self.ctx, self.pv = ctx, pv
        attr = ctx.query_device_ex()
        khz = attr.hca_core_clock
        if not khz:
            raise VerbsError("the device reports no HCA core clock: completion timestamps cannot be converted")
        self.nominal = 1e6 / khz  # ns per cycle
        self.mask = attr.completion_timestamp_mask or (1 << 64) - 1
        self.samples: deque[tuple[int, int]] = deque(maxlen=CALIBRATION_SAMPLES)
        self.ref_cycles = self.ref_ns = 0
        self.rate = self.nominal
        self.next_at = 0.0
        self.steps = 0
        for i in range(STARTUP_SAMPLES):
            if i:
                time.sleep(0.1)
            self.calibrate()

    def _read(self) -> tuple[int, int, int]:
        """(cycles, realtime ns at the middle of the read, read width ns), the tightest of 3."""
        best = None
        for _ in range(3):
            t0 = time.time_ns()
            sec, nsec = self.ctx.query_rt_values_ex()
            t1 = time.time_ns()
            if best is None or t1 - t0 < best[2]:
                best = (sec * 1_000_000_000 + nsec, (t0 + t1) // 2, t1 - t0)
        return best

    def _delta(self, cycles: int) -> int:
        d = (cycles - self.ref_cycles) & self.mask
        return d - self.mask - 1 if d > self.mask >> 1 else d

    def calibrate(self) -> None:
        cycles, real, _width = self._read()
        self.next_at = time.monotonic() + CALIBRATE_EVERY
        if self.samples and abs(self.to_ns(cycles) - real) > CALIBRATION_STEP_NS:
            self.steps += 1
            log.warning("RDMA NIC clock off its fit by %.3f ms: a clock stepped, calibration restarts",
                        (self.to_ns(cycles) - real) / 1e6)
            self.samples.clear()
        self.samples.append((cycles, real))
        self.ref_cycles, ref_real = cycles, real
        if real - self.samples[0][1] >= CALIBRATION_MIN_SPAN_NS:  # a shorter span gives a noise-dominated rate
            # relative to the newest sample, so the line's intercept is its value at ref_cycles
            rate, at_ref = np.polyfit([self._delta(c) for c, _ in self.samples],
                                      [r - ref_real for _, r in self.samples], 1)
            self.rate, self.ref_ns = float(rate), ref_real + int(at_ref)
        else:
            self.rate, self.ref_ns = self.nominal, real

    def tick(self, now_mono: float) -> None:
        if now_mono >= self.next_at:
            self.calibrate()

    def to_ns(self, cycles: int) -> int:
        return self.ref_ns + int(self._delta(cycles) * self.rate)


class VerbsDevice:
    """The RDMA device, port and GID index that carry one NIC's IPv4 address as a RoCE v2 GID, and
    the NIC's two UD endpoints: `responder` (its QP number goes to the peers) and `prober`."""

    def __init__(self, ipv4: str, stats: dict, pv: SimpleNamespace | None = None):
        self.pv = pv = pv or load_pyverbs()
        E = pv.E
        want = mapped_gid(ipv4)
        try:
            names = device_names(pv.device)
        except pv.PyverbsError as e:
            raise VerbsError(f"cannot list RDMA devices: {e}") from None
        for name in names:
            ctx = pv.device.Context(name=name)
            found = self._find_gid(ctx, want, E)
            if found:
                self.ctx, self.name, (self.port, self.gid_index) = ctx, name, found
                break
            ctx.close()
        else:
            raise VerbsError(
                f"no RDMA device has {ipv4} as an active RoCE v2 GID (devices: {', '.join(names) or 'none'})"
            )
        self.ipv4 = ipv4
        try:
            self.pd = pv.pd.PD(self.ctx)
            self.clock = HcaClock(self.ctx, pv)
            self.responder = Endpoint(self, stats)
            self.prober = Endpoint(self, stats)
        except BaseException:
            self.ctx.close()
            raise

    @staticmethod
    def _find_gid(ctx, want: str, E) -> tuple[int, int] | None:
        for port in range(1, ctx.query_device().phys_port_cnt + 1):
            attr = ctx.query_port(port)
            if attr.state != E.IBV_PORT_ACTIVE or attr.link_layer != E.IBV_LINK_LAYER_ETHERNET:
                continue
            for index in range(attr.gid_tbl_len):
                try:
                    gid = str(ctx.query_gid(port, index))
                    if gid == want and ctx.query_gid_type(port, index) == E.IBV_GID_TYPE_SYSFS_ROCE_V2:
                        return port, index
                except Exception:  # an empty entry of the table
                    continue
        return None

    def close(self) -> None:
        for endpoint in (getattr(self, "responder", None), getattr(self, "prober", None)):
            if endpoint is not None:
                endpoint.close()
        self.ctx.close()


class Endpoint:
    """One UD QP with its CQs, send and receive rings, and address handles; duck-types the parts of
    tstamp.StampedSocket the prober and responder use (send, receive, drain_errqueue, pending)."""

    def __init__(self, dev: VerbsDevice, stats: dict):
        pv, E = dev.pv, dev.pv.E
        self.dev, self.pv, self.E, self.stats = dev, pv, E, stats
        self.addr = dev.ipv4
        self.port = ROCE_V2_PORT
        flags = E.IBV_WC_STANDARD_FLAGS | E.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
        try:
            self.scq = pv.cq.CQEX(dev.ctx, pv.cq.CqInitAttrEx(cqe=SEND_SLOTS, wc_flags=flags))
            self.rcq = pv.cq.CQEX(dev.ctx, pv.cq.CqInitAttrEx(cqe=RECV_SLOTS, wc_flags=flags))
        except pv.PyverbsError as e:
            raise VerbsError(f"{dev.name}: no completion queue with timestamps ({e})") from None
        cap = pv.qp.QPCap(max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(qp_type=E.IBV_QPT_UD, scq=self.scq, rcq=self.rcq, cap=cap)
        attr = pv.qp.QPAttr(port_num=dev.port)
        attr.qkey = QKEY
        attr.pkey_index = 0
        self.qp = pv.qp.QP(dev.pd, init, attr)  # a UD QP given attributes is brought to RTS
        self.qpn = self.qp.qp_num
        self.recv_mr = pv.mr.MR(dev.pd, RECV_SLOTS * RECV_SLOT, E.IBV_ACCESS_LOCAL_WRITE)
        self.send_mr = pv.mr.MR(dev.pd, SEND_SLOTS * SEND_SLOT, E.IBV_ACCESS_LOCAL_WRITE)
        self.recv_wrs = [pv.wr.RecvWR(wr_id=i, num_sge=1, sg=[pv.wr.SGE(self.recv_mr.buf + i * RECV_SLOT, RECV_SLOT,
                                                                        self.recv_mr.lkey)])
                         for i in range(RECV_SLOTS)]
        for wr_ in self.recv_wrs:
            self.qp.post_recv(wr_)
        self.poll_attr = pv.cq.PollCqAttr()
        self.ahs: OrderedDict[tuple[str, int], object] = OrderedDict()
        self.next_key = 0  # wr_id of the next send: TX stamps are matched by it, like OPT_ID keys
        self.completed = 0  # sends whose completion came back (completions of one send queue are in order)
        self.pending: dict[int, object] = {}

    # -- sending -----------------------------------------------------------------------------------
    def _ah(self, ipv4: str, flow_label: int):
        key = (ipv4, flow_label)
        ah = self.ahs.get(key)
        if ah is None:
            pv = self.pv
            gr = pv.addr.GlobalRoute(dgid=pv.addr.GID(mapped_gid(ipv4)), flow_label=flow_label,
                                     sgid_index=self.dev.gid_index, hop_limit=64)
            ah = self.ahs[key] = pv.addr.AH(self.dev.pd, attr=pv.addr.AHAttr(is_global=1, port_num=self.dev.port,
                                                                              gr=gr))
            if len(self.ahs) > AH_CACHE:
                self.ahs.popitem(last=False)[1].close()
        else:
            self.ahs.move_to_end(key)
        return ah

    def send(self, payload: bytes, dest: tuple, token: object = None, ttl: int | None = None) -> bool:
        """UD SEND to dest = (IPv4, QP number, flow label); the completion's stamp is the TX stamp."""
        if ttl is not None:
            raise ValueError("a UD send has no IP TTL: traceroute goes through the kernel socket")
        key = self.next_key
        if key - self.completed >= SEND_SLOTS or len(payload) > SEND_SLOT:
            self.stats["send_queue_full"] += 1
            return False
        pv, E = self.pv, self.E
        ipv4, qpn, flow_label = dest
        try:
            ah = self._ah(ipv4, flow_label)
            offset = key % SEND_SLOTS * SEND_SLOT
            self.send_mr.write(payload, len(payload), offset)
            wr_ = pv.wr.SendWR(wr_id=key, opcode=E.IBV_WR_SEND, num_sge=1,
                               sg=[pv.wr.SGE(self.send_mr.buf + offset, len(payload), self.send_mr.lkey)],
                               send_flags=E.IBV_SEND_SIGNALED)
            wr_.set_wr_ud(ah, qpn, QKEY)
            self.qp.post_send(wr_)
        except pv.PyverbsError as e:
            self.stats["verbs_send_errors"] += 1
            log.debug("UD send to %s QP %d failed: %s", ipv4, qpn, e)
            return False
        if token is not None:
            self.pending[key] = token
        self.next_key = key + 1
        return True

    # -- completions -------------------------------------------------------------------------------
    def _poll(self, cq, limit: int = 256) -> list[tuple[int, int, int, int, int]]:
        """(status, wr_id, byte_len, src_qp, raw timestamp) of up to `limit` completions."""
        out = []
        if cq.start_poll(self.poll_attr) != 0:  # ENOENT: nothing; end_poll must not be called then
            return out
        try:
            while True:
                out.append((cq.status, cq.wr_id, cq.read_byte_len(), cq.read_src_qp(), cq.read_timestamp()))
                if len(out) >= limit or cq.poll_next() != 0:
                    break
        finally:
            cq.end_poll()
        return out

    def drain_errqueue(self) -> tuple[list[tuple[int, int]], list]:
        """TX stamps [(wr_id, realtime ns)] from send completions (no ICMP errors on a QP)."""
        ok, to_ns = self.E.IBV_WC_SUCCESS, self.dev.clock.to_ns
        stamps = []
        for status, wr_id, _n, _qp, ts in self._poll(self.scq):
            self.completed = max(self.completed, wr_id + 1)
            if status == ok:
                stamps.append((wr_id, to_ns(ts)))
            else:
                self.stats["verbs_send_errors"] += 1
                self.pending.pop(wr_id, None)
        return stamps, []

    def receive(self, key: bytes, stats: dict) -> Iterator[tuple[wire.Message, int, tuple]]:
        """Packets of ours that arrived: (message, RX stamp as realtime ns, (IPv4, QP number, flow label
        to answer with)). The receive buffer goes back to the QP at once."""
        ok, to_ns = self.E.IBV_WC_SUCCESS, self.dev.clock.to_ns
        for status, slot, length, src_qp, ts in self._poll(self.rcq):
            if status != ok:  # e.g. flushed: the QP left RTS
                self.stats["verbs_recv_errors"] += 1
                continue
            data = self.recv_mr.read(length, slot * RECV_SLOT)
            self.qp.post_recv(self.recv_wrs[slot])
            src = _ipv4_of_grh(data[:GRH_LEN])
            try:
                msg = wire.decode(key, data[GRH_LEN:])
            except wire.BadPacket as e:
                stats[f"rx_{e.kind}"] += 1
                continue
            if src is None:
                stats["rx_foreign"] += 1
                continue
            yield msg, to_ns(ts), (src, src_qp, msg.ta & 0xFFFFF if msg.type == wire.PROBE else 0)

    def close(self) -> None:
        for ah in self.ahs.values():
            ah.close()
        self.ahs.clear()
        for obj in (self.qp, self.send_mr, self.recv_mr, self.scq, self.rcq):
            obj.close()


class VerbsPort:
    """One RoCE v2 source port of a NIC's prober QP: a path's probes go out with its flow label.
    Its kernel UDP socket, bound to the same port, traces that 5-tuple; it also reserves the port."""

    __slots__ = ("endpoint", "trace", "port", "addr", "flow_label")

    def __init__(self, endpoint: Endpoint, trace: tstamp.StampedSocket):
        self.endpoint, self.trace = endpoint, trace
        self.addr, self.port = trace.addr, trace.port
        self.flow_label = flow_label_for_sport(self.port)

    @property
    def reply_tag(self) -> int:
        return self.flow_label

    @property
    def pending(self) -> dict:
        return self.endpoint.pending

    @property
    def next_key(self) -> int:
        return self.endpoint.next_key

    def send(self, payload: bytes, dest: tuple, token: object = None, ttl: int | None = None) -> bool:
        if ttl is not None:  # a traceroute step: kernel UDP, same 5-tuple as the RoCE packets
            return self.trace.send(payload, (dest[0], ROCE_V2_PORT), ttl=ttl)
        return self.endpoint.send(payload, (dest[0], dest[1], self.flow_label), token)

    def receive(self, key: bytes, stats: dict):
        return self.trace.receive(key, stats)

    def drain_errqueue(self):
        return self.trace.drain_errqueue()

    def fileno(self) -> int:
        return self.trace.fileno()

    def close(self) -> None:
        self.trace.close()


def open_ports(endpoint: Endpoint, address: str, count: int, rng) -> list[VerbsPort]:
    """`count` random RoCE v2 source ports whose kernel UDP port is free on `address` (the UDP
    transport's sockets, bound first, keep theirs)."""
    out: list[VerbsPort] = []
    tried: set[int] = set()
    while len(out) < count:
        port = rng.randrange(SPORT_MIN + 1, 0x10000)
        if port in tried:
            continue
        tried.add(port)
        try:
            out.append(VerbsPort(endpoint, tstamp.StampedSocket(address, port)))
        except OSError as e:
            if e.errno != 98 or len(tried) > count + 1024:  # 98: EADDRINUSE, try another
                for p in out:
                    p.close()
                raise OSError(e.errno, f"cannot bind a trace socket on {address}:{port}: {e.strerror}") from None
    return out
