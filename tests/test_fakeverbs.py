"""The fake pyverbs of tests/fakeverbs: faithful to the real one (rdma-core v44, checked against the
system's python3-pyverbs) and a working RDMA UD fabric over loopback UDP, within one process and
between two."""

from __future__ import annotations

import errno
import importlib
import inspect
import json
import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

FAKE = Path(__file__).parent / "fakeverbs"
SYSTEM_PYTHON = "/usr/bin/python3"
MODULES = ["pyverbs_error", "enums", "device", "pd", "cq", "qp", "addr", "mr", "wr"]
QKEY = 0x11111111
KHZ = 156_250


def sport_for(fl: int) -> int:
    """libibverbs' ibv_flow_label_to_udp_sport, written out independently of the fake."""
    return ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000


def mapped_gid(ipv4: str) -> str:
    """::ffff:a.b.c.d in the 8-word form pyverbs' GID takes."""
    h = (bytes(10) + b"\xff\xff" + socket.inet_aton(ipv4)).hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def free_udp_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def write_fabric(path: Path, devices: list[dict], loss: list[dict] | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices, "loss": loss or []}))
    os.replace(tmp, path)


def device_entry(name: str, ipv4: str, offset_ns: int = 0, drift_ppm: float = 0.0, mask: int = (1 << 64) - 1) -> dict:
    return {"name": name, "ipv4": ipv4, "wire": [ipv4, free_udp_port(ipv4)], "hca_core_clock_khz": KHZ,
            "clock_offset_ns": offset_ns, "drift_ppm": drift_ppm, "timestamp_mask": mask, "port_state": "active"}


def to_realtime(cycles: int, dev: dict) -> int:
    """Inverse of the simulated clock for a mask that does not wrap: cycles -> CLOCK_REALTIME ns (exact
    arithmetic: a float would lose ~100 ns at today's cycle counts)."""
    rate = Fraction(dev["hca_core_clock_khz"], 10**6) * (1 + Fraction(dev["drift_ppm"]) / 10**6)
    return round(cycles / rate - dev["clock_offset_ns"])


@pytest.fixture
def pv(monkeypatch):
    """Freshly imported fake pyverbs modules (and a fresh simulation state)."""
    monkeypatch.syspath_prepend(str(FAKE))
    for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    mods = {name: importlib.import_module(f"pyverbs.{name}") for name in MODULES + ["_fabric"]}
    ns = SimpleNamespace(**mods)
    ns.e = mods["enums"]
    return ns


@pytest.fixture
def two_devices(pv, tmp_path, monkeypatch):
    devs = [device_entry("fake_a", "127.0.0.2", offset_ns=123_456_789_000, drift_ppm=40.0),
            device_entry("fake_b", "127.0.0.3", offset_ns=-7_000_000_000, drift_ppm=-25.0)]
    conf = tmp_path / "fabric.json"
    write_fabric(conf, devs)
    monkeypatch.setenv("NMS_FAKE_VERBS", str(conf))
    monkeypatch.setenv("NMS_FAKE_VERBS_SEED", "11")
    return conf, devs


