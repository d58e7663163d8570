"""The simulation behind the fake pyverbs: configuration, simulated HCA clocks, the UDP "wire".

Not part of the pyverbs API. Tests may read `stats`, `last_rx`, `rx_log`, `last_tx` and `tx_log`.

Configuration: the JSON file named by $NMS_FAKE_VERBS, re-read whenever it changes (path, inode, size
or mtime), so a test can inject loss, take a port down or step a clock while processes run:

    {"devices": [{"name": "fake_0", "ipv4": "127.0.0.1", "wire": ["127.0.0.1", 47001],
                  "hca_core_clock_khz": 156250, "clock_offset_ns": 123456789, "drift_ppm": 20.0,
                  "timestamp_mask": 281474976710655, "port_state": "active", "active_mtu": 1024}],
     "loss": [{"src": "127.0.0.1", "dst": "127.0.0.2", "udp_sport": 49153, "rate": 0.5}]}

A loss entry matches on the keys it has (src, dst: IPv4 of the devices; udp_sport: the RoCE v2 UDP
source port; src_qpn, dst_qpn); `rate` (default 1.0) is the drop probability. The random source is
seeded from $NMS_FAKE_VERBS_SEED when set.

The wire: one non-blocking UDP socket per device and process, bound to the device's `wire` address
when the process creates its first QP on the device (opening a Context only to query it binds
nothing, so many processes can scan the device list) and closed with the last Context. A UD SEND is
one datagram: HDR followed by the payload. The receiver drains its socket whenever one of the
device's CQs is polled; the kernel's receive stamp (SO_TIMESTAMPNS, CLOCK_REALTIME) is converted to
the receiving device's HCA clock.
"""

from __future__ import annotations

import collections
import errno
import ipaddress
import json
import logging
import os
import random
import socket
import struct
import time
import weakref
import zlib

ENV = "NMS_FAKE_VERBS"
SEED_ENV = "NMS_FAKE_VERBS_SEED"

# counters: lost, tx_no_route, tx_port_down, tx_error, rx_no_qp, rx_bad_qkey, rx_no_wr, rx_qp_state,
# rx_port_down, rx_garbage, rx_len_err, rx_prot_err, cq_overrun, delivered, sent
stats: collections.Counter = collections.Counter()
rx_log: collections.deque = collections.deque(maxlen=256)  # delivered datagrams (dicts), oldest first
tx_log: collections.deque = collections.deque(maxlen=256)  # datagrams handed to the wire (dicts)
last_rx: dict | None = None
last_tx: dict | None = None

GRH_LEN = 40
ROCE_V2_DPORT = 4791
SPORT_MIN = 0xC000
FLOW_LABEL_MASK = 0xFFFFF
GID_TBL_LEN = 255
PKEY_TBL_LEN = 1
MAX_QP_WR = 32768
MAX_SGE = 30
MAX_CQE = 4194303
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
IBV_PORT_DOWN, IBV_PORT_ACTIVE = 1, 4
GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2 = 0, 1

# magic, version, gid type of the sender's sgid, hop limit, traffic class, has imm, RoCE v2 UDP source
# port, dst qpn, src qpn, qkey, flow label, imm data, sgid, dgid
HDR = struct.Struct("!4sBBBBBxHIIIII16s16s")
MAGIC = b"FVRB"
VERSION = 1

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # asm-generic value (x86, arm); SCM_TIMESTAMPNS alike
_ANC_SIZE = socket.CMSG_SPACE(16)

log = logging.getLogger("pyverbs.fake")


# -- errors (imported lazily: pyverbs_error imports nothing from here) ------------------------------
def rdma_error(msg: str, code: int = -1):
    from pyverbs.pyverbs_error import PyverbsRDMAError
    return PyverbsRDMAError(msg, code)


# -- pyverbs.base look-alikes ------------------------------------------------------------------------
def c_field(name: str, mask: int | None = None, grh: bool = False) -> property:
    """A C struct member as pyverbs exposes it: kept in `_<name>`, cut to the member's width on
    assignment (`mask`); `grh`: an ibv_ah_attr GRH member, which reads None unless is_global."""
    slot = "_" + name

    def get(self):
        return None if grh and not self.is_global else getattr(self, slot)

    def put(self, val):
        setattr(self, slot, val & mask if mask is not None else val)

    return property(get, put)


