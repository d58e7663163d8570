"""Partial blackholes: an element that drops some flows entirely (by hash, source port or destination)
while the other flows through it pass clean.

What the probes show: some (path, source port) flows at 100 % loss, other flows through the same
directed link answering after those died. The down cover (localize.cover_states) finds nothing:
every element a dead flow crosses is cleared by a live one. Here a dead flow (down now, its newest
window silent, not explained by a down element) is placed by its whole trace (one that reached the
peer and came back), or by the whole trace its source port had before (`Context.flow_route`: the
retrace of a dying flow goes silent at the drop and gets a new path id); a flow with no whole trace
blames nothing. It counts only if every directed link it crosses carries a flow that answered in a
window starting at least HOLD_S after the latest death through that link: a link that died passes
nothing afterwards, so its paths are left to the down cover (also while some of them are not yet
declared down), and no partial blackhole is claimed while a link dies. Then a greedy cover: the
directed link crossed by the most such dead flows (at least MIN_DEAD), ties to the larger dead
share, whose live flows lose little (< MAX_LIVE_LOSS: heavy uniform loss also silences a window now
and then, but its live flows lose as much). Links crossed by exactly the same dead flows cannot be
told apart by them: alternatives. Then the pick waits SETTLE_S after the last death, for more flows
to die (a second remote leaf's flows usually separate the links) and for the live counts behind the
share to settle: right after the deaths only the flows that already answered again count as live,
so the share first favours whichever link has the fewest fresh answers (an access link, the link on
the far side). A hash fault at the responder end shows why: every reply of one responder carries
the same address and port, so they die together and cross its access link, the far leaf's uplink
and the faulty one alike. Two or more picks that all touch one switch are that switch (a
switch-wide hash fault).
"""

from __future__ import annotations

import numpy as np

from correlator.classify import Draft
from correlator.context import NS, Context, PathStats, path_text
from correlator.fabric import FabricIndex
from correlator.paths import Geometry

MIN_DEAD = 2  # dead flows through a link before it is blamed (one flow localizes nothing)
HOLD_S = 1  # a live flow's answered window must start this long after the deaths (clock offsets)
FRESH_S = 3  # a dead flow's silent window must be this recent (no verdict from a path no longer probed)
MAX_LIVE_LOSS = 0.25
SETTLE_S = 4  # dead flows that other links carry too wait this long after their last death (see above)
MAX_LISTED = 32  # flows listed per side in the evidence


def _row(m, i: int) -> np.ndarray:
    return m.indices[m.indptr[i]:m.indptr[i + 1]]