class Endpoint:
    """Context, PD, one timestamping CQEX for both queues, a UD QP in RTS, one MR."""

    def __init__(self, pv, name: str, max_send_wr: int = 16, max_recv_wr: int = 64, cqe: int = 128):
        e = pv.e
        self.pv = pv
        self.ctx = pv.device.Context(name=name)
        self.pd = pv.pd.PD(self.ctx)
        flags = e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
        self.cq = pv.cq.CQEX(self.ctx, pv.cq.CqInitAttrEx(cqe=cqe, wc_flags=flags))
        cap = pv.qp.QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr)
        attr = pv.qp.QPAttr(port_num=1)
        attr.qkey = QKEY
        attr.pkey_index = 0
        self.qp = pv.qp.QP(self.pd, pv.qp.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap), attr)
        self.mr = pv.mr.MR(self.pd, 64 * 1024, e.IBV_ACCESS_LOCAL_WRITE)
        self.slot = 2048

    def post_recv(self, slot: int) -> None:
        wr = self.pv.wr
        sge = wr.SGE(self.mr.buf + slot * self.slot, self.slot, self.mr.lkey)
        self.qp.post_recv(wr.RecvWR(wr_id=1000 + slot, num_sge=1, sg=[sge]))

    def ah(self, dst_ipv4: str, flow_label: int, hop_limit: int = 64):
        a = self.pv.addr
        gr = a.GlobalRoute(dgid=a.GID(mapped_gid(dst_ipv4)), flow_label=flow_label, sgid_index=3, hop_limit=hop_limit)
        return a.AH(self.pd, attr=a.AHAttr(is_global=1, port_num=1, gr=gr))

    def send(self, ah, rqpn: int, payload: bytes, wr_id: int, qkey: int = QKEY, offset: int = 60000) -> None:
        wr = self.pv.wr
        self.mr.write(payload, len(payload), offset)
        swr = wr.SendWR(wr_id=wr_id, num_sge=1, sg=[wr.SGE(self.mr.buf + offset, len(payload), self.mr.lkey)])
        swr.set_wr_ud(ah, rqpn, qkey)
        self.qp.post_send(swr)

    def poll(self, want: int = 1, timeout: float = 2.0) -> list[dict]:
        """Up to `want` completions: dicts of everything the CQ reads."""
        out: list[dict] = []
        attr = self.pv.cq.PollCqAttr()
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            if self.cq.start_poll(attr) != 0:
                time.sleep(0.001)
                continue
            try:
                while True:
                    cq = self.cq
                    out.append({"status": cq.status, "wr_id": cq.wr_id, "opcode": cq.read_opcode(),
                                "byte_len": cq.read_byte_len(), "src_qp": cq.read_src_qp(),
                                "qp_num": cq.read_qp_num(), "wc_flags": cq.read_wc_flags(),
                                "ts": cq.read_timestamp()})
                    if len(out) >= want or cq.poll_next() != 0:
                        break
            finally:
                self.cq.end_poll()
        return out

    def close(self) -> None:
        self.ctx.close()


# -- 1. faithfulness to the real pyverbs ---------------------------------------------------------------
DUMP_SCRIPT = r'''
import importlib, json, sys
spec = json.load(sys.stdin)

def prim(v):
    if isinstance(v, bytes):
        return v.hex()
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, int):
        return int(v)
    raise TypeError

out = {"missing_modules": [], "missing": [], "constants": {}, "enum_members": {}, "probes": {}, "docs": {},
       "cases": {}}
mods = {}
for name, m in spec["modules"].items():
    try:
        mods[name] = mod = importlib.import_module("pyverbs." + name)
    except ImportError:
        out["missing_modules"].append(name)
        continue
    for cname, c in m["classes"].items():
        cls = getattr(mod, cname, None)
        if not isinstance(cls, type):
            out["missing"].append(name + "." + cname)
            continue
        for member in c["members"]:
            if not hasattr(cls, member):
                out["missing"].append(name + "." + cname + "." + member)
        if c["enum"]:
            out["enum_members"][name + "." + cname] = {k: int(v) for k, v in cls.__members__.items()}
    for fname in m["functions"]:
        if not callable(getattr(mod, fname, None)):
            out["missing"].append(name + "." + fname)
    for cname in m["constants"]:
        v = getattr(mod, cname, None)
        out["constants"][name + "." + cname] = None if v is None else [int(v), type(v).__name__]

for key, (mname, cname, meth, kwnames, var_kw) in spec["probes"].items():
    mod = mods.get(mname)
    try:
        owner = getattr(mod, cname) if cname else mod
        if cname:
            obj = owner.__new__(owner)  # no C object behind it: calls must stop at argument parsing
            f = getattr(obj, meth)
            doc = getattr(owner, meth).__doc__ or ""
        else:
            f = getattr(owner, meth)
            doc = f.__doc__ or ""
    except Exception as ex:
        out["probes"][key] = "lookup failed: %r" % (ex,)
        continue
    out["docs"][key] = doc
    if var_kw:  # it would accept the probe keyword and run: read its docstring only
        continue
    # Cython parses keywords before running anything: with every name known, the error names the extra
    # one. Which unknown name it reports depends on the order, hence both orders.
    msgs = []
    for kw in ({**dict.fromkeys(kwnames), "zz_probe": 1}, {"zz_probe": 1, **dict.fromkeys(kwnames)}):
        try:
            f(**kw)
            msgs.append("no error")
        except TypeError as ex:
            msgs.append(str(ex))
        except Exception as ex:
            msgs.append("%s: %s" % (type(ex).__name__, ex))
    out["probes"][key] = msgs

from pyverbs import addr, cq, qp, wr  # noqa: F401  (the cases use them)
import pyverbs.enums as e  # noqa: F401
for expr in spec["cases"]:
    try:
        obj = eval(expr)
    except Exception as ex:
        out["cases"][expr] = {"error": [type(ex).__name__, str(ex)]}
        continue
    attrs = {}
    for a in dir(obj):
        if a.startswith("_"):
            continue
        try:
            v = getattr(obj, a)
            if not callable(v):
                attrs[a] = prim(v)
        except Exception:
            pass
    out["cases"][expr] = {"attrs": attrs}
print(json.dumps(out))
'''

