"""The NCCL QPs' own paths on the fabric: which QPs (job, rank, peer, QP number) cross an element.

The agents trace each QP's RoCE v2 5-tuple (hostprobe/qp_trace.py) and report its forward hops on the
QP's NcclRdmaQp record. Here the latest record of each QP is kept; a job's QPs are joined with their
peers' ends (`qp_join.join_qps`: ranks, peer host and device), and each QP's forward hops are mapped
onto directed links by the probe paths' own machinery (`paths.route`: router addresses ->
InterfaceAddress ends -> links, plus both NICs' access links). The QP's NIC is its netdev on its
host (the agents name their NICs by netdev), else the inventory NIC with its address.

A finding on a link names the QPs whose route crosses it, in the finding's direction when it has
one; on a NIC, the QPs sending from or to it; on a switch, the QPs through it. Only traced QPs are
placed: a QP without hops (not traced yet) is on no fabric link beyond its two access links, which
it is known to cross anyway. A QP the agent has not reported for STALE_NS is forgotten (destroyed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from correlator.fabric import FabricIndex, Nic
from correlator.jobs_nccl import QP_STALE_NS
from correlator.paths import route
from correlator.qp_join import join_qps
from nms.records import NcclRdmaQp, QpRoute
from nms.topology import End

STALE_NS = QP_STALE_NS
MAX_QPS = 200_000
MAX_LISTED = 100  # QPs named in one finding's evidence


@dataclass(frozen=True)
class PlacedQp:
    route: QpRoute
    job_id: str
    links: frozenset[int]  # directed link ids of the QP's packets (its host -> the peer)
    nics: frozenset[Nic]
    devices: frozenset[str]

    def describe(self, index: FabricIndex) -> dict:
        r = self.route
        return {"job": self.job_id, "host": r.host, "device": r.device, "qpn": r.lqpn, "comm": r.comm_id,
                "rank": r.rank, "peer_host": r.peer_host, "peer_rank": r.peer_rank, "peer_qpn": r.rqpn,
                "sport": r.sport, "path_id": r.path_id}


class QpPaths:
    def __init__(self) -> None:
        self.latest: dict[tuple[str, str, str], NcclRdmaQp] = {}
        self._placed: list[PlacedQp] = []
        self._seen: tuple = ()
        self._changes = 0  # bumped when a QP's placement could change (a re-report alone does not)

    def add(self, r: NcclRdmaQp) -> None:
        key = (r.host, r.device, r.lqpn)
        old = self.latest.get(key)
        if old is None or r.ts >= old.ts:
            self.latest[key] = r
            if old is None or _placing(old) != _placing(r):
                self._changes += 1
        if len(self.latest) > MAX_QPS:
            for k in sorted(self.latest, key=lambda k: self.latest[k].ts)[:MAX_QPS // 10]:
                del self.latest[k]
            self._changes += 1

    def placed(self, index: FabricIndex, addresses: dict[str, End], addr_version: int,
               now_ns: int) -> list[PlacedQp]:
        """Every joined QP of a job with its directed links; rebuilt when QPs, links or addresses changed."""
        for key in [k for k, r in self.latest.items() if now_ns - r.ts > STALE_NS]:
            del self.latest[key]
            self._changes += 1
        version = (index.version, addr_version, self._changes)
        if version == self._seen:
            return self._placed
        self._seen = version
        jobs: dict[str, list[NcclRdmaQp]] = {}
        for r in self.latest.values():
            if r.job_id is not None:
                jobs.setdefault(r.job_id, []).append(r)
        out = []
        for job_id, qps in sorted(jobs.items()):
            for qr in join_qps(qps):
                own = self.latest.get((qr.host, qr.device, str(qr.lqpn)))
                peer = self.latest.get((qr.peer_host, qr.peer_device, str(qr.rqpn)))
                if own is None or peer is None:
                    continue
                src, dst = _nic(own, index), _nic(peer, index)
                if src is None or dst is None:
                    continue
                devices: set[int] = set()
                links = route(index, addresses, src, dst, own.fwd_hops, devices)
                for nic in (src, dst):
                    if (sw := index.nic_switch.get(nic)) is not None and sw in index.device_id:
                        devices.add(index.device_id[sw])
                out.append(PlacedQp(qr, job_id, frozenset(links), frozenset({src, dst}),
                                    frozenset(index.devices[d] for d in devices)))
        self._placed = out
        return out

    @staticmethod
    def crossing(placed: Iterable[PlacedQp], index: FabricIndex, element_kind: str, element: str,
                 eid: int | None, direction: str | None) -> list[PlacedQp]:
        """The QPs whose packets cross a finding's element (a link in its direction, when it has one)."""
        if element_kind == "link" and eid is not None:
            want = {2 * eid, 2 * eid + 1}
            if direction is not None:
                want = {d for d in want if index.dname(d) == direction} or want
            return [q for q in placed if q.links & want]
        if element_kind == "nic":
            host, _, nic = element.partition(":")
            return [q for q in placed if (host, nic) in q.nics]
        if element_kind == "device":
            return [q for q in placed if element in q.devices]
        return []


def _placing(r: NcclRdmaQp) -> tuple:
    """What a QP's placement depends on."""
    return r.job_id, r.rqpn, r.ranks, r.netdev, r.src_addr, r.fwd_hops, r.sport, r.path_id


def _nic(r: NcclRdmaQp, index: FabricIndex) -> Nic | None:
    if r.netdev is not None and (r.host, r.netdev) in index.nic_id:
        return (r.host, r.netdev)
    nic = index.nic_by_address.get(r.src_addr) if r.src_addr else None
    return nic if nic is not None and nic[0] == r.host else None


def evidence(crossing: list[PlacedQp], index: FabricIndex) -> dict:
    """What a finding says of the QPs crossing its element: each QP (job, host, device, QP number,
    communicator, rank, peer host and rank, source port), how many, and the jobs' rank pairs."""
    listed = sorted(crossing, key=lambda q: (q.job_id, q.route.host, q.route.device, q.route.lqpn))
    return {"qps": [q.describe(index) for q in listed[:MAX_LISTED]], "qps_crossing": len(crossing)}
