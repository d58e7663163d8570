"""The Correlator: one step per window over the sliding context -> Findings.

Step order (each stage only sees the paths the previous ones left unexplained):
1. paths down now -> cover by NIC / switch / link (probes alone: no SNMP poll needed);
   paths with down episodes in the context -> the same cover, for flapping;
   paths down now that no down element explains, through links other flows still cross -> a
   partial blackhole (correlator/partial.py);
2. loss on the remaining paths (no down episode in the context, whose loss would be transitional)
   -> pooled binomial cover over directed links, a sequential test over windows of growing length
   against each link's own baseline (sequential.py);
3. round-trip delay inflation on the remaining paths -> cover over directed links;
4. classification with switch evidence, switch-only findings, job impact.
`add` only copies numbers under a lock; all the work happens in `step` (a worker thread).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from correlator.classify import (
    RECOVERY_S,
    SEVERITY,
    dead_switches,
    directed_findings,
    state_findings,
    state_priority,
    switch_findings,
    switch_status_down,
)
from correlator.context import Context, path_text
from correlator.evidence import SwitchView
from correlator.fabric import FabricIndex
from correlator.impact import attach
from correlator.localize import Pick, cover_inflation, cover_states
from correlator.partial import partial_findings
from correlator.paths import Geometry
from correlator.qp_paths import QpPaths
from correlator.qp_paths import evidence as qp_evidence
from correlator.sequential import SequentialLoss
from nms.config.models import CorrelatorConfig, FabricConfig, Thresholds
from nms.records import FabricTopology, Finding, Job, NcclRdmaQp

MAX_PATHS_LISTED = 1000
# a link whose round trip inflated this recently is a queue: its loss is congestion (drops at the queue's
# tail), also once the senders backed off and the queue no longer shows in the delay
QUEUE_MEMORY_S = 30
FOCUS_MAX_PATHS = 512  # paths of one suspected link probed faster (a spine link of a big fabric carries thousands)


class Correlator:
    def __init__(self, fabric: FabricConfig, thresholds: Thresholds, config: CorrelatorConfig):
        self.thresholds, self.config = thresholds, config
        self.index = FabricIndex(fabric)
        self.ctx = Context(config, thresholds)
        self.sequential = SequentialLoss(config, self.ctx)
        self._dead_switch_at: dict[str, int] = {}  # switch -> the last second the switch status had it dead
        self._focused: dict[int, int] = {}  # directed link -> until when its paths are probed faster (ns)
        self._queued_at: dict[int, int] = {}  # directed link -> the last second its round trip inflated
        self.geo = Geometry()
        self.qp_paths = QpPaths()  # the NCCL QPs' traced paths: which QPs cross a faulty element
        self._lock = threading.Lock()
        self._topology: FabricTopology | None = None
        self._step_lock = threading.Lock()

    def add(self, records: Iterable[Any]) -> None:
        with self._lock:
            self.ctx.add(records)

    def set_topology(self, topology: FabricTopology) -> None:
        with self._lock:
            self._topology = topology

    def step(self, now_ns: int, jobs: Sequence[Job] = ()) -> list[Finding]:
        with self._step_lock:
            with self._lock:
                pending, topology, self._topology = self.ctx.take(), self._topology, None
            if topology is not None:
                self.index.update_topology(topology)
            for _, r in pending[7]:
                if r.__class__ is NcclRdmaQp:
                    self.qp_paths.add(r)
            self.ctx.ingest(pending)
            self.ctx.prune(now_ns)
            self.geo.update(self.ctx, self.index)
            return self._findings(now_ns, jobs)

    def focus_requests(self, now_ns: int) -> tuple[list[str], dict[str, list[str]]]:
        """After a step: the directed links the sequential test suspects of loss (not found yet) whose
        paths are not being probed faster already, and those paths per probing host (at most
        FOCUS_MAX_PATHS a link): the service asks the agents to probe them at `focus_rate` for
        `focus_s` (hostprobe's `focus` command). Both legs count: a path crossing the link either way."""
        if not self.config.focus_rate:
            return [], {}
        with self._step_lock:
            seq, UT = self.sequential, self.geo.UT
            self._focused = {d: t for d, t in self._focused.items() if t > now_ns}
            links, paths = [], {}
            for did in np.flatnonzero(seq.focus[:UT.shape[0]]).tolist():
                if did in self._focused:
                    continue
                self._focused[did] = now_ns + int(self.config.focus_s * 1e9)
                links.append(self.index.dname(did))
                for i in UT.indices[UT.indptr[did]:UT.indptr[did + 1]][:FOCUS_MAX_PATHS].tolist():
                    src_host, _, _, _, path_id = self.ctx.keys[i]
                    paths.setdefault(src_host, set()).add(path_id)
            return links, {host: sorted(ids) for host, ids in paths.items()}

    def _queued_lately(self, inflation: list[Pick], now_s: int) -> set[int]:
        """The directed links whose round trip inflated within QUEUE_MEMORY_S (this step's included)."""
        for pick in inflation:
            self._queued_at[pick.element] = now_s
        self._queued_at = {d: at for d, at in self._queued_at.items() if now_s - at <= QUEUE_MEMORY_S}
        return set(self._queued_at)

    def _findings(self, now_ns: int, jobs: Sequence[Job]) -> list[Finding]:
        ctx, geo, index, t = self.ctx, self.geo, self.index, self.thresholds
        view = SwitchView(ctx, index, t)
        switch_down = switch_status_down(index, view)
        drafts = []
        if ctx.P:
            stats = ctx.stats(now_ns)
            drafts += self._states(stats, view)
            explained = np.zeros(ctx.P, bool)
            for d in drafts:
                explained[d.paths] = True
            # a flow dead through a link its switches say is down is that link's, not a partial blackhole;
            # so is one through a switch coming back from the dead (routes return, flows rehash onto it)
            now_s = now_ns // 1_000_000_000
            back = {lid for dev, at in self._dead_switch_at.items() if now_s - at <= RECOVERY_S
                    for lid in index.links_of(dev)}
            down_dids = [did for lid in switch_down | back if lid < geo.L for did in (2 * lid, 2 * lid + 1)]
            if down_dids:
                explained[geo.UT[down_dids].indices] = True
            partial = partial_findings(ctx, geo, index, stats, explained, now_ns)
            drafts += partial
            for d in partial:
                explained[d.paths] = True
            quiet = ~stats.down & (stats.episodes == 0) & ~explained
            prio = self._direction_priority(view)
            loss = self._loss(now_ns, stats, quiet, prio)
            infl = cover_inflation(geo.U, geo.UT, stats.inflation_us, quiet & np.isfinite(stats.inflation_us),
                                   threshold_us=t.owd_inflation_us, priority=prio)
            drafts += directed_findings(loss, infl, index, view, t, self.config, self._queued_lately(infl, now_s))
        drafts += dead_switches(index, switch_down, {d.element for d in drafts if d.kind == "device_down"},
                                self._dead_switch_at, now_ns // 1_000_000_000)
        covered = {d.element for d in drafts if d.kind in ("link_down", "link_flapping")}
        for d in drafts:  # a down NIC or switch explains its links' state
            if d.kind == "nic_down":
                host, _, nic = d.element.partition(":")
                if (lid := index.nic_access.get((host, nic))) is not None:
                    covered.add(index.name(lid))
            elif d.kind == "device_down":
                covered |= {index.name(lid) for lid in index.links_of(d.element)}
        seen = {(d.kind, d.element) for d in drafts}
        drafts += [d for d in switch_findings(index, view, covered, switch_down) if (d.kind, d.element) not in seen]
        job_ids = attach(drafts, jobs, now_ns, geo, index, ctx.keys)
        self._qps_crossing(drafts, job_ids, now_ns)
        return [self._finding(d, now_ns, job_ids.get(i, [])) for i, d in enumerate(drafts)]

    def _qps_crossing(self, drafts: list, job_ids: dict[int, list[str]], now_ns: int) -> None:
        """Name, in each draft's evidence, the NCCL QPs whose traced path crosses its element
        (correlator/qp_paths.py); their jobs join the draft's jobs."""
        placed = self.qp_paths.placed(self.index, self.ctx.addresses, self.ctx.addr_version, now_ns)
        if not placed:
            return
        for i, d in enumerate(drafts):
            crossing = QpPaths.crossing(placed, self.index, d.element_kind, d.element, d.eid, d.direction)
            if not crossing:
                continue
            d.evidence.update(qp_evidence(crossing, self.index))
            jobs = sorted({q.job_id for q in crossing})
            job_ids[i] = sorted(set(job_ids.get(i, [])) | set(jobs))
            d.summary = f"{d.summary}; {len(crossing)} QP(s) of job {', '.join(jobs[:3])} cross it"

    def _loss(self, now_ns: int, stats, quiet: np.ndarray, prio: np.ndarray) -> list:
        """Excess loss per directed link: sequential, against each link's own baseline (sequential.py)."""
        return self.sequential.find(now_ns, stats, self.geo, quiet, prio)

    def _states(self, stats, view: SwitchView) -> list:
        geo, index = self.geo, self.index
        E, ET = geo.E, geo.ET
        bad_any = stats.down | (stats.episodes > 0)
        if not bad_any.any():
            return []
        bad_count = ET @ bad_any.astype(np.float64)
        allowed = np.ones(E.shape[1], bool)
        dev0 = geo.L + geo.N
        for d in np.flatnonzero(bad_count[dev0:] > 0):  # a switch needs all its probed links implicated
            allowed[dev0 + d] = self._device_allowed(int(d), bad_count, ET, view)
        prio = state_priority(geo, index, view, bad_count > 0)
        down = cover_states(E, ET, stats.down, stats.up, prio, allowed)
        episodes = cover_states(E, ET, bad_any, stats.up & (stats.episodes == 0), prio, allowed)
        return state_findings(down, episodes, stats, geo, index, view)

    def _device_allowed(self, d: int, bad_count: np.ndarray, ET, view: SwitchView) -> bool:
        index = self.index
        name = index.devices[d]
        if index.reachable.get(name) is False:
            return True
        through = np.diff(ET.indptr)
        links = [lid for lid in index.links_of(name) if lid < len(through) and through[lid] > 0]
        return all(bad_count[lid] > 0 for lid in links)

    def _direction_priority(self, view: SwitchView) -> np.ndarray:
        """Tie-break between directed links: the one whose switch counters look congested/erroring."""
        prio = np.zeros(2 * self.geo.L)
        for end in view.ctx.port_rates:
            lid = self.index.by_end.get(end)
            if lid is None or lid >= self.geo.L:
                continue
            for did in (2 * lid, 2 * lid + 1):
                rates = view.direction_rates(did)
                prio[did] = max(prio[did], rates.get("utilization", 0.0) + rates.get("errors_ps", 0.0)
                                + rates.get("discards_ps", 0.0))
        return prio

    def _finding(self, d, now_ns: int, jobs: list[str]) -> Finding:
        keys = self.ctx.keys
        paths = sorted(path_text(keys[i]) for i in d.paths[:MAX_PATHS_LISTED].tolist())
        return Finding(kind=d.kind, element=d.element, element_kind=d.element_kind, ts=now_ns,
                       confidence=max(0.0, min(1.0, d.confidence)), severity=SEVERITY[d.kind],
                       summary=d.summary[:1024], direction=d.direction, evidence=_plain(d.evidence), paths=paths,
                       jobs=jobs, explains=self._explains(d.kind, d.element))

    def _explains(self, kind: str, element: str) -> list[str]:
        """The elements whose down state a down NIC or switch explains (incident parents, docs/correlator.md):
        a NIC its access link; a device its links and the NICs at their far ends."""
        index = self.index
        if kind == "nic_down":
            host, _, nic = element.partition(":")
            lid = index.nic_access.get((host, nic))
            return [] if lid is None else [f"link:{index.name(lid)}"]
        if kind != "device_down":
            return []
        lids = index.links_of(element)
        access = {lid: nic for nic, lid in index.nic_access.items()}
        return sorted([f"link:{index.name(lid)}" for lid in lids]
                      + [f"nic:{access[lid][0]}:{access[lid][1]}" for lid in lids if lid in access])


def _plain(value):
    """Evidence as JSON-serializable plain values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
