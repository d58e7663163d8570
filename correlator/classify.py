"""Classification: localized elements + switch evidence -> what kind of fault, with its evidence.

* down paths (probes only, before any SNMP poll) -> link_down / nic_down / device_down; the same
  element with >= 2 down episodes per path in the context, or flapping per the switches ->
  link_flapping (a flapping NIC is its access link flapping).
* a lossy directed link -> congestion when it also inflates delay (or did within the last 30 s:
  senders back off and the queue may leave the delay while it still drops), or its egress queue drops or
  ECN-marks (the switch's own account of an overrun: congestion whatever else the counters say), or
  its egress is hot (utilization >= threshold) or discarding and no error counters; otherwise
  corrupting_link (silent loss at low utilization, and/or errors). The queues that dropped are in
  the evidence (`queues`, and `queue_drops_ps` / `ecn_marks_ps` in `rates`).
* an inflating directed link -> congestion; path_imbalance instead when it is the hot one of a
  switch's parallel uplinks (hot / cold utilization >= imbalance_ratio, hot >= imbalance_min_utilization),
  the hash collision being the cause.
* switch evidence alone: an end oper down (link_down; nic_down on a NIC's access link), flapping per
  LinkEvent (link_flapping),
  sustained input errors (corrupting_link), sustained egress queue drops or marks (congestion, in
  the direction the queue sends), MTU differing across a link (mtu_mismatch), LLDP
  contradicting the inventory (miscabling). Elements already explained by probes are not repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from correlator.evidence import SwitchView
from correlator.fabric import FabricIndex, fmt_end
from correlator.localize import Pick
from correlator.paths import Geometry
from nms.config.models import CorrelatorConfig, Thresholds

SEVERITY = {"link_down": "critical", "nic_down": "critical", "device_down": "critical",
            "link_flapping": "major", "corrupting_link": "major", "congestion": "minor",
            "path_imbalance": "minor", "mtu_mismatch": "warning", "miscabling": "warning",
            "partial_blackhole": "major"}


@dataclass
class Draft:
    kind: str
    element: str
    element_kind: str
    confidence: float
    summary: str
    eid: int | None = None  # element id in the geometry's E space (paths crossing it), if any
    direction: str | None = None
    evidence: dict = field(default_factory=dict)
    paths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def element_name(e: int, geo: Geometry, index: FabricIndex) -> tuple[str, str]:
    if e < geo.L:
        return index.name(e), "link"
    if e < geo.L + geo.N:
        host, nic = index.nics[e - geo.L]
        return f"{host}:{nic}", "nic"
    return index.devices[e - geo.L - geo.N], "device"


def _confirmed(e: int, geo: Geometry, index: FabricIndex, view: SwitchView) -> bool:
    if e < geo.L:
        return view.link_down(e)
    if e < geo.L + geo.N:
        nic = index.nics[e - geo.L]
        o = view.oper(nic)
        access = index.nic_access.get(nic)
        return (o is not None and o[0] == "down") or (access is not None and view.link_down(access))
    device = index.devices[e - geo.L - geo.N]
    if index.reachable.get(device) is False:
        return True
    links = index.links_of(device)
    return bool(links) and all(view.link_down(lid) for lid in links)


def state_priority(geo: Geometry, index: FabricIndex, view: SwitchView, candidates: np.ndarray) -> np.ndarray:
    """Tie-break of the down cover: switch-confirmed first, then NIC > switch > link."""
    prio = np.ones(geo.L + geo.N + geo.D)
    prio[geo.L:geo.L + geo.N] = 3
    prio[geo.L + geo.N:] = 2
    for e in np.flatnonzero(candidates):
        if _confirmed(int(e), geo, index, view):
            prio[e] += 10
    return prio


def state_findings(down: list[Pick], episodes: list[Pick], stats, geo: Geometry, index: FabricIndex,
                   view: SwitchView) -> list[Draft]:
    out: dict[tuple[str, str], Draft] = {}
    through = np.diff(geo.ET.indptr)
    for pick, now_down in [(p, True) for p in down] + [(p, False) for p in episodes]:
        e = pick.element
        name, ekind = element_name(e, geo, index)
        nic = index.nics[e - geo.L] if ekind == "nic" else None
        lid = e if ekind == "link" else index.nic_access.get(nic) if nic else None
        cycles = int(np.median(stats.episodes[pick.paths])) if len(pick.paths) else 0
        if lid is not None and (cycles >= 2 or view.flapping(lid)):
            kind, name, ekind, eid = "link_flapping", index.name(lid), "link", lid
        elif now_down:
            kind, eid = {"link": "link_down", "nic": "nic_down", "device": "device_down"}[ekind], e
        else:
            continue  # one episode, over: nothing to report
        if (kind, name) in out:
            continue
        n = len(pick.paths)
        confirmed = _confirmed(e, geo, index, view)
        alts = [element_name(a, geo, index)[0] for a in pick.alternatives]
        same_thing = {index.name(lid)} if nic and lid is not None else set()
        if lid is not None and ekind == "link":  # the NIC of an access link is the same thing
            same_thing |= {f"{h}:{p}" for h, p in index.links[lid] if (h, p) in index.nic_id}
        doubt = [a for a in alts if a not in same_thing]
        conf = 0.97 if confirmed else 0.9 if n >= 3 else 0.7 if n == 2 else 0.5
        if doubt and not confirmed:
            conf /= 1 + len(doubt)
        evidence = {"paths_down" if now_down else "paths_with_episodes": n,
                    "paths_through": int(through[e]), "down_episodes": cycles,
                    "switch_confirms": confirmed}
        if lid is not None:
            evidence["oper"] = view.link_oper(lid)
            if kind == "link_flapping":
                evidence["switch_flaps"] = view.flaps(lid)
        if doubt:
            evidence["alternatives"] = doubt
        what = {"link_flapping": f"link {name} is flapping ({cycles} down episodes in the context)",
                "link_down": f"link {name} is down", "nic_down": f"NIC {name} is down",
                "device_down": f"switch {name} is down"}[kind]
        out[(kind, name)] = Draft(kind, name, ekind, round(conf, 3),
                                  f"{what}: {n} probe paths fail through it", eid, None, evidence, pick.paths)
    return list(out.values())


def _imbalance(index: FabricIndex, view: SwitchView, t: Thresholds, config: CorrelatorConfig,
               inflating: set[int]) -> dict[int, dict]:
    """Hot directed uplink -> evidence, for switches whose parallel uplinks are unevenly loaded."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for lid in range(len(index.links)):
        ends = index.is_uplink(lid)
        if ends is None:
            continue
        did = index.into(lid, ends[1])
        util = view.direction_rates(did).get("utilization")
        if util is not None:
            groups.setdefault(ends[0][0], []).append((did, util))
    out = {}
    for device, ups in groups.items():
        if len(ups) < 2:
            continue
        hot, cold = max(ups, key=lambda u: u[1]), min(ups, key=lambda u: u[1])
        ratio = hot[1] / max(cold[1], 0.01)
        # the hot uplink must carry real load AND inflate delay (a busy uplink feeding a bottleneck
        # elsewhere is not the problem; a slow link with pinned load is congestion, not a hash issue)
        busy = hot[1] >= config.imbalance_min_utilization
        if ratio >= config.imbalance_ratio and busy and hot[0] in inflating:
            out[hot[0]] = {"switch": device, "ratio": round(ratio, 2),
                           "uplinks": {index.dname(d): round(u, 3) for d, u in sorted(ups)}}
    return out


