"""The two ends of each RDMA connection of a job, from the agents' QP lists (NcclRdmaQp records).

A connected QP names only its remote QP number (RDMA netlink shows no remote GID). Its other end is
the QP whose local number is my remote one and whose remote number is my local one (another host,
another device, or a loopback connection on the same device); among the job's QPs that pair is unique
in practice, and a pair found twice is left out rather than guessed. The ranks follow from the two
processes: the communicator both hold a rank of (when they share several, the QP's communicator is
not known from the host, and only the hosts are joined).

`agrees_with_net_events` checks the join against what an NCCL built with net profiling reports
itself (the proxy steps' `connection` is the sending QP's number): every QP the steps name must be
a joined QP of that rank, towards that peer.
"""

from __future__ import annotations

from collections.abc import Iterable

from nms.records import NcclRdmaQp, QpRoute


def _ranks(qp: NcclRdmaQp) -> dict[str, int]:
    out = {}
    for item in filter(None, qp.ranks.split(",")):
        comm, _, rank = item.rpartition(":")
        out[comm] = int(rank)
    return out


def join_qps(qps: Iterable[NcclRdmaQp]) -> list[QpRoute]:
    """Each connected QP with its peer's end (both directions appear, one route per end)."""
    latest: dict[tuple[str, str, str], NcclRdmaQp] = {}
    for qp in qps:
        key = (qp.host, qp.device, qp.lqpn)
        if key not in latest or latest[key].ts <= qp.ts:
            latest[key] = qp
    by_pair: dict[tuple[int, int], list[NcclRdmaQp]] = {}
    for qp in latest.values():
        if qp.rqpn is not None:
            by_pair.setdefault((int(qp.lqpn), qp.rqpn), []).append(qp)
    routes = []
    for qp in latest.values():
        if qp.rqpn is None:
            continue
        ends = [p for p in by_pair.get((qp.rqpn, int(qp.lqpn)), [])
                if (p.host, p.device, p.lqpn) != (qp.host, qp.device, qp.lqpn) and p.job_id == qp.job_id]
        if len(ends) != 1:
            continue  # the peer's agent has not reported it (yet), or the pair is not unique
        peer = ends[0]
        mine, theirs = _ranks(qp), _ranks(peer)
        common = sorted(set(mine) & set(theirs))
        comm = common[0] if len(common) == 1 else None
        routes.append(QpRoute(host=qp.host, device=qp.device, lqpn=int(qp.lqpn), rqpn=qp.rqpn, peer_host=peer.host,
                              peer_device=peer.device, comm_id=comm, rank=mine.get(comm) if comm else None,
                              peer_rank=theirs.get(comm) if comm else None, sport=qp.sport, path_id=qp.path_id))
    return sorted(routes, key=lambda r: (r.host, r.device, r.lqpn))


def agrees_with_net_events(routes: Iterable[QpRoute], steps: Iterable) -> list[str]:
    """Disagreements between the join and the proxy steps' own QP numbers (NcclProxyStep or
    NcclStepStats with net 'ib'): empty when they agree."""
    known = {(r.host, r.comm_id, r.rank, r.lqpn): r for r in routes}
    problems = []
    for s in steps:
        if s.net != "ib" or s.connection is None:
            continue
        route = known.get((s.host, s.comm_id, int(s.rank), int(s.connection)))
        if route is None:
            problems.append(f"{s.host} rank {s.rank}: QP {s.connection} is not among the host's joined QPs")
        elif s.peer is not None and int(s.peer) != route.peer_rank:
            problems.append(f"{s.host} rank {s.rank}: QP {s.connection} goes to rank {route.peer_rank}, "
                            f"the step says {s.peer}")
    return problems
