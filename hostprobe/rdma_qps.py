"""The RDMA QPs of this host's NCCL processes, read from RDMA netlink (iproute2's `rdma -j resource show
qp`), not from NCCL: stock NCCL builds never tell the profiler a QP (net profiling is compiled out).

Each QP of a process the NCCL plugin reported (by pid) becomes an RdmaQp record: device, port, the
device's netdev and its address, local and remote QP number, type, state, the job and the
communicator ranks of that process, and the QP's RoCE v2 UDP source port. The service joins the two
ends of each connection across hosts (correlator/qp_join.py: my remote QPN is the peer's local QPN
and the other way round), which names each QP's peer rank and host.

The source port is the kernel's, `rdma_get_udp_sport()` of include/rdma/ib_verbs.h: the GRH flow
label folded to 14 bits over 0xC000, and when the flow label is 0 (NCCL passes 0) a flow label
computed from the two QP numbers. mlx5 (drivers/infiniband/hw/mlx5/qp.c, `mlx5_set_path_udp_sport`
for RC/UC/XRC QPs over a RoCE v2 GID when the modify sets the destination QPN) and rxe
(drivers/infiniband/sw/rxe/rxe_verbs.c, `rxe_modify_qp` on an address vector with a GRH) set it so;
`rdma` does not show the flow label, so 0 is assumed (a QP steered with a flow label or
`mlx5dv_modify_qp_udp_sport()` is not seen). See docs/nccl_plugin.md.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

ROCE_V2_PORT = 4791
UDP_SPORT_MIN = 0xC000  # IB_ROCE_UDP_ENCAP_VALID_PORT_MIN
FLOW_LABEL_MASK = 0xFFFFF  # IB_GRH_FLOWLABEL_MASK
CONNECTED_TYPES = ("RC", "UC", "XRC_INI", "XRC_TGT")  # the QP types with a remote QP (rqpn)


def calc_flow_label(lqpn: int, rqpn: int) -> int:
    """rdma_calc_flow_label(): the product of the two 24-bit QP numbers folded to 20 bits; symmetric,
    so both ends compute the same label."""
    v = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & FLOW_LABEL_MASK


def flow_label_to_udp_sport(fl: int) -> int:
    """rdma_flow_label_to_udp_sport(): the low 14 bits xor the high 6, over 0xC000."""
    low, high = fl & 0x03FFF, fl & 0xFC000
    low ^= high >> 14
    return (low | UDP_SPORT_MIN) & 0xFFFF


def roce_udp_sport(flow_label: int, lqpn: int, rqpn: int) -> int:
    """rdma_get_udp_sport(): the UDP source port of a RoCE v2 QP's packets."""
    if not flow_label:
        flow_label = calc_flow_label(lqpn, rqpn)
    return flow_label_to_udp_sport(flow_label)


class RdmaOutputError(ValueError):
    """`rdma -j` printed something this reader cannot use (the message names the entry and field)."""


@dataclass(frozen=True)
class Qp:
    device: str  # the RDMA device (ifname in rdma's JSON), e.g. mlx5_0
    port: int | None
    lqpn: int
    rqpn: int | None  # None: not connected (UD, GSI, or before RTR)
    type: str
    state: str
    pid: int | None  # None: a kernel QP
    comm: str | None

    @property
    def sport(self) -> int | None:
        """The RoCE v2 source port with flow label 0 (connected QPs only)."""
        if self.rqpn is None or self.type not in CONNECTED_TYPES:
            return None
        return roce_udp_sport(0, self.lqpn, self.rqpn)