def _flow_times(ctx: Context, now_s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per path: the newest second that answered (-1: none in the context), when it went silent,
    and whether its newest window is recent and silent."""
    P, C = ctx.P, ctx.C
    sec = ctx.sec[:P]
    valid = (sec >= now_s - ctx.span) & (sec <= now_s + 1) & (ctx.sent[:P] > 0)
    last_ok = np.where(valid & (ctx.recv[:P] > 0), sec, -1).max(axis=1)
    newest = np.where(valid, sec, -1).max(axis=1)
    first = np.where(valid, sec, np.iinfo(np.int64).max).min(axis=1)
    col = np.maximum(newest, 0) % C
    rows = np.arange(P)
    fresh = newest >= min(now_s, ctx.newest) - FRESH_S  # against the newest data (see Context.stats)
    silent_now = fresh & (ctx.recv[rows, col] == 0) & (ctx.sec[rows, col] == newest)
    dead_since = np.where(last_ok >= 0, last_ok + 1, first)
    return last_ok, dead_since, silent_now


def _flows(rows: np.ndarray, ctx: Context, geo: Geometry, route: dict[int, int], did: int | None) -> list[dict]:
    out = []
    for i in rows[:MAX_LISTED].tolist():
        flow: dict = {"path": path_text(ctx.keys[i]), "sport": ctx.path_sport.get(i)}
        if did is not None:
            r = route.get(i, i)
            fwd, rev = did in geo.fwd[r], did in geo.rev[r]
            flow["leg"] = "both" if fwd and rev else "fwd" if fwd else "rev" if rev else None
        out.append(flow)
    return sorted(out, key=lambda f: f["path"])


def _sports(rows: np.ndarray, ctx: Context) -> dict[str, list[int]]:
    """Source NIC -> the source ports of its flows (a port means something only with its source)."""
    out: dict[str, set[int]] = {}
    for i in rows.tolist():
        if (sport := ctx.path_sport.get(i)) is not None:
            out.setdefault("{}:{}".format(*ctx.keys[i][:2]), set()).add(sport)
    return {src: sorted(ports) for src, ports in sorted(out.items())}


def _known_route(ctx: Context, i: int) -> int | None:
    """The path whose geometry says where flow `i` goes: its own when its trace is whole, else the
    whole-traced path its source port took before (after a retrace, a dying flow's trace goes silent
    where it is dropped and gets a new path id); None when unknown: nothing is blamed on a guess."""
    if i in ctx.whole:
        return i
    sport = ctx.path_sport.get(i)
    return None if sport is None else ctx.flow_route.get((*ctx.keys[i][:4], sport))


def partial_findings(ctx: Context, geo: Geometry, index: FabricIndex, stats: PathStats, explained: np.ndarray,
                     now_ns: int) -> list[Draft]:
    if not ctx.P or geo.U is None:
        return []
    dead = stats.down & ~explained
    if dead.sum() < MIN_DEAD:  # the usual step: nothing more to compute
        return []
    now_s = now_ns // NS
    last_ok, dead_since, silent_now = _flow_times(ctx, now_s)
    dead &= silent_now
    if dead.sum() < MIN_DEAD:
        return []
    U, UT = geo.U, geo.UT
    route = {i: r for i in np.flatnonzero(dead).tolist() if (r := _known_route(ctx, i)) is not None and r < U.shape[0]}
    links_of = {i: _row(U, r).tolist() for i, r in route.items()}
    for i, r in route.items():  # a retraced flow that never answered died when its former path did
        if last_ok[i] < 0 and last_ok[r] >= 0:
            dead_since[i] = dead_since[r]
    dead_on: dict[int, list[int]] = {}
    for i, links in links_of.items():
        for e in links:
            dead_on.setdefault(e, []).append(i)
    live: dict[int, np.ndarray] = {}
    for e, flows in dead_on.items():
        rows = _row(UT, e)
        cut = dead_since[flows].max() + HOLD_S
        live[e] = rows[~stats.down[rows] & (last_ok[rows] >= cut)]
    # a flow through a link nothing passes any more (a link that died) is not partial
    partial = {i for i, links in links_of.items() if all(len(live[e]) for e in links)}
    alive = set(partial)
    picks: list[tuple[int, np.ndarray, list[int]]] = []
    while True:
        cands = []
        for e, flows in dead_on.items():
            d = np.array(sorted(i for i in flows if i in alive), np.int64)
            lv = live[e]
            if len(d) < MIN_DEAD:
                continue
            sent = stats.sent_recent[lv].sum()
            if sent and stats.lost_recent[lv].sum() / sent >= MAX_LIVE_LOSS:
                continue
            n_partial = sum(i in partial for i in flows)
            cands.append(((len(d), n_partial / (n_partial + len(lv))), e, d))
        if not cands:
            break
        _, e, d = max(cands, key=lambda c: c[0])
        alts = [a for _, a, da in cands if a != e and np.array_equal(da, d)]
        alive -= set(d.tolist())
        if any(a >> 1 != e >> 1 for a in alts) and now_s < dead_since[d].max() + SETTLE_S:
            continue  # other links carry the same dead flows: wait for more deaths or settled live counts
        picks.append((e, d, alts))
    drafts = [_link_draft(e, d, alts, live[e], ctx, geo, route, index, dead_since, now_s) for e, d, alts in picks]
    return _merged(drafts, picks, index, geo, ctx, route, live, dead_since, now_s)


def _evidence(dead_rows: np.ndarray, live_rows: np.ndarray, ctx: Context, geo: Geometry, route: dict[int, int],
              did: int | None, dead_since: np.ndarray, now_s: int) -> dict:
    n_dead, n_live = len(dead_rows), len(live_rows)
    return {"flows_dead": n_dead, "flows_live": n_live, "dead_pct": round(100 * n_dead / (n_dead + n_live), 1),
            "dead_for_s": int(now_s - dead_since[dead_rows].min()),
            "sports_dead": _sports(dead_rows, ctx), "sports_live": _sports(live_rows, ctx),
            "dead": _flows(dead_rows, ctx, geo, route, did), "live": _flows(live_rows, ctx, geo, route, did)}


def _link_draft(e: int, dead_rows: np.ndarray, alts: list[int], live_rows: np.ndarray, ctx: Context, geo: Geometry,
                route: dict[int, int], index: FabricIndex, dead_since: np.ndarray, now_s: int) -> Draft:
    evidence = _evidence(dead_rows, live_rows, ctx, geo, route, e, dead_since, now_s)
    direction: str | None = index.dname(e)
    if e ^ 1 in alts:  # both directions of the link cross the same flows (an access link): link certain
        evidence["directions"] = sorted({direction, index.dname(e ^ 1)})
        alts = [a for a in alts if a != e ^ 1]
        direction = None
    conf = min(0.95, 0.7 + 0.05 * (len(dead_rows) - MIN_DEAD))
    if alts:
        evidence["alternatives"] = sorted(index.dname(a) for a in alts)
        conf /= 1 + len(alts)
    summary = (f"partial blackhole on {direction or index.name(e >> 1)}: {len(dead_rows)} of "
               f"{len(dead_rows) + len(live_rows)} probe flows through it get nothing across, the others pass")
    return Draft("partial_blackhole", index.name(e >> 1), "link", round(conf, 3), summary, e >> 1, direction,
                 evidence, dead_rows.astype(np.int64))


def _merged(drafts: list[Draft], picks, index: FabricIndex, geo: Geometry, ctx: Context, route: dict[int, int],
            live, dead_since, now_s: int) -> list[Draft]:
    """Two or more directed links that all touch one switch: that switch drops flows across its ports."""
    if len(picks) < 2:
        return drafts
    common = set.intersection(*({end[0] for end in index.ends(e)} for e, _, _ in picks)) & set(index.device_id)
    if len(common) != 1:
        return drafts
    device = common.pop()
    dead_rows = np.unique(np.concatenate([d for _, d, _ in picks]))
    live_rows = np.setdiff1d(np.unique(np.concatenate([live[e] for e, _, _ in picks])), dead_rows)
    evidence = _evidence(dead_rows, live_rows, ctx, geo, route, None, dead_since, now_s)
    evidence["links"] = sorted(index.dname(e) for e, _, _ in picks)
    summary = (f"partial blackhole in switch {device}: {len(dead_rows)} of {len(dead_rows) + len(live_rows)} probe "
               f"flows through {len(picks)} of its links get nothing across, the others pass")
    eid = geo.L + geo.N + index.device_id[device]
    return [Draft("partial_blackhole", device, "device", 0.8, summary, eid, None, evidence, dead_rows.astype(np.int64))]