# constructors both pyverbs can run without a device: same arguments, same resulting attributes
CASES = [
    "qp.QPCap()",
    "qp.QPCap(max_send_wr=5, max_recv_wr=7, max_send_sge=2, max_recv_sge=3, max_inline_data=64)",
    "qp.QPInitAttr()",
    "qp.QPInitAttr(qp_type=e.IBV_QPT_UD, qp_context=None, scq=None, rcq=None, srq=None, "
    "cap=qp.QPCap(max_send_wr=3), sq_sig_all=0)",
    "qp.QPAttr()",
    "qp.QPAttr(qp_state=e.IBV_QPS_RTS, cur_qp_state=e.IBV_QPS_INIT, port_num=2, path_mtu=e.IBV_MTU_4096)",
    "cq.CqInitAttrEx()",
    "cq.CqInitAttrEx(cqe=7, channel=None, comp_vector=0, wc_flags=e.IBV_WC_STANDARD_FLAGS, "
    "comp_mask=0, flags=0, parent_domain=None)",
    "cq.CqInitAttrEx(cq_context=None)",  # not a v44 keyword: both must refuse it
    "cq.PollCqAttr()",
    "cq.WC()",
    "cq.WC(wr_id=5, status=1, opcode=128, byte_len=60, src_qp=77, wc_flags=1)",
    "addr.GID()",
    "addr.GID('fe80:0000:0000:0000:0202:C9FF:FE00:0001')",
    "addr.GID(val='0000:0000:0000:0000:0000:ffff:0a01:0203')",
    "addr.GID('::ffff:10.1.2.3')",
    "addr.GID('fe80::1')",
    "addr.GID('fe80:0000:0000:0000:0202:c9ff:fe00')",
    "addr.GlobalRoute(dgid=addr.GID('fe80:0000:0000:0000:0202:c9ff:fe00:0001'))",
    "addr.GlobalRoute(dgid=addr.GID('0000:0000:0000:0000:0000:ffff:0a01:0203'), flow_label=0xABCDE, sgid_index=3, "
    "hop_limit=64, traffic_class=32)",
    "addr.AHAttr()",
    "addr.AHAttr(is_global=1)",
    "addr.AHAttr(dlid=0, sl=3, src_path_bits=0, static_rate=0, is_global=1, port_num=1, "
    "gr=addr.GlobalRoute(dgid=addr.GID('0000:0000:0000:0000:0000:ffff:0a01:0203'), flow_label=5, hop_limit=9))",
    "wr.SGE(4096, 64, 7)",
    "wr.RecvWR()",
    "wr.RecvWR(wr_id=3, num_sge=1, sg=[wr.SGE(4096, 64, 7)], next_wr=None)",
    "wr.SendWR()",
    "wr.SendWR(num_sge=1, sg=[wr.SGE(4096, 64, 7)])",
    "wr.SendWR(wr_id=9, opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, imm_data=0x1234, sg=[wr.SGE(4096, 64, 7)], "
    "send_flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE, next_wr=None)",
]