def _inflates_too(lp: Pick | None, infl_by: dict[int, Pick]) -> bool:
    """Whether the round-trip delay inflates on a direction the loss could as well be on: a queue
    that drops and delays, not a corrupting link."""
    return lp is not None and any(d in infl_by for d in lp.alternatives)


def _queued(did: int, lp: Pick | None, queued_lately: set[int]) -> bool:
    """The link (either way: inflation is a round trip) or a direction the loss could as well be on
    queued lately."""
    return bool({did, did ^ 1, *(lp.alternatives if lp is not None else ())} & queued_lately)


def directed_findings(loss: list[Pick], inflation: list[Pick], index: FabricIndex, view: SwitchView,
                      t: Thresholds, config: CorrelatorConfig, queued_lately: set[int] = frozenset()) -> list[Draft]:
    """`queued_lately`: the directed links whose round trip inflated in the last seconds (a queue):
    their loss is congestion, also on a step whose delay no longer shows it (senders backed off)."""
    loss_by = {p.element: p for p in loss}
    infl_by = {p.element: p for p in inflation}
    imbalanced = _imbalance(index, view, t, config, set(infl_by))
    out: dict[tuple[str, str], Draft] = {}
    for did in sorted(set(loss_by) | set(infl_by) | set(imbalanced), key=lambda d: -len(
            (loss_by.get(d) or infl_by.get(d) or Pick(d, np.zeros(0))).paths)):
        lp, ip = loss_by.get(did), infl_by.get(did)
        # one link losing one way and inflating the other: one congestion finding, in the loss's
        # direction (drops are one-way evidence, the inflation is a round trip)
        if lp is None and ip is not None and did ^ 1 in loss_by:
            continue
        if lp is not None and ip is None:
            ip = infl_by.get(did ^ 1)
        rates = view.direction_rates(did)
        errors = rates.get("errors_ps", 0.0) > 0
        evidence: dict = {"rates": rates}
        paths = np.union1d(lp.paths if lp else [], ip.paths if ip else []).astype(np.int64)
        alts: list[int] = []
        conf = 0.5
        if lp is not None:
            evidence["loss"] = lp.stats
            alts += lp.alternatives
            conf = min(0.99, 0.6 + 0.03 * max(0.0, -lp.stats["log10_p"] - 6))
        if ip is not None:
            evidence["delay"] = ip.stats
            alts += ip.alternatives
            frac = ip.stats["paths_inflated"] / max(ip.stats["paths_judged"], 1)
            conf = max(conf, 0.5 + 0.4 * frac)
        if did in imbalanced:
            kind = "path_imbalance"
            evidence["imbalance"] = imbalanced[did]
            conf = max(conf, 0.8)
        elif (ip is not None or view.queueing(rates) or (view.congested(rates) and not errors)
              or _inflates_too(lp, infl_by) or (not errors and _queued(did, lp, queued_lately))):
            kind = "congestion"
            if view.congested(rates):
                conf = min(0.99, conf + 0.1)
        else:
            kind = "corrupting_link"
            if errors:
                conf = min(0.99, conf + 0.1)
        name, direction, used = index.name(did >> 1), index.dname(did), did
        if did ^ 1 in alts:  # both directions cross exactly the same paths (an access link): link certain
            evidence["directions"] = sorted({direction, index.dname(did ^ 1)})
            alts = [a for a in alts if a != did ^ 1]
            other_rates = view.direction_rates(did ^ 1)
            other_errors = other_rates.get("errors_ps", 0.0) > 0
            this_hot, other_hot = view.congested(rates), view.congested(other_rates)
            if kind != "congestion" and errors != other_errors:  # error counters (a NIC's, a port's) say which way
                if other_errors:
                    direction, evidence["rates"], used = index.dname(did ^ 1), other_rates, did ^ 1
                errors = True
                evidence["direction_by"] = "error counters"
            elif kind == "congestion" and this_hot != other_hot:  # the switch port's load says which way
                if other_hot:
                    direction, evidence["rates"], used = index.dname(did ^ 1), other_rates, did ^ 1
                evidence["direction_by"] = "utilization"
            else:
                direction = None
        egress = index.ends(used)[0]
        if queues := view.queues(egress):
            evidence["queues"] = {fmt_end(egress): queues}
        if alts:
            evidence["alternatives"] = sorted({index.dname(a) for a in alts})
            conf /= 1 + len(evidence["alternatives"])
        if (kind, name) in out:  # the other direction too: keep the first (most paths), note this one
            out[(kind, name)].evidence.setdefault("also_direction", direction)
            continue
        what = {"congestion": "congestion", "corrupting_link": "silent loss" if not errors else "corruption",
                "path_imbalance": "ECMP imbalance (hot uplink)"}[kind]
        detail = f", {lp.stats['loss_pct']}% loss" if lp else ""
        detail += f", +{ip.stats['inflation_us']} us round trip" if ip else ""
        if kind == "congestion" and view.queueing(evidence["rates"]):
            detail += f", its egress queue drops {evidence['rates'].get('queue_drops_ps', 0):.0f} packets/s"
        out[(kind, name)] = Draft(kind, name, "link", round(conf, 3), f"{what} on {direction or name}{detail}",
                                  did >> 1, direction, evidence, paths)
    return list(out.values())


