"""The controller in the simulator: the product's decision core (correlator/actions/steering.py) on a
simulated fabric, round by round as the correlator's windows would drive it.

A round: rates are max-min fair over the current paths; the correlator's view flags bad elements
(links down are already withdrawn by routing; a fabric link is hot when its utilization reaches
`congestion_utilization` while more is offered than it carries: the "high utilization and discards"
of correlator/evidence.py; badness = offered / capacity); `allowed_avoid` applies the blast-radius
`Limits` to those plus the elements still avoided from earlier rounds; every subflow whose path
crosses an accepted element may be re-steered among its host pair's candidate source ports (the
paths a host agent's Paris traceroutes of those ports show). A round that makes the job worse
(lower minimum rate, then lower aggregate) is rolled back and the controller stops, as actions are
rolled back when they make things worse; rounds go on while they gain (the minimum rate or the
aggregate up by more than `min_gain`, relative), up to `max_rounds`.

Modes: `load_aware` (the default) re-steers each host pair's subflows with `rebalance` over the
directed links' offered load / capacity: a subflow on a link over capacity moves to the candidate
path whose busiest link after the move is least busy, only if that lowers its own, never onto an
accepted element, each move counted at once (the next pair sees it); a hot link is relieved, not
emptied. Otherwise `choose` gets no load and a host pair's moved subflows are spread over the first
paths that avoid (what an agent that only receives `avoid_hops` can do). `stripe`: what the host
agents do with `hop_loads` (hostprobe/steer.py): every host pair with a subflow on an avoided element
re-places all its subflows with `stripe`, the pairs behind one edge switch taking consecutive slots
of one stripe over their candidate routes filled to one level (offered load / capacity), as the
movers of one action do by their rank. `planner`: one round of the
global path planner (planner.py) instead: a path for every subflow at once, ports that reach them,
the links it leaves empty checked by the same limits; with `traced_only` it keeps to the paths of the
32 candidate ports the agent traced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from correlator.actions.steering import Limits, allowed_avoid, choose, rebalance, stripe
from lab.flowsim.fabric import PAD, PORT_BASE, PORT_SPAN, FatTree
from lab.flowsim.maxmin import maxmin_rates
from lab.flowsim.planner import plan, ports_for, slots, split_factor


@dataclass
class Job:
    """Subflows (one per QP) of a collective: src[i] -> dst[i] on source port port[i]."""

    src: np.ndarray
    dst: np.ndarray
    port: np.ndarray

    @property
    def size(self) -> int:
        return self.src.size


@dataclass
class Outcome:
    rates: np.ndarray
    paths: np.ndarray

    @property
    def min_rate(self) -> float:
        return float(self.rates.min())

    @property
    def aggregate(self) -> float:
        return float(self.rates.sum())


@dataclass
class Round:
    hot: int
    accepted: int
    refused: int
    moved: int
    min_rate: float
    aggregate: float
    rolled_back: bool = False


@dataclass
class ControlResult:
    job: Job
    outcome: Outcome
    rounds: list[Round] = field(default_factory=list)
    refusals: dict[str, str] = field(default_factory=dict)
    split: int = 1            # QPs per original subflow (the planner may split them)
    traced: float = 1.0       # share of the subflows whose port the agent had already traced
    drained: int = 0          # links the plan leaves empty (the blast-radius limits checked them)
    plan_s: float = 0.0       # the planner's own time (split, colourings, limits, ports), rates not included

    @property
    def throughput(self) -> float:
        """The collective's throughput per original subflow: a pair's bytes go over its QPs in equal
        shares, so its slowest QP sets its pace (the minimum rate x the split)."""
        return self.outcome.min_rate * self.split


def evaluate(ft: FatTree, job: Job, avail: np.ndarray) -> Outcome:
    a, c = ft.route(job.src, job.dst, job.port)
    if (a == -2).any():
        raise ValueError(f"{int((a == -2).sum())} subflows have no path left")
    paths = ft.path_links(job.src, job.dst, a, c)
    return Outcome(maxmin_rates(paths, avail), paths)


class Controller:
    def __init__(self, ft: FatTree, job: Job, avail: np.ndarray, background: np.ndarray | None = None,
                 limits: Limits | None = Limits(), candidates: int = 32, congestion_utilization: float = 0.9,
                 load_aware: bool = True, max_rounds: int = 16, min_gain: float = 1e-3, planner: bool = False,
                 max_split: int = 4, traced_only: bool = False, stripe: bool = False):
        self.ft, self.avail, self.limits = ft, avail, limits
        self.background = background if background is not None else np.zeros(ft.n_links)
        self.congestion_utilization, self.load_aware, self.max_rounds = congestion_utilization, load_aware, max_rounds
        self.min_gain, self.planner, self.max_split = min_gain, planner, max_split
        self.traced_only = traced_only  # the planner keeps to the paths of the candidate ports traced
        self.stripe = stripe  # the agents' placement (load_aware off)
        self.ids = {name: u for u, name in enumerate(ft.names)}
        # host pairs (groups) and each one's candidate source ports and their paths
        H = ft.hosts
        key = job.src.astype(np.int64) * H + job.dst
        pairs, self.group_of = np.unique(key, return_inverse=True)
        g_src, g_dst = pairs // H, pairs % H
        j = np.arange(candidates)
        self.cand_port = PORT_BASE + (g_src[:, None] * 7919 + g_dst[:, None] * 104729 + j * 2731) % PORT_SPAN
        cs, cd = np.repeat(g_src, candidates), np.repeat(g_dst, candidates)
        ca, cc = ft.route(cs, cd, self.cand_port.ravel())
        self.cand_a, self.cand_c = ca.reshape(pairs.size, candidates), cc.reshape(pairs.size, candidates)
        self.cand_links = ft.path_links(cs, cd, ca, cc).reshape(pairs.size, candidates, 6)
        self.fabric = ft.edge(g_src) != ft.edge(g_dst)
        self.groups = {}  # name -> candidate paths (link names), host pairs across the fabric
        self.group_name: list[str | None] = []
        self.cand_sets = []
        for g in range(pairs.size):
            sets = [ft.path_set(g_src[g], g_dst[g], ca[g * candidates + i], cc[g * candidates + i])
                    for i in range(candidates)]
            self.cand_sets.append(sets)
            self.group_name.append(f"h{g_src[g]}->h{g_dst[g]}" if self.fabric[g] else None)
            if self.fabric[g]:
                self.groups[self.group_name[g]] = sets
        self._cand_paths: dict[int, list[tuple[int, ...]]] = {}
        # what each subflow could send if the fabric were no limit: its NICs' fair share
        n_out = np.bincount(job.src, minlength=H)
        n_in = np.bincount(job.dst, minlength=H)
        self.potential = np.minimum(avail[ft.link(0, 0, job.src)] / n_out[job.src],
                                    avail[ft.link(0, 1, job.dst)] / n_in[job.dst])

    def _groups_touching(self, bad: dict[str, float]) -> dict[str, list[frozenset[str]]]:
        """The groups some candidate path of which crosses a bad element: all that `allowed_avoid`
        checks (the others cannot refuse anything), picked with numpy."""
        mask = np.zeros(3 * self.ft.hosts, bool)
        mask[[self.ids[e] for e in bad]] = True
        hops = self.cand_links[:, :, 2:]
        hit = np.where(hops == PAD, False, mask[self.ft.undirected(np.maximum(hops, 0))]).any(axis=(1, 2))
        return {self.group_name[g]: self.groups[self.group_name[g]] for g in np.flatnonzero(hit & self.fabric)}

    def detect(self, out: Outcome) -> dict[str, float]:
        """Bad fabric links as the correlator would flag them: hot and overloaded, by badness."""
        ft = self.ft
        util = (self._per_link(out, out.rates) + self.background) / ft.capacity
        pressure = self._pressure(out)
        hot = (util >= self.congestion_utilization) & (pressure > 1 + 1e-6)
        hot[: 2 * ft.hosts] = False  # host links: every path of a pair crosses them
        bad: dict[str, float] = {}
        for d in np.flatnonzero(hot):
            name = ft.names[int(ft.undirected(d))]
            bad[name] = max(bad.get(name, 0.0), float(pressure[d]))
        return bad

    def _per_link(self, out: Outcome, per_flow: np.ndarray) -> np.ndarray:
        used = out.paths != PAD
        return np.bincount(out.paths[used], weights=np.broadcast_to(per_flow[:, None], used.shape)[used],
                           minlength=self.ft.n_links)

    def _pressure(self, out: Outcome) -> np.ndarray:
        """Offered load / capacity per directed link: what the subflows' NICs would push through it
        (utilization counting what queues or drops), background included."""
        return (self._per_link(out, self.potential) + self.background) / self.ft.capacity

    def run(self, job: Job) -> ControlResult:
        ft = self.ft
        job = Job(job.src, job.dst, job.port.copy())
        out = evaluate(ft, job, self.avail)
        result = ControlResult(job, out)
        if self.planner:
            return self._run_planned(job, out, result)
        for _ in range(self.max_rounds):
            bad = self.detect(out)
            if not bad:
                break
            if self.limits is None:  # no blast-radius limits: every bad element may be avoided
                accepted, refused = list(bad), {}
            else:
                accepted, refused = allowed_avoid(bad, self._groups_touching(bad), self.limits)
            result.refusals.update(refused)
            ports, moved = self._steer(job, out, set(accepted))
            step = Round(len(bad), len(accepted), len(refused), moved, out.min_rate, out.aggregate)
            if not moved:
                result.rounds.append(step)
                break
            new_job = Job(job.src, job.dst, ports)
            new_out = evaluate(ft, new_job, self.avail)
            step.min_rate, step.aggregate = new_out.min_rate, new_out.aggregate
            if (new_out.min_rate, new_out.aggregate) < (out.min_rate - 1e-9, out.aggregate - 1e-9):
                step.rolled_back = True
                result.rounds.append(step)
                break
            result.rounds.append(step)
            gained = (new_out.min_rate > out.min_rate * (1 + self.min_gain)
                      or new_out.aggregate > out.aggregate * (1 + self.min_gain))
            job, out = new_job, new_out
            result.job, result.outcome = job, out
            if not gained:
                break  # kept (not worse), but another round would churn for next to nothing
        return result

    def _run_planned(self, job: Job, out: Outcome, result: ControlResult) -> ControlResult:
        """One round of the global planner (lab/flowsim/planner.py): every subflow gets a planned path
        and a port that reaches it, the pair's QPs split if that raises the whole-subflow bound. The
        links the plan leaves empty are drained: the blast-radius limits check them like any avoided
        element, and a refused one keeps a slot. Rolled back if the job gets worse."""
        bad = self.detect(out)
        if not bad:
            return result
        ft, avail = self.ft, self.avail
        started = time.perf_counter()
        m = split_factor(ft, job.src, job.dst, avail, self.max_split)
        src, dst, group = np.repeat(job.src, m), np.repeat(job.dst, m), np.repeat(self.group_of, m)
        h = ft.half
        known_a, known_c = self.cand_a[group], self.cand_c[group]
        prefer_plane = (known_a[:, :, None] == np.arange(h)).any(axis=1)
        prefer_core = np.zeros((src.size, h, h), bool)
        rows = np.repeat(np.arange(src.size), known_a.shape[1])
        inter = (known_a >= 0).ravel() & (known_c >= 0).ravel()
        prefer_core[rows[inter], known_a.ravel()[inter], known_c.ravel()[inter]] = True
        # keeping to the traced paths, a plan may need many rates down: more of them, fewer orders each
        tries = {"max_tries": 40, "attempts": 2, "only_preferred": True} if self.traced_only else {}
        try:
            p = plan(ft, src, dst, avail, prefer_plane=prefer_plane, prefer_core=prefer_core, **tries)
        except RuntimeError:  # no plan down to a quarter of the bound: leave the job as it is
            result.rounds.append(Round(len(bad), 0, 0, 0, out.min_rate, out.aggregate))
            result.plan_s = time.perf_counter() - started
            return result
        drained = self._drained(p.rate)
        accepted, refused = list(drained), {}
        if drained and self.limits is not None:
            accepted, refused = allowed_avoid(drained, self._groups_touching(drained), self.limits)
        if refused:
            keep = np.zeros(ft.n_links, bool)
            for d in ft.directions(np.array([self.ids[e] for e in refused])):
                keep[d] = True
            p = plan(ft, src, dst, avail, keep=keep, prefer_plane=prefer_plane, prefer_core=prefer_core, **tries)
        result.refusals.update(refused)
        ports, traced = ports_for(ft, src, dst, p.plane, p.core, self.cand_port[group], known_a, known_c)
        result.plan_s = time.perf_counter() - started
        new_job = Job(src, dst, ports)
        new_out = evaluate(ft, new_job, avail)
        step = Round(len(bad), len(accepted), len(refused), src.size, new_out.min_rate * m, new_out.aggregate)
        result.rounds.append(step)
        if (new_out.min_rate * m, new_out.aggregate) < (out.min_rate - 1e-9, out.aggregate - 1e-9):
            step.rolled_back = True
            return result
        result.job, result.outcome, result.split = new_job, new_out, m
        result.traced, result.drained = float(traced.mean()), len(accepted)
        return result

    def _drained(self, rate: float) -> dict[str, float]:
        """Fabric links (names) with capacity left but not one slot at `rate`, by badness rate / left."""
        ft = self.ft
        fabric = np.arange(2 * ft.hosts, ft.n_links)
        left = self.avail[fabric]
        empty = fabric[(left > 0) & (slots(left, rate) == 0)]
        bad: dict[str, float] = {}
        for d in empty.tolist():
            name = ft.names[int(ft.undirected(d))]
            bad[name] = max(bad.get(name, 0.0), rate / float(self.avail[d]))
        return bad

    def _steer(self, job: Job, out: Outcome, avoid: set[str]) -> tuple[np.ndarray, int]:
        """New ports for the subflows that may move; returns (ports, moved). Avoid-only: those whose
        path crosses an avoided link. Load-aware: those on a directed link over capacity, avoided
        or not (relieving a link takes no path away from any pair: the blast-radius limits bound
        what is drained, the avoided elements, onto which no move goes)."""
        ft = self.ft
        ports = job.port.copy()
        mask = np.zeros(3 * ft.hosts, bool)
        mask[[self.ids[e] for e in avoid]] = True
        hops = out.paths[:, 2:]
        util = self._pressure(out)
        if self.load_aware:
            crossing = np.where(hops == PAD, 0.0, util[np.maximum(hops, 0)]).max(axis=1) > 1.0 + 1e-9
        elif not avoid:
            return ports, 0
        else:
            crossing = np.where(hops == PAD, False, mask[ft.undirected(np.maximum(hops, 0))]).any(axis=1)
        by_group: dict[int, list[int]] = {}
        for f in np.flatnonzero(crossing).tolist():
            by_group.setdefault(int(self.group_of[f]), []).append(f)
        if self.stripe:
            return self._stripe(job, util, by_group, np.flatnonzero(mask), ports)
        if not self.load_aware:
            moved = 0
            for g, subflows in by_group.items():
                picks = choose(self.cand_sets[g], avoid, None, n=len(subflows))
                for i, f in enumerate(subflows):
                    if picks:
                        ports[f] = self.cand_port[g, picks[i % len(picks)]]
                        moved += 1
            return ports, moved
        return self._rebalance(job, out, util, by_group, np.flatnonzero(mask), ports)

    def _rebalance(self, job: Job, out: Outcome, util: np.ndarray, by_group: dict[int, list[int]],
                   avoided: np.ndarray, ports: np.ndarray) -> tuple[np.ndarray, int]:
        """`rebalance` per host pair, over directed link ids: its candidate paths plus its subflows'
        current ones (a subflow may keep its port, or take another subflow's); `util` (offered load
        / capacity per directed link) is updated as each pair's moves are made."""
        ft = self.ft
        weight = self.potential / ft.capacity[2 * ft.hosts]  # fabric links all one speed
        up, down = ft.directions(avoided)
        avoid = frozenset(up.tolist()) | frozenset(down.tolist())
        banned = np.zeros(ft.n_links + 1, bool)  # directed ids of avoided links; the last entry: PAD
        banned[up], banned[down] = True, True
        moved = 0
        for g, subflows in by_group.items():
            ours = out.paths[subflows, 2:]
            if not self._may_move(self.cand_links[g, :, 2:], ours, util, weight[subflows], banned):
                continue  # `rebalance` would move nothing (most pairs at full load): skip the call
            cand = self._cand_paths.get(g)
            if cand is None:
                cand = self._cand_paths[g] = [tuple(x for x in row if x != PAD)
                                              for row in self.cand_links[g, :, 2:].tolist()]
            paths = cand + [tuple(x for x in row if x != PAD) for row in ours.tolist()]
            elements = np.unique(np.concatenate([self.cand_links[g, :, 2:].ravel(), ours.ravel()]))
            elements = elements[elements != PAD]
            load = dict(zip(elements.tolist(), util[elements].tolist()))
            first = len(cand)
            new = rebalance(paths, range(first, first + len(subflows)), load, weight[subflows], avoid)
            for i, f in enumerate(subflows):
                j = new[i]
                if j == first + i:
                    continue
                util[np.array(paths[first + i], np.int64)] -= weight[f]
                util[np.array(paths[j], np.int64)] += weight[f]
                ports[f] = self.cand_port[g, j] if j < first else job.port[subflows[j - first]]
                moved += 1
        return ports, moved

    def _stripe(self, job: Job, util: np.ndarray, by_group: dict[int, list[int]], avoided: np.ndarray,
                ports: np.ndarray) -> tuple[np.ndarray, int]:
        """The host agents' placement: each moving pair's subflows (all of them: a steer replaces a
        pair's ports) take the next slots of one stripe, pairs in (source, destination) order."""
        ft = self.ft
        weight = self.potential / ft.capacity[2 * ft.hosts]
        up, down = ft.directions(avoided)
        avoid = frozenset(up.tolist()) | frozenset(down.tolist())
        members: dict[int, list[int]] = {}
        for f, g in enumerate(self.group_of.tolist()):
            if g in by_group:
                members.setdefault(g, []).append(f)
        # one stripe per edge switch: the movers behind it share its uplinks (planner.stripes)
        edge_of = {g: int(ft.edge(job.src[flows[0]])) for g, flows in members.items()}
        slots: dict[int, int] = {}
        for g, flows in members.items():
            slots[edge_of[g]] = slots.get(edge_of[g], 0) + len(flows)
        taken: dict[int, int] = {}
        moved = 0
        for g in sorted(members):  # group ids follow (src, dst) order
            flows, edge = members[g], edge_of[g]
            paths = [tuple(x for x in row if x != PAD) for row in self.cand_links[g, :, 2:].tolist()]
            elements = {e for p in paths for e in p}
            load = {e: float(util[e]) for e in elements}
            slot = taken.get(edge, 0)
            picks = stripe(paths, avoid, load, len(flows), slot, slots[edge], float(weight[flows].mean()))
            taken[edge] = slot + len(flows)
            for i, f in enumerate(flows):
                if picks:
                    ports[f] = self.cand_port[g, picks[i % len(picks)]]
                    moved += 1
        return ports, moved

    @staticmethod
    def _may_move(cand: np.ndarray, ours: np.ndarray, util: np.ndarray, weight: np.ndarray,
                  banned: np.ndarray) -> bool:
        """Whether `rebalance` would move any of these subflows (hops `ours`, PAD-padded) among the
        pair's candidate paths and their own: its first move is a subflow over capacity onto a path,
        crossing no avoided link, whose busiest link after the move is below the one it leaves."""
        paths = np.concatenate([cand, ours])                                  # [P, hops]
        pad = paths == PAD
        ids = np.where(pad, banned.size - 1, paths)
        allowed = ~banned[ids].any(axis=1)
        load = np.where(pad, -np.inf, util[np.maximum(paths, 0)])             # [P, hops]
        own_peak = np.where(ours == PAD, -np.inf, util[np.maximum(ours, 0)]).max(axis=1)  # [S]
        on_own = (paths[None, :, :, None] == ours[:, None, None, :]).any(axis=3) & ~pad[None]  # [S, P, hops]
        after = load[None] + np.where(on_own, 0.0, weight[:, None, None])
        better = (after.max(axis=2) < own_peak[:, None] - 1e-9) & allowed[None]
        return bool((better & (own_peak[:, None] > 1.0 + 1e-9)).any())