class PyverbsObject:
    """pyverbs.base.PyverbsObject: every pyverbs object has set_log_level."""

    def __init__(self):
        self._logger = logging.getLogger(self.__class__.__name__)

    def set_log_level(self, val, /):
        self._logger.setLevel(val)


class PyverbsCM(PyverbsObject):
    """pyverbs.base.PyverbsCM: a context manager whose exit closes the object; objects created from it
    are closed first (like close_weakrefs in real pyverbs)."""

    def __init__(self):
        super().__init__()
        self._dependents = weakref.WeakSet()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        return self.close()

    def _add_ref(self, obj):
        self._dependents.add(obj)

    def _close_dependents(self):
        for obj in list(self._dependents):
            obj.close()
        self._dependents = weakref.WeakSet()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, half-built objects
            pass


# -- configuration ----------------------------------------------------------------------------------
class DevCfg:
    """One device of the configuration file."""

    def __init__(self, d: dict, index: int):
        self.name = str(d["name"])
        self.index = index
        self.ipv4 = str(ipaddress.IPv4Address(d["ipv4"]))
        wire = d.get("wire") or [self.ipv4, 0]
        self.wire = (str(wire[0]), int(wire[1]))
        self.khz = int(d.get("hca_core_clock_khz", 156250))
        self.offset_ns = int(d.get("clock_offset_ns", 0))
        self.drift_ppt = round(float(d.get("drift_ppm", 0.0)) * 1_000_000)  # parts per 10**12
        self.mask = int(d.get("timestamp_mask", 0x7FFFFFFFFFFFFFFF))  # mlx5_ib reports 2**63 - 1
        self.port_state = IBV_PORT_ACTIVE if str(d.get("port_state", "active")).lower() == "active" else IBV_PORT_DOWN
        mtu = int(d.get("active_mtu", 1024))  # a 1500-byte Ethernet MTU gives RoCE IBV_MTU_1024
        self.active_mtu = max((k for k, v in MTU_BYTES.items() if v <= mtu), default=1)
        crc = zlib.crc32(self.name.encode())
        self.mac = bytes([0x02, 0x00]) + crc.to_bytes(4, "big")
        eui = bytes([self.mac[0] ^ 0x02]) + self.mac[1:3] + b"\xff\xfe" + self.mac[3:]
        self.guid = int.from_bytes(eui, "big")  # node GUID: the port MAC's EUI-64, as mlx5 on Ethernet
        link_local = b"\xfe\x80" + bytes(6) + eui
        mapped = bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(self.ipv4).packed
        # mlx5's order: link-local RoCE v1, v2, then each IP address as RoCE v1, v2
        self.gids = [(link_local, GID_TYPE_ROCE_V1), (link_local, GID_TYPE_ROCE_V2),
                     (mapped, GID_TYPE_ROCE_V1), (mapped, GID_TYPE_ROCE_V2)]

    @property
    def key(self) -> tuple:
        return (self.name, self.ipv4, self.wire)

    def cycles(self, realtime_ns: int) -> int:
        """The raw HCA clock at a CLOCK_REALTIME instant: (t + offset) * (1 + drift) * kHz / 1e6, masked."""
        return (realtime_ns + self.offset_ns) * self.khz * (10**12 + self.drift_ppt) // 10**18 & self.mask


class Config:
    def __init__(self, raw: dict):
        self.devices = {}
        for i, d in enumerate(raw.get("devices") or []):
            dev = DevCfg(d, i)
            self.devices[dev.name] = dev
        self.by_ipv4 = {d.ipv4: d for d in self.devices.values()}
        self.loss = list(raw.get("loss") or [])


_cfg_key = None
_cfg: Config | None = None