def switch_status_down(index: FabricIndex, view: SwitchView) -> set[int]:
    """Links whose switch-side status says down (a port's oper status, the topology's state)."""
    ctx = view.ctx
    ends = set(ctx.port_samples) | set(ctx.link_events) | set(ctx.nic_samples)
    lids = {index.by_end[e] for e in ends if e in index.by_end} | set(index.topo)
    return {lid for lid in lids if view.link_down(lid)}


RECOVERY_S = 15  # a dead switch's links still down this long after some came back are its own


def dead_switches(index: FabricIndex, down: set[int], covered: set[str], dead_at: dict[str, int],
                  now_s: int) -> list[Draft]:
    """A switch every one of whose links (two or more) the switch status says down is one failure,
    the switch, not as many link failures: one device_down whose incident takes its links' as
    children (correlator/incidents.py). The probes may not say so: with routing failing over, flows
    whose traces still cross the dead switch answer through another one until they are traced again.
    While it comes back (its links' ends are polled one switch at a time) the links still down stay
    its own for RECOVERY_S: `dead_at` (device -> the last second all were down) is the caller's."""
    out = []
    for device, d in index.device_id.items():
        lids = index.links_of(device)
        if len(lids) < 2:
            continue
        n_down = sum(lid in down for lid in lids)
        if n_down == len(lids):
            dead_at[device] = now_s
        elif not n_down or now_s - dead_at.get(device, -RECOVERY_S - 1) > RECOVERY_S:
            continue
        if device in covered:  # the probes found it down
            continue
        eid = len(index.links) + len(index.nics) + d
        what = "" if n_down == len(lids) else f", coming back: {n_down} still down"
        out.append(Draft("device_down", device, "device", 0.9,
                         f"switch {device} is down: all {len(lids)} of its links are down (switch status){what}", eid,
                         None, {"links_down": n_down, "links": len(lids), "switch_confirms": True}))
    return out


