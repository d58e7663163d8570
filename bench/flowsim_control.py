"""The controller in the simulator: the product's decision core (correlator/steering.py) on a
simulated fabric, round by round as the correlator's windows would drive it.

A round: rates are max-min fair over the current paths; the correlator's view flags bad elements
(links down are already withdrawn by routing; a fabric link is hot when its utilization reaches
`congestion_utilization` while more is offered than it carries: the "high utilization and discards"
of correlator/evidence.py; badness = offered / capacity); `allowed_avoid` applies the blast-radius
`Limits` to those plus the elements still avoided from earlier rounds; every subflow whose path
crosses an accepted element is re-steered by `choose` among its host pair's candidate source
ports (the paths a host agent's Paris traceroutes of those ports show), as the agent's `steer`
does. A round that makes the job worse (lower minimum rate, then lower aggregate) is rolled back
and the controller stops, as actions are rolled back when they make things worse.

Modes: `load_aware` passes the links' offered load / capacity as `choose`'s load and counts each move at once
(the next choice sees it); otherwise `choose` gets no load and a host pair's moved subflows are
spread over the first paths that avoid (what an agent that only receives `avoid_hops` can do).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from correlator.steering import Limits, allowed_avoid, choose
from flowsim_fabric import PAD, FatTree
from flowsim_maxmin import maxmin_rates

PORT_BASE, PORT_SPAN = 0xC000, 0x4000  # RoCEv2 source ports from flow labels: 49152..65535


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


def evaluate(ft: FatTree, job: Job, avail: np.ndarray) -> Outcome:
    a, c = ft.route(job.src, job.dst, job.port)
    if (a == -2).any():
        raise ValueError(f"{int((a == -2).sum())} subflows have no path left")
    paths = ft.path_links(job.src, job.dst, a, c)
    return Outcome(maxmin_rates(paths, avail), paths)


class _LinkLoad(Mapping):
    """Undirected link name -> offered load / capacity (the busier direction), read live."""

    def __init__(self, ft: FatTree, util: np.ndarray, ids: dict[str, int]):
        self.ft, self.util, self.ids = ft, util, ids

    def __getitem__(self, name: str) -> float:
        up, down = self.ft.directions(self.ids[name])
        return float(max(self.util[up], self.util[down]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class Controller:
    def __init__(self, ft: FatTree, job: Job, avail: np.ndarray, background: np.ndarray | None = None,
                 limits: Limits = Limits(), candidates: int = 32, congestion_utilization: float = 0.9,
                 load_aware: bool = True, max_rounds: int = 8):
        self.ft, self.avail, self.limits = ft, avail, limits
        self.background = background if background is not None else np.zeros(ft.n_links)
        self.congestion_utilization, self.load_aware, self.max_rounds = congestion_utilization, load_aware, max_rounds
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
        self.cand_links = ft.path_links(cs, cd, ca, cc).reshape(pairs.size, candidates, 6)
        self.fabric = ft.edge(g_src) != ft.edge(g_dst)
        self.groups = {}
        self.cand_sets = []
        for g in range(pairs.size):
            sets = [ft.path_set(g_src[g], g_dst[g], ca[g * candidates + i], cc[g * candidates + i])
                    for i in range(candidates)]
            self.cand_sets.append(sets)
            if self.fabric[g]:
                self.groups[f"h{g_src[g]}->h{g_dst[g]}"] = sets
        # what each subflow could send if the fabric were no limit: its NICs' fair share
        n_out = np.bincount(job.src, minlength=H)
        n_in = np.bincount(job.dst, minlength=H)
        self.potential = np.minimum(avail[ft.link(0, 0, job.src)] / n_out[job.src],
                                    avail[ft.link(0, 1, job.dst)] / n_in[job.dst])

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
        for _ in range(self.max_rounds):
            bad = self.detect(out)
            if not bad:
                break
            accepted, refused = allowed_avoid(bad, self.groups, self.limits)
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
            job, out = new_job, new_out
            result.job, result.outcome = job, out
        return result

    def _steer(self, job: Job, out: Outcome, avoid: set[str]) -> tuple[np.ndarray, int]:
        """New ports: every subflow whose path crosses an avoided link moves (if it can)."""
        ft = self.ft
        ports = job.port.copy()
        if not avoid:
            return ports, 0
        mask = np.zeros(3 * ft.hosts, bool)
        mask[[self.ids[e] for e in avoid]] = True
        fabric_hops = out.paths[:, 2:]
        crossing = np.where(fabric_hops == PAD, False, mask[ft.undirected(np.maximum(fabric_hops, 0))]).any(axis=1)
        movers = np.flatnonzero(crossing)
        util = None
        if self.load_aware:
            util = self._pressure(out)
        load = _LinkLoad(ft, util, self.ids) if util is not None else None
        moved = 0
        by_group: dict[int, list[int]] = {}
        for f in movers:
            by_group.setdefault(int(self.group_of[f]), []).append(int(f))
        for g, subflows in by_group.items():
            sets = self.cand_sets[g]
            if load is None:
                picks = choose(sets, avoid, None, n=len(subflows))
                for i, f in enumerate(subflows):
                    if picks:
                        ports[f] = self.cand_port[g, picks[i % len(picks)]]
                        moved += 1
                continue
            for f in subflows:
                here = out.paths[f][2:]
                here = here[here != PAD]
                if util[here].max() <= 1.0 + 1e-9:
                    continue  # enough others left the hot link: this one may stay
                picks = choose(sets, avoid, load, n=1)
                if not picks:
                    continue
                new, old = self.cand_links[g, picks[0]], out.paths[f]
                new, old = new[new != PAD], old[old != PAD]
                util[old] -= self.potential[f] / ft.capacity[old]
                util[new] += self.potential[f] / ft.capacity[new]
                ports[f] = self.cand_port[g, picks[0]]
                moved += 1
        return ports, moved