def _load(text: str, what: str) -> list:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RdmaOutputError(f"{what}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, list):
        raise RdmaOutputError(f"{what}: expected a JSON list of objects, got {type(data).__name__}")
    return data


def _field(entry: dict, index: int, name: str, kind: type, required: bool = True) -> Any:
    value = entry.get(name)
    if value is None:
        if required:
            raise RdmaOutputError(f"qp entry {index}: field '{name}' is missing")
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RdmaOutputError(f"qp entry {index}: field '{name}' is {value!r}, not {kind.__name__}")
    return value


def parse_qps(text: str) -> list[Qp]:
    """`rdma -j resource show qp` (keys as iproute2's rdma/res-qp.c and rdma/res.c print them)."""
    out = []
    for index, entry in enumerate(_load(text, "rdma -j resource show qp")):
        if not isinstance(entry, dict):
            raise RdmaOutputError(f"qp entry {index}: not an object")
        out.append(Qp(device=_field(entry, index, "ifname", str), port=_field(entry, index, "port", int, False),
                      lqpn=_field(entry, index, "lqpn", int), rqpn=_field(entry, index, "rqpn", int, False),
                      type=_field(entry, index, "type", str), state=_field(entry, index, "state", str),
                      pid=_field(entry, index, "pid", int, False), comm=_field(entry, index, "comm", str, False)))
    return out


def parse_links(text: str) -> dict[tuple[str, int], str]:
    """`rdma -j link show` -> (device, port) -> netdev (rdma/link.c: ifname, port, netdev)."""
    out = {}
    for index, entry in enumerate(_load(text, "rdma -j link show")):
        if isinstance(entry, dict) and isinstance(entry.get("ifname"), str) and isinstance(entry.get("port"), int):
            if isinstance(entry.get("netdev"), str):
                out[(entry["ifname"], entry["port"])] = entry["netdev"]
        else:
            raise RdmaOutputError(f"link entry {index}: needs 'ifname' (string) and 'port' (integer)")
    return out


def run_rdma(args: list[str], rdma: str = "rdma", timeout: float = 5.0) -> str:
    """The output of `rdma -j ARGS`; RdmaUnavailable when there is no RDMA here (no tool, no RDMA
    netlink: a kernel without RDMA says "Failed to open NETLINK_RDMA socket")."""
    try:
        proc = subprocess.run([rdma, "-j", *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RdmaUnavailable(f"{rdma}: {e}") from None
    if proc.returncode != 0:
        raise RdmaUnavailable(f"{rdma} -j {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:200]}")
    return proc.stdout or "[]"


class RdmaUnavailable(RuntimeError):
    """No RDMA netlink here (or no `rdma` tool)."""


def qps_of(pids: set[int], rdma: str = "rdma") -> tuple[list[Qp], dict[tuple[str, int], str]]:
    """This host's QPs of the given processes, and the devices' netdevs."""
    qps = [q for q in parse_qps(run_rdma(["resource", "show", "qp"], rdma)) if q.pid in pids]
    links = parse_links(run_rdma(["link", "show"], rdma)) if qps else {}
    return qps, links


def qp_records(qps: list[Qp], links: dict[tuple[str, int], str], processes: dict[int, tuple[str | None, set]],
               host: str, addresses: dict[str, str], ts: int, paths=None) -> list:
    """NcclRdmaQp records of the QPs of the given processes (pid -> (job id, {(comm_id, rank)})), with
    each QP's traced path where `paths` (hostprobe/qp_trace.py QpTracer) has one."""
    from nms.records import NcclRdmaQp

    out = []
    for q in qps:
        if q.pid not in processes:
            continue
        job_id, ranks = processes[q.pid]
        netdev = links.get((q.device, q.port)) if q.port is not None else None
        out.append(NcclRdmaQp(host=host, job_id=job_id, device=q.device, lqpn=str(q.lqpn), ts=ts, port=q.port,
                              netdev=netdev, src_addr=addresses.get(netdev) if netdev else None, rqpn=q.rqpn,
                              type=q.type, state=q.state, pid=q.pid, comm=(q.comm or "")[:64] or None,
                              ranks=",".join(f"{c}:{r}" for c, r in sorted(ranks))[:4096], sport=q.sport,
                              **(paths.path_fields(q.device, q.lqpn, q.sport) if paths is not None else {})))
    return out


class QpReporter:
    """Every `interval` s: the QPs of the NCCL processes seen, as NcclRdmaQp records. A host without
    RDMA (no `rdma` tool, no RDMA netlink) is said once and skipped after."""

    def __init__(self, host: str, addresses: dict[str, str], interval: float = 10.0, rdma: str = "rdma",
                 tracer=None):
        self.host, self.addresses, self.interval, self.rdma = host, addresses, interval, rdma
        self.tracer = tracer  # hostprobe/qp_trace.py QpTracer: the QPs' own paths (None: not traced)
        self.unavailable: str | None = None
        self.last = 0.0

    def due(self, now: float) -> bool:
        return self.interval > 0 and self.unavailable is None and now - self.last >= self.interval

    def read(self, processes: dict[int, tuple[str | None, set]], now: float, ts: int) -> list:
        self.last = now
        if not processes:
            return []
        try:
            qps, links = qps_of(set(processes), self.rdma)
        except RdmaUnavailable as e:
            self.unavailable = str(e)
            return []
        records = qp_records(qps, links, processes, self.host, self.addresses, ts, self.tracer)
        if self.tracer is not None:
            self.tracer.start(now)  # the QPs the service has joined since, traced before the next read
        return records