def config() -> Config | None:
    """The configuration, re-read when its file changed; None without $NMS_FAKE_VERBS or its file."""
    global _cfg_key, _cfg
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    if key != _cfg_key:
        try:
            with open(path) as f:
                cfg = Config(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            if _cfg is not None and _cfg_key and _cfg_key[0] == path:
                log.warning("fake pyverbs: %s unreadable (%s), keeping the previous configuration", path, e)
                return _cfg  # a half-written file: retry on the next call
            raise rdma_error(f"Fake pyverbs: bad configuration {path}: {e}") from None
        _cfg_key, _cfg = key, cfg
    return _cfg


def device_cfg(name: str, fallback: DevCfg | None = None) -> DevCfg | None:
    cfg = config()
    dev = cfg.devices.get(name) if cfg else None
    return dev or fallback


_rng: random.Random | None = None


def rng() -> random.Random:
    global _rng
    if _rng is None:
        seed = os.environ.get(SEED_ENV)
        _rng = random.Random(int(seed)) if seed not in (None, "") else random.Random()
    return _rng


def flow_label_to_udp_sport(fl: int) -> int:
    """libibverbs' ibv_flow_label_to_udp_sport (verbs.h)."""
    fl_low = fl & 0x3FFF
    fl_high = fl & 0xFC000
    fl_low ^= fl_high >> 14
    return fl_low | SPORT_MIN


def ipv4_of_gid(raw: bytes) -> str | None:
    if raw[:12] == bytes(10) + b"\xff\xff":
        return str(ipaddress.IPv4Address(raw[12:]))
    return None


# -- fake memory ------------------------------------------------------------------------------------
_next_addr = 0x7F3A_0000_0000
_next_key = 0x1A2B
mrs_by_lkey: dict[int, object] = {}  # lkey -> MR (weak semantics: MR.close removes itself)


def alloc_region(length: int) -> tuple[int, int]:
    """A fresh fake virtual address (page aligned, a guard page between regions) and a fresh key."""
    global _next_addr, _next_key
    addr = _next_addr
    _next_addr += (max(length, 1) + 0x1FFF) // 0x1000 * 0x1000
    key = _next_key
    _next_key = (_next_key + 0x101) & 0xFFFFFFFF
    return addr, key


def resolve_sge(addr: int, length: int, lkey: int, need_write: bool):
    """(MR, offset) for an SGE, or None when no MR with that lkey covers [addr, addr + length)."""
    mr = mrs_by_lkey.get(lkey)
    if mr is None or mr._data is None:
        return None
    off = addr - mr._addr
    if off < 0 or off + length > len(mr._data):
        return None
    if need_write and not mr._access & 1:  # IBV_ACCESS_LOCAL_WRITE
        return None
    return mr, off


# -- completions ------------------------------------------------------------------------------------
class Completion:
    __slots__ = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "qp_num", "src_qp", "imm_data",
                 "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits", "timestamp", "qp", "sq_seq")

    def __init__(self, wr_id, status, opcode, qp_num, timestamp, byte_len=0, src_qp=0, imm_data=0, wc_flags=0,
                 qp=None, sq_seq=None):
        # plain ints, as the real accessors return C values
        self.wr_id, self.status, self.opcode, self.qp_num = wr_id, int(status), int(opcode), qp_num
        self.timestamp, self.byte_len, self.src_qp, self.imm_data, self.wc_flags = (timestamp, byte_len, src_qp,
                                                                                    imm_data, int(wc_flags))
        self.vendor_err = 0 if status == 0 else 0x32
        self.pkey_index = self.slid = self.sl = self.dlid_path_bits = 0
        self.qp, self.sq_seq = qp, sq_seq


def consumed(c: Completion) -> None:
    """A completion was polled: its send queue slots (and those of unsignaled sends before it) free up."""
    if c.sq_seq is not None and c.qp is not None:
        c.qp._retire_sends(c.sq_seq)