def unqualified(msg: str) -> str:
    return re.sub(r"^\w+\.(?=\w+\(\))", "", msg)


def fake_spec(pv) -> dict:
    """What the fake defines: per module its classes (public members), functions, enum constants;
    the keyword names of every public callable."""
    spec: dict = {"modules": {}, "probes": {}, "cases": CASES}
    obj_names = set(dir(object))
    for name in MODULES:
        mod = getattr(pv, name)
        m = {"classes": {}, "functions": [], "constants": []}
        for attr, val in vars(mod).items():
            if attr.startswith("_"):
                continue
            if name == "enums" and attr.startswith("IBV_"):
                m["constants"].append(attr)
                continue
            if getattr(val, "__module__", None) != mod.__name__:
                continue  # imported, not defined here
            if isinstance(val, type):
                is_enum = issubclass(val, int) and hasattr(val, "__members__")
                members = sorted(val.__members__) if is_enum else sorted(
                    a for a in set(dir(val)) - obj_names if not a.startswith("_") or a in ("__enter__", "__exit__"))
                m["classes"][attr] = {"members": members, "enum": is_enum}
                if is_enum:
                    continue
                for meth in ["__init__"] + [a for a in members if inspect.isfunction(getattr(val, a, None))]:
                    fn = getattr(val, meth)
                    if meth == "__init__" and fn is object.__init__:
                        continue
                    _add_probe(spec, name, attr, meth, fn)
            elif callable(val):
                m["functions"].append(attr)
                _add_probe(spec, name, None, attr, val)
        spec["modules"][name] = m
    return spec


def _add_probe(spec, mname, cname, meth, fn) -> None:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    kwnames = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    posonly = [p.name for p in params if p.kind == p.POSITIONAL_ONLY]
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    if not kwnames and not posonly and not var_kw:
        return  # no arguments: nothing to compare
    key = ".".join(x for x in (mname, cname, meth) if x)
    spec["probes"][key] = [mname, cname, meth, kwnames, var_kw]
    spec.setdefault("posonly", {})[key] = posonly