def switch_findings(index: FabricIndex, view: SwitchView, covered: set[str], down: set[int]) -> list[Draft]:
    """Findings from switch-side evidence alone, for elements the probes did not already explain;
    `down`: the links the switch status says are down (switch_status_down)."""
    ctx = view.ctx
    ends = set(ctx.port_samples) | set(ctx.link_events) | set(ctx.port_rates) | set(ctx.nic_samples)
    lids = {index.by_end[e] for e in ends if e in index.by_end} | set(index.topo)
    out: list[Draft] = []
    nic_of = {lid: nic for nic, lid in index.nic_access.items()}
    for lid in sorted(lids):
        name = index.name(lid)
        a, b = index.links[lid]
        topo = index.topo.get(lid)
        if name in covered:
            pass
        elif lid in nic_of and lid in down:
            # an access port down is the NIC gone from the fabric (dark NIC or cut cable: the same to
            # every path), named as the probes name it, so both kinds of evidence meet in one incident
            nic = "{}:{}".format(*nic_of[lid])
            out.append(Draft("nic_down", nic, "nic", 0.8, f"NIC {nic} is down (switch status of {name})", None,
                             None, {"oper": view.link_oper(lid), "access_link": name}))
        elif view.flapping(lid):
            out.append(Draft("link_flapping", name, "link", 0.9, f"link {name} is flapping (switch counters)",
                             lid, None, {"switch_flaps": view.flaps(lid), "oper": view.link_oper(lid)}))
        elif lid in down:
            out.append(Draft("link_down", name, "link", 0.8, f"link {name} is down (switch status)", lid, None,
                             {"oper": view.link_oper(lid), "topology_state": topo.state if topo else None}))
        else:
            for _src, dst in ((a, b), (b, a)):
                if view.erroring(dst):
                    did = index.into(lid, dst)
                    out.append(Draft("corrupting_link", name, "link", 0.7,
                                     f"input errors on {fmt_end(dst)}", lid, index.dname(did),
                                     {"rates": view.direction_rates(did)}))
                    break
            else:
                for src, dst in ((a, b), (b, a)):
                    if view.queue_congested(src):
                        did = index.into(lid, dst)
                        rates = view.direction_rates(did)
                        out.append(Draft("congestion", name, "link", 0.7,
                                         f"congestion on {index.dname(did)}: its egress queue drops "
                                         f"{rates.get('queue_drops_ps', 0):.0f} packets/s", lid, index.dname(did),
                                         {"rates": rates, "queues": {fmt_end(src): view.queues(src)}}))
                        break
        ma, mb = view.mtu(a), view.mtu(b)
        if ma is not None and mb is not None and ma != mb:
            small, big = (a, b) if ma < mb else (b, a)
            out.append(Draft("mtu_mismatch", name, "link", 0.95,
                             f"MTU {max(ma, mb)} on {fmt_end(big)} vs {min(ma, mb)} on {fmt_end(small)}", lid,
                             f"{fmt_end(big)}->{fmt_end(small)}", {"mtu": {fmt_end(a): ma, fmt_end(b): mb}}))
        if topo is not None and topo.check == "miscabled":
            out.append(Draft("miscabling", name, "link", 0.95, f"cabling contradicts the inventory: {topo.expected}",
                             lid, None, {"seen_by": topo.seen_by, "expected": topo.expected}))
    return out