# -- devices of this process ------------------------------------------------------------------------
class Device:
    """This process's side of one configured device: its wire socket and its QPs."""

    def __init__(self, cfg: DevCfg):
        self.cfg = cfg
        self.sock: socket.socket | None = None
        self.qps: dict[int, object] = {}
        self.contexts = 0

    @property
    def name(self) -> str:
        return self.cfg.name

    def current(self) -> DevCfg:
        """The device's configuration as it is now (port state, clock, MTU may change at run time)."""
        cur = device_cfg(self.cfg.name)
        return cur if cur is not None and cur.key == self.cfg.key else self.cfg

    def bind(self) -> None:
        if self.sock is not None:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            except OSError:
                pass
            s.setblocking(False)
            s.bind(self.cfg.wire)
        except OSError as e:
            s.close()
            raise rdma_error(f"Fake pyverbs: cannot bind {self.cfg.name}'s wire {self.cfg.wire[0]}:{self.cfg.wire[1]}"
                             " (another process owns the device?)", e.errno or errno.EIO) from None
        self.sock = s

    def new_qpn(self) -> int:
        r = rng()
        while True:
            qpn = r.randrange(0x100, 0x1000000)
            if qpn not in self.qps:
                return qpn

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.qps.clear()

    # -- tx -----------------------------------------------------------------------------------------
    def transmit(self, ah, dst_qpn: int, src_qpn: int, qkey: int, payload: bytes, imm: int | None) -> tuple[bool, int]:
        """Send one UD datagram; (handed to the wire or lost on it: True; the socket failed: False, HCA
        cycles at the sendto)."""
        global last_tx
        me = self.current()
        cfg = config()
        sgid, gid_type = me.gids[ah._sgid_index]
        dgid = ah._dgid
        src_ip, dst_ip = ipv4_of_gid(sgid), ipv4_of_gid(dgid)
        sport = ah._sport if gid_type == GID_TYPE_ROCE_V2 else 0
        dst = cfg.by_ipv4.get(dst_ip) if cfg is not None and dst_ip is not None else None
        if dst is None and cfg is not None and dst_ip is None:  # a non-mapped dgid: match the link-local GIDs
            dst = next((d for d in cfg.devices.values() if any(g == dgid for g, _ in d.gids)), None)
        hdr = HDR.pack(MAGIC, VERSION, gid_type, ah._hop_limit & 0xFF, ah._traffic_class & 0xFF, imm is not None,
                       sport, dst_qpn & 0xFFFFFF, src_qpn, qkey & 0xFFFFFFFF, ah._flow_label, imm or 0, sgid, dgid)
        rec = {"src": src_ip, "dst": dst_ip, "udp_sport": sport or None, "src_qpn": src_qpn, "dst_qpn": dst_qpn,
               "flow_label": ah._flow_label, "hop_limit": ah._hop_limit, "len": len(payload), "gid_type": gid_type,
               "device": me.name}
        t = time.time_ns()
        cycles = me.cycles(t)
        if me.port_state != IBV_PORT_ACTIVE:
            stats["tx_port_down"] += 1
            return True, cycles
        if dst is None:
            stats["tx_no_route"] += 1
            return True, cycles
        for rule in cfg.loss:
            if _matches(rule, rec) and rng().random() < float(rule.get("rate", 1.0)):
                stats["lost"] += 1
                return True, cycles
        try:
            self.sock.sendto(hdr + payload, dst.wire)
        except OSError as e:
            stats["tx_error"] += 1
            log.debug("fake pyverbs: sendto %s failed: %s", dst.wire, e)
            return False, cycles
        stats["sent"] += 1
        rec["tx_cycles"] = cycles
        last_tx = rec
        tx_log.append(rec)
        return True, cycles

    # -- rx -----------------------------------------------------------------------------------------
    def drain(self) -> None:
        if self.sock is None:
            return
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(65535, _ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. ECONNREFUSED queued by an ICMP error
                stats["rx_error"] += 1
                log.debug("fake pyverbs: recvmsg: %s", e)
                continue
            rx_ns = None
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    rx_ns = sec * 1_000_000_000 + nsec
            self.deliver(data, rx_ns if rx_ns is not None else time.time_ns())

    def deliver(self, data: bytes, rx_ns: int) -> None:
        global last_rx
        if len(data) < HDR.size:
            stats["rx_garbage"] += 1
            return
        (magic, version, gid_type, hop_limit, tclass, has_imm, sport, dst_qpn, src_qpn, qkey, flow_label, imm,
         sgid, dgid) = HDR.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            stats["rx_garbage"] += 1
            return
        payload = data[HDR.size:]
        me = self.current()
        if me.port_state != IBV_PORT_ACTIVE:
            stats["rx_port_down"] += 1
            return
        qp = self.qps.get(dst_qpn)
        if qp is None:
            stats["rx_no_qp"] += 1
            return
        if not qp._can_receive():
            stats["rx_qp_state"] += 1
            return
        if qkey != qp._qkey:
            stats["rx_bad_qkey"] += 1
            return
        if not qp._rq:
            stats["rx_no_wr"] += 1
            return
        grh = build_grh(gid_type, sgid, dgid, hop_limit, tclass, flow_label, len(payload))
        cycles = me.cycles(rx_ns)
        rec = {"src": ipv4_of_gid(sgid), "dst": ipv4_of_gid(dgid), "udp_sport": sport or None, "src_qpn": src_qpn,
               "dst_qpn": dst_qpn, "flow_label": flow_label, "hop_limit": hop_limit, "len": len(payload),
               "gid_type": gid_type, "rx_ns": rx_ns, "rx_cycles": cycles, "device": me.name}
        qp._receive(grh + payload, src_qpn, imm if has_imm else None, cycles)
        stats["delivered"] += 1
        last_rx = rec
        rx_log.append(rec)


def _matches(rule: dict, rec: dict) -> bool:
    for key in ("src", "dst", "udp_sport", "src_qpn", "dst_qpn"):
        if key in rule and rule[key] is not None and rule[key] != rec.get(key):
            return False
    return True


def _ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def build_grh(gid_type: int, sgid: bytes, dgid: bytes, hop_limit: int, tclass: int, flow_label: int, n: int) -> bytes:
    """The 40 bytes a UD receive starts with. RoCE v2 over IPv4: 20 unused (zero) bytes then the IPv4
    header, as mlx5 writes it; RoCE v2 over IPv6: the IPv6 header; RoCE v1: the IB GRH (next header
    0x1B). Transport headers: UDP 8, BTH 12, DETH 8, ICRC 4 bytes."""
    src4, dst4 = ipv4_of_gid(sgid), ipv4_of_gid(dgid)
    if gid_type == GID_TYPE_ROCE_V2 and src4 is not None and dst4 is not None:
        total = 20 + 8 + 12 + 8 + n + 4
        hdr = struct.pack("!BBHHHBBH4s4s", 0x45, tclass, total, 0, 0x4000, hop_limit, 17, 0,
                          ipaddress.IPv4Address(src4).packed, ipaddress.IPv4Address(dst4).packed)
        hdr = hdr[:10] + struct.pack("!H", _ip_checksum(hdr)) + hdr[12:]
        return bytes(20) + hdr
    v2 = gid_type == GID_TYPE_ROCE_V2
    paylen = (8 if v2 else 0) + 12 + 8 + n + 4
    first = 6 << 28 | (tclass & 0xFF) << 20 | (flow_label & FLOW_LABEL_MASK)
    return struct.pack("!IHBB", first, paylen, 17 if v2 else 0x1B, hop_limit) + sgid + dgid


devices: dict[tuple, Device] = {}


def open_device(name: str) -> Device:
    """Attach a Context to the device `name` (raises like ibv_get_device_list / Context)."""
    cfg = config()
    if cfg is None or not cfg.devices:
        raise rdma_error("Failed to get devices list")
    dc = cfg.devices.get(name)
    if dc is None:
        raise rdma_error(f"Failed to find device {name}")
    dev = devices.get(dc.key)
    if dev is None:
        dev = devices[dc.key] = Device(dc)
    dev.contexts += 1
    return dev


def close_device(dev: Device) -> None:
    dev.contexts -= 1
    if dev.contexts <= 0:
        dev.close()
        if devices.get(dev.cfg.key) is dev:
            del devices[dev.cfg.key]