def run_dump(python: str, spec: dict, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "NMS_FAKE_VERBS")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([python, "-c", DUMP_SCRIPT], input=json.dumps(spec), capture_output=True, text=True,
                       timeout=60, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def real_pyverbs_or_skip() -> str:
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"{SYSTEM_PYTHON} missing: no system python with pyverbs (apt install python3-pyverbs)")
    r = subprocess.run([SYSTEM_PYTHON, "-c", "import pyverbs.qp, pyverbs.enums"], capture_output=True, text=True,
                       cwd="/", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if r.returncode != 0:
        pytest.skip(f"the system python has no usable pyverbs (apt install python3-pyverbs): {r.stderr.strip()[-200:]}")
    return SYSTEM_PYTHON


def test_the_fake_matches_the_real_pyverbs(pv):
    python = real_pyverbs_or_skip()
    spec = fake_spec(pv)
    assert {"Context", "DeviceAttrEx", "PortAttr"} <= set(spec["modules"]["device"]["classes"])
    assert "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK" in spec["modules"]["enums"]["constants"]
    real = run_dump(python, spec, None)
    fake = run_dump(sys.executable, spec, str(FAKE))
    assert real["missing_modules"] == [] and fake["missing_modules"] == []
    # every name the fake defines exists in the real modules and classes
    assert real["missing"] == [], "the fake defines names the real pyverbs lacks"
    assert fake["missing"] == []
    # enum constants: same values and the same enum class; enum classes: the fake's members are real ones
    assert len(real["constants"]) >= 100
    assert fake["constants"] == real["constants"]
    for cls, members in fake["enum_members"].items():
        assert members.items() <= real["enum_members"][cls].items(), cls
    # keyword names: the real one (Cython) parses the fake's keywords, fails only on the extra one
    for key, (_m, _c, meth, kwnames, var_kw) in spec["probes"].items():
        short = "__init__" if meth == "__init__" else meth
        posonly = spec["posonly"][key]
        if var_kw:  # **kwargs: the documented names (':param x:' or '* *x*') must cover ours
            doc = real["docs"][key]
            for name in kwnames:
                assert f":param {name}:" in doc or f"*{name}*" in doc, (key, name)
        elif kwnames:
            for msg in real["probes"][key]:
                assert msg.endswith(f"{short}() got an unexpected keyword argument 'zz_probe'"), (key, msg)
            for msg in fake["probes"][key]:
                assert msg.endswith(f"{short}() got an unexpected keyword argument 'zz_probe'"), (key, msg)
        else:  # positional-only in the fake: the real method takes no keywords at all (METH_O)
            assert posonly
            for msg in real["probes"][key]:
                assert msg.endswith("takes no keyword arguments"), (key, msg)
    # and a real method refusing keywords is positional-only in the fake
    for key, msgs in real["probes"].items():
        if any(m.endswith("takes no keyword arguments") for m in msgs):
            assert spec["posonly"][key] and not spec["probes"][key][3], key
    # defaults and argument handling of the constructors that need no device
    for expr in CASES:
        r, f = real["cases"][expr], fake["cases"][expr]
        if "error" in r:  # same exception, same message (CPython names the class, Cython does not)
            assert "error" in f, (expr, f)
            assert [f["error"][0], unqualified(f["error"][1])] == [r["error"][0], unqualified(r["error"][1])], expr
            continue
        assert "attrs" in f, (expr, f)
        for name, value in f["attrs"].items():
            assert name in r["attrs"] and r["attrs"][name] == value, (expr, name, value, r["attrs"].get(name))


# -- 2. two devices in one process --------------------------------------------------------------------
def test_ud_send_between_two_devices(pv, two_devices):
    conf, devs = two_devices
    e, fabric = pv.e, pv._fabric
    names = [d.name for d in pv.device.get_device_list()]
    assert names == [b"fake_a", b"fake_b"]
    a, b = Endpoint(pv, "fake_a"), Endpoint(pv, "fake_b")
    try:
        # the device as hostprobe.verbs looks at it
        port = b.ctx.query_port(1)
        assert (port.state, port.link_layer, port.active_mtu) == (e.IBV_PORT_ACTIVE, e.IBV_LINK_LAYER_ETHERNET,
                                                                  e.IBV_MTU_1024)
        assert port.gid_tbl_len > 4 and b.ctx.query_device().phys_port_cnt == 1
        assert str(b.ctx.query_gid(1, 3)) == "0000:0000:0000:0000:0000:ffff:7f00:0003"
        assert str(b.ctx.query_gid(1, 0)).startswith("fe80:0000:0000:0000:")
        assert [b.ctx.query_gid_type(1, i) for i in range(4)] == [e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
                                                                  e.IBV_GID_TYPE_SYSFS_ROCE_V2] * 2
        assert str(b.ctx.query_gid(1, 9)) == "0000:0000:0000:0000:0000:0000:0000:0000"  # empty entry
        with pytest.raises(pv.pyverbs_error.PyverbsRDMAError):
            b.ctx.query_gid(1, port.gid_tbl_len)
        attr = a.ctx.query_device_ex()
        assert attr.hca_core_clock == KHZ and attr.completion_timestamp_mask == (1 << 64) - 1
        # the HCA clock: offset and drift as configured, read like mlx5 (sec 0, nsec = raw cycles)
        t0 = time.time_ns()
        sec, cycles = a.ctx.query_rt_values_ex()
        assert sec == 0 and abs(to_realtime(cycles, devs[0]) - t0) < 5_000_000
        assert a.qp.qp_state == e.IBV_QPS_RTS and a.qp.qp_num not in (0, 1, b.qp.qp_num)
        assert 0 < a.qp.qp_num < 1 << 24

        b.post_recv(0)
        flow_label = 0xABCDE
        ah = a.ah("127.0.0.3", flow_label, hop_limit=17)
        payload = b"probe-payload-123"
        a.send(ah, b.qp.qp_num, payload, wr_id=4242)
        (tx,) = a.poll()
        assert (tx["status"], tx["opcode"], tx["wr_id"]) == (e.IBV_WC_SUCCESS, e.IBV_WC_SEND, 4242)
        (rx,) = b.poll()
        assert (rx["status"], rx["opcode"], rx["wr_id"]) == (e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 1000)
        assert rx["byte_len"] == 40 + len(payload)
        assert rx["src_qp"] == a.qp.qp_num and rx["qp_num"] == b.qp.qp_num
        assert rx["wc_flags"] & e.IBV_WC_GRH
        data = b.mr.read(rx["byte_len"], 0)
        grh, ip = data[:20], data[20:40]
        assert grh == bytes(20)
        ver_ihl, _tos, total, _id, _frag, ttl, proto, _csum, src, dst = struct.unpack("!BBHHHBBH4s4s", ip)
        assert (ver_ihl, ttl, proto) == (0x45, 17, 17)
        assert total == 20 + 8 + 12 + 8 + len(payload) + 4  # IPv4 + UDP + BTH + DETH + payload + ICRC
        assert (socket.inet_ntoa(src), socket.inet_ntoa(dst)) == ("127.0.0.2", "127.0.0.3")
        assert sum(struct.unpack("!10H", ip)) % 0xFFFF == 0  # a valid header checksum
        assert data[40:] == payload
        assert fabric.last_rx["udp_sport"] == sport_for(flow_label) == 0xFCF4
        # completion stamps: each NIC's own clock, mapped back to realtime: a loopback-small one-way delay
        owd = to_realtime(rx["ts"], devs[1]) - to_realtime(tx["ts"], devs[0])
        assert 0 <= owd < 5_000_000, owd
        assert abs(to_realtime(tx["ts"], devs[0]) - time.time_ns()) < 1e9

        # a bad qkey is dropped and counted, not delivered; so is a datagram with no receive posted
        b.post_recv(1)
        a.send(ah, b.qp.qp_num, b"wrong key", wr_id=1, qkey=QKEY + 1)
        assert a.poll()[0]["status"] == e.IBV_WC_SUCCESS  # UD: the sender cannot tell
        deadline = time.monotonic() + 2
        while not fabric.stats["rx_bad_qkey"] and time.monotonic() < deadline:
            assert b.poll(timeout=0.01) == []
        assert fabric.stats["rx_bad_qkey"] == 1
        a.send(ah, b.qp.qp_num, b"uses the last receive", wr_id=2)
        a.send(ah, b.qp.qp_num, b"finds none", wr_id=3)
        assert [c["wr_id"] for c in a.poll(2)] == [2, 3]
        assert [c["wr_id"] for c in b.poll(2, timeout=0.3)] == [1001]
        assert fabric.stats["rx_no_wr"] == 1 and fabric.stats["delivered"] == 2

        # an empty CQ: ENOENT, and end_poll must not follow it
        assert b.cq.start_poll(pv.cq.PollCqAttr()) == errno.ENOENT
        with pytest.raises(pv.pyverbs_error.PyverbsError):
            b.cq.end_poll()
    finally:
        a.close()
        b.close()


def test_send_queue_limits_and_cq_flags(pv, two_devices):
    e, err = pv.e, pv.pyverbs_error
    a = Endpoint(pv, "fake_a", max_send_wr=2)
    try:
        ah = a.ah("127.0.0.3", 1)
        a.send(ah, 0x123, b"one", wr_id=1)
        a.send(ah, 0x123, b"two", wr_id=2)
        with pytest.raises(err.PyverbsRDMAError) as full:
            a.send(ah, 0x123, b"three", wr_id=3)
        assert full.value.error_code == errno.ENOMEM
        assert [c["wr_id"] for c in a.poll(1)] == [1]  # polling a completion frees its slot
        a.send(ah, 0x123, b"three", wr_id=3)
        assert pv._fabric.stats["sent"] == 3
        # a QP short of RTS refuses sends
        cap = pv.qp.QPCap(max_send_wr=4)
        fresh = pv.qp.QP(a.pd, pv.qp.QPInitAttr(scq=a.cq, rcq=a.cq, cap=cap))
        assert fresh.qp_state == e.IBV_QPS_RESET
        swr = pv.wr.SendWR(num_sge=1, sg=[pv.wr.SGE(a.mr.buf, 8, a.mr.lkey)])
        swr.set_wr_ud(ah, 0x123, QKEY)
        with pytest.raises(err.PyverbsRDMAError) as not_rts:
            fresh.post_send(swr)
        assert not_rts.value.error_code == errno.EINVAL
        with pytest.raises(err.PyverbsRDMAError) as rc_qp:
            pv.qp.QP(a.pd, pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=cap))
        assert rc_qp.value.error_code == errno.EOPNOTSUPP
        # no wall-clock completion stamps on this NIC; raw stamps only where asked for
        with pytest.raises(err.PyverbsRDMAError) as wallclock:
            pv.cq.CQEX(a.ctx, pv.cq.CqInitAttrEx(wc_flags=e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
        assert wallclock.value.error_code == errno.EOPNOTSUPP
        plain = pv.cq.CQEX(a.ctx, pv.cq.CqInitAttrEx(wc_flags=e.IBV_WC_STANDARD_FLAGS))
        qp2 = pv.qp.QP(a.pd, pv.qp.QPInitAttr(scq=plain, rcq=plain, cap=cap), pv.qp.QPAttr())
        swr = pv.wr.SendWR(wr_id=77, num_sge=1, sg=[pv.wr.SGE(a.mr.buf, 8, a.mr.lkey)])
        swr.set_wr_ud(ah, 0x123, QKEY)
        qp2.post_send(swr)
        assert plain.start_poll(pv.cq.PollCqAttr()) == 0
        assert plain.wr_id == 77 and plain.read_byte_len() == 0
        with pytest.raises(err.PyverbsError):
            plain.read_timestamp()
        plain.end_poll()
        # the plain CQ and its WC objects
        cq = pv.cq.CQ(a.ctx, 8)
        qp3 = pv.qp.QP(a.pd, pv.qp.QPInitAttr(scq=cq, rcq=cq, cap=cap, sq_sig_all=0), pv.qp.QPAttr())
        for wr_id, flags in ((5, 0), (6, e.IBV_SEND_SIGNALED)):  # the first is unsignaled: no completion
            swr = pv.wr.SendWR(wr_id=wr_id, num_sge=1, sg=[pv.wr.SGE(a.mr.buf, 8, a.mr.lkey)], send_flags=flags)
            swr.set_wr_ud(ah, 0x123, QKEY)
            qp3.post_send(swr)
        n, wcs = cq.poll(num_entries=4)
        assert n == 1 and (wcs[0].wr_id, wcs[0].status, wcs[0].opcode, wcs[0].qp_num) == (6, 0, e.IBV_WC_SEND,
                                                                                           qp3.qp_num)
        assert cq.poll() == (0, [])
    finally:
        a.close()


# -- 3. loss injection ----------------------------------------------------------------------------------
def test_loss_on_one_source_port_only(pv, two_devices):
    conf, devs = two_devices
    fabric = pv._fabric
    a, b = Endpoint(pv, "fake_a", max_send_wr=64), Endpoint(pv, "fake_b")
    try:
        lossy_fl, clean_fl = 0x00123, 0x00456
        # written while the devices are open: the fake re-reads its configuration
        write_fabric(conf, devs, loss=[{"src": "127.0.0.2", "dst": "127.0.0.3", "udp_sport": sport_for(lossy_fl),
                                        "rate": 1.0}])
        for slot in range(30):
            b.post_recv(slot)
        lossy, clean = a.ah("127.0.0.3", lossy_fl), a.ah("127.0.0.3", clean_fl)
        for i in range(20):
            a.send(lossy, b.qp.qp_num, b"lossy %d" % i, wr_id=i)
            a.send(clean, b.qp.qp_num, b"clean %d" % i, wr_id=100 + i)
        assert len(a.poll(40)) == 40  # every send completes: the loss is on the wire
        got = b.poll(40, timeout=0.5)
        assert len(got) == 20 and all(c["status"] == 0 for c in got)
        assert {r["udp_sport"] for r in list(fabric.rx_log)} == {sport_for(clean_fl)}
        assert fabric.stats["lost"] == 20
        assert all(b.mr.read(5, (c["wr_id"] - 1000) * b.slot + 40) == b"clean" for c in got)
    finally:
        a.close()
        b.close()


# -- 4. two processes -----------------------------------------------------------------------------------
RECEIVER = textwrap.dedent(r'''
    import json, sys, time
    import pyverbs.enums as e
    from pyverbs import cq, device, mr, pd, qp, wr
    ctx = device.Context(name="fake_b")
    p = pd.PD(ctx)
    c = cq.CQEX(ctx, cq.CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP))
    attr = qp.QPAttr()
    attr.qkey = int(sys.argv[1])
    q = qp.QP(p, qp.QPInitAttr(scq=c, rcq=c, cap=qp.QPCap(max_recv_wr=4)), attr)
    m = mr.MR(p, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    q.post_recv(wr.RecvWR(wr_id=5, num_sge=1, sg=[wr.SGE(m.buf, 4096, m.lkey)]))
    print(json.dumps({"qpn": q.qp_num}), flush=True)
    deadline = time.monotonic() + 8
    poll = cq.PollCqAttr()
    while time.monotonic() < deadline:
        if c.start_poll(poll) == 0:
            out = {"status": c.status, "wr_id": c.wr_id, "src_qp": c.read_src_qp(), "byte_len": c.read_byte_len()}
            c.end_poll()
            out["data"] = m.read(out["byte_len"], 0).hex()
            print(json.dumps(out), flush=True)
            break
        time.sleep(0.002)
    else:
        print(json.dumps({"timeout": True}), flush=True)
''')


def test_two_processes(pv, two_devices):
    conf, devs = two_devices
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(FAKE), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(QKEY)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    a = None
    try:
        ready = proc.stdout.readline()
        assert ready, proc.stderr.read()
        rqpn = json.loads(ready)["qpn"]
        a = Endpoint(pv, "fake_a")
        with pytest.raises(pv.pyverbs_error.PyverbsRDMAError):  # the other process owns fake_b's wire
            Endpoint(pv, "fake_b")
        a.send(a.ah("127.0.0.3", 0x777), rqpn, b"across processes", wr_id=9)
        assert a.poll()[0]["status"] == pv.e.IBV_WC_SUCCESS
        got = json.loads(proc.stdout.readline())
        assert got.get("timeout") is None, proc.stderr.read()
        assert (got["status"], got["wr_id"], got["src_qp"]) == (0, 5, a.qp.qp_num)
        assert got["byte_len"] == 40 + len(b"across processes")
        assert bytes.fromhex(got["data"])[40:] == b"across processes"
        assert proc.wait(timeout=5) == 0
    finally:
        if a is not None:
            a.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- 5. no devices ----------------------------------------------------------------------------------------
def test_no_devices_without_a_fabric(pv, monkeypatch, tmp_path):
    err = pv.pyverbs_error
    monkeypatch.delenv("NMS_FAKE_VERBS", raising=False)
    with pytest.raises(err.PyverbsRDMAError, match="^Failed to get devices list$"):
        pv.device.get_device_list()
    with pytest.raises(err.PyverbsRDMAError):
        pv.device.Context(name="fake_a")
    with pytest.raises(err.PyverbsUserError, match="Device name must be provided"):
        pv.device.Context()
    conf = tmp_path / "empty.json"
    write_fabric(conf, [])
    monkeypatch.setenv("NMS_FAKE_VERBS", str(conf))
    with pytest.raises(err.PyverbsRDMAError, match="Failed to get devices list"):
        pv.device.get_device_list()
    write_fabric(conf, [device_entry("fake_x", "127.0.0.4")])  # re-read: now there is one
    assert [d.name for d in pv.device.get_device_list()] == [b"fake_x"]
    with pytest.raises(err.PyverbsRDMAError, match="Failed to find device nope"):
        pv.device.Context(name="nope")

