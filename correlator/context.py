"""The sliding context: what the correlator remembers of the telemetry, in compact arrays.

Probe windows are not kept as records (16k hosts x 64 paths is a million windows a second): `add`
copies the few numbers used into column lists, and each step scatters them into per-path rings of
`C` one-second slots (slot = window_start // 1 s mod C): sent, received, and the round-trip delay
(fwd p50 + rev p50, or rtt p50). The sum of the two one-way delays is free of the clock offset AND
of its drift, which raw one-way delays are not (50 ppm drift moves a raw one-way delay 30 ms over
a 600 s baseline); direction comes from localization over directed links instead (localize.py).
Per-path delay baselines are the minimum of that round trip over `config.baseline`, kept as B
bucket minima so the horizon slides without storing history.

Everything else (path events, probe paths, addresses, switch port state and rates, egress queue
rates, link events, NIC samples) is small and kept as the latest value per key, or a short per-key history.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from correlator.fabric import End, Nic
from nms.config.models import CorrelatorConfig, Thresholds
from nms.records import (
    HostNicSample,
    InterfaceAddress,
    LinkEvent,
    NcclRdmaQp,
    PathEvent,
    PortRates,
    PortSample,
    ProbePath,
    ProbeWindow,
    QueueRates,
)

NS = 1_000_000_000
PathKey = tuple[str, str, str, str, str]  # src_host, src_nic, dst_host, dst_nic, path_id
BUCKETS = 10  # baseline buckets
RECENT = 3  # latest windows whose median delay is compared to the baseline
RECENT_LOSS = 3  # latest windows pooled for loss besides the whole context: a fault that started
# a few seconds ago is not diluted by the clean seconds before it
WARM_S = 8  # a path needs this much history before its delay is judged


def path_text(key: PathKey) -> str:
    return f"{key[0]}:{key[1]}>{key[2]}:{key[3]}/{key[4]}"


@dataclass
class PathStats:
    """Per-path arrays for one step (index = path id)."""

    sent_ok: np.ndarray  # exchanges in windows clear of down/up transitions (loss statistics)
    lost_ok: np.ndarray
    sent_recent: np.ndarray  # the same over the path's latest RECENT_LOSS windows
    lost_recent: np.ndarray
    episodes: np.ndarray  # down episodes within the context
    down: np.ndarray  # bool: down now
    up: np.ndarray  # bool: answered in its latest, fresh window and not down
    inflation_us: np.ndarray  # recent round-trip median - baseline minimum; NaN when not judged
    last_recv: np.ndarray
    sent_age: np.ndarray  # (P, C) settled exchanges by age in seconds (0: the newest second seen)
    lost_age: np.ndarray


class Context:
    def __init__(self, config: CorrelatorConfig, thresholds: Thresholds):
        self.span = max(2, int(math.ceil(config.context)))
        self.C = self.span + 3
        self.bucket_s = max(1, int(config.baseline // BUCKETS))
        self.flap_window_ns = int(thresholds.flap_window * NS)
        self.path_index: dict[PathKey, int] = {}
        self.keys: list[PathKey] = []
        self.cap = 0
        self.newest = -1  # newest window second seen
        self.P = 0  # paths ingested (add may register more meanwhile: the step uses this many)
        self._alloc(1024)
        self._reset_pending()
        self.down_events: deque[tuple[int, int]] = deque()  # (ts, path)
        self.probe_paths: dict[int, tuple[int, str, str]] = {}  # path -> (ts, fwd_hops, rev_hops)
        self.path_sport: dict[int, int] = {}  # path -> the source port probing it (ProbePath, PathEvent)
        self.whole: set[int] = set()  # paths whose latest trace reached the peer and back
        # (src_host, src_nic, dst_host, dst_nic, sport) -> the path with a whole trace that sport took:
        # where a flow went while it answered (a flow that died has only a partial trace since)
        self.flow_route: dict[tuple[str, str, str, str, int], int] = {}
        self.dirty_paths: set[int] = set()
        self.addresses: dict[str, End] = {}
        self.addr_version = 0
        self.port_samples: dict[End, PortSample] = {}
        self.port_rates: dict[End, deque[PortRates]] = {}
        self.queue_rates: dict[End, dict[str, deque[QueueRates]]] = {}  # port -> its egress queues' rates
        self.link_events: dict[End, deque[LinkEvent]] = {}
        self.nic_samples: dict[Nic, HostNicSample] = {}
        self.nic_prev: dict[Nic, HostNicSample] = {}  # the sample before the latest (counter rates)
        self.nic_ids: dict[Nic, int] = {}  # step thread only, like the per-path arrays
        self.nic_changed: dict[Nic, int] = {}  # second of a NIC's latest down or back-up (its host's view)

    # -- intake (called under the engine's lock: O(1) per record) -----------------------------
    def _reset_pending(self) -> None:
        self.p_idx: list[int] = []
        self.p_start: list[int] = []
        self.p_sent: list[int] = []
        self.p_recv: list[int] = []
        self.p_fwd: list[int | None] = []
        self.p_rev: list[int | None] = []
        self.p_rtt: list[int | None] = []
        self.p_other: list = []

    def _path(self, r) -> int:
        key = (r.src_host, r.src_nic, r.dst_host, r.dst_nic, r.path_id)
        idx = self.path_index.get(key)
        if idx is None:
            idx = self.path_index[key] = len(self.keys)
            self.keys.append(key)
        return idx

    def _nic_id(self, nic: Nic) -> int:
        nid = self.nic_ids.get(nic)
        if nid is None:
            nid = self.nic_ids[nic] = len(self.nic_ids)
        return nid

    def add(self, records) -> None:
        for r in records:
            cls = r.__class__
            if cls is ProbeWindow:
                self.p_idx.append(self._path(r))
                self.p_start.append(r.window_start)
                self.p_sent.append(r.sent)
                self.p_recv.append(r.received)
                self.p_fwd.append(r.owd_fwd_p50_ns)
                self.p_rev.append(r.owd_rev_p50_ns)
                self.p_rtt.append(r.rtt_p50_ns)
            elif cls is PathEvent or cls is ProbePath:
                self.p_other.append((self._path(r), r))
            elif cls in (InterfaceAddress, PortSample, PortRates, LinkEvent, HostNicSample, QueueRates, NcclRdmaQp):
                self.p_other.append((None, r))

    def take(self) -> tuple:
        pending = (self.p_idx, self.p_start, self.p_sent, self.p_recv, self.p_fwd, self.p_rev, self.p_rtt,
                   self.p_other, len(self.keys))
        self._reset_pending()
        return pending

    # -- ingest (step thread) -------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        old, n = self.cap, self.cap
        C, B = self.C, BUCKETS

        def grow(name, shape, dtype, fill):
            arr = np.full(shape, fill, dtype)
            if n:
                arr[:n] = getattr(self, name)
            setattr(self, name, arr)

        grow("sec", (cap, C), np.int64, -1)
        grow("sent", (cap, C), np.int32, 0)
        grow("recv", (cap, C), np.int32, 0)
        grow("delay", (cap, C), np.float32, np.nan)
        grow("bmin", (cap, B), np.float32, np.inf)
        grow("bsec", (cap, B), np.int64, -1)
        grow("first", (cap,), np.int64, np.iinfo(np.int64).max)
        grow("ev_ts", (cap,), np.int64, -1)
        grow("ev_state", (cap,), np.int8, 0)  # 0 none, 1 up, 2 down
        grow("last_bad", (cap,), np.int64, -1)  # second of the latest silent window or path event
        grow("loss_explained", (cap,), np.int64, -1)  # newest second a loss finding that ended explained
        grow("src_nic", (cap,), np.int32, -1)  # NIC ids (nic_ids) of the path's two ends
        grow("dst_nic", (cap,), np.int32, -1)
        self.cap = max(cap, old)

    def ingest(self, pending) -> None:
        idx_l, start_l, sent_l, recv_l, fwd_l, rev_l, rtt_l, other, n_paths = pending
        if n_paths > self.cap:
            self._alloc(max(n_paths, 2 * self.cap))
        for i in range(self.P, n_paths):  # paths registered since the last step
            key = self.keys[i]
            self.src_nic[i], self.dst_nic[i] = self._nic_id((key[0], key[1])), self._nic_id((key[2], key[3]))
        self.P = n_paths
        for idx, r in other:
            self._other(idx, r)
        if not idx_l:
            return
        idx = np.asarray(idx_l, np.int64)
        sec = np.asarray(start_l, np.int64) // NS
        self.newest = max(self.newest, int(sec.max()))
        keep = sec > self.newest - self.C
        if not keep.all():
            idx, sec = idx[keep], sec[keep]
        sent = np.asarray(sent_l, np.int32)[keep]
        recv = np.asarray(recv_l, np.int32)[keep]
        delay = np.asarray(fwd_l, np.float64)[keep] + np.asarray(rev_l, np.float64)[keep]
        delay = np.where(np.isnan(delay), np.asarray(rtt_l, np.float64)[keep], delay) / 1e3
        slot = sec % self.C
        stale = self.sec[idx, slot] != sec
        self.sent[idx[stale], slot[stale]] = 0
        self.recv[idx[stale], slot[stale]] = 0
        self.sec[idx, slot] = sec
        np.add.at(self.sent, (idx, slot), sent)
        np.add.at(self.recv, (idx, slot), recv)
        self.delay[idx, slot] = delay
        zero = (sent > 0) & (recv == 0)
        np.maximum.at(self.last_bad, idx[zero], sec[zero])
        np.minimum.at(self.first, idx, sec)
        bucket = sec // self.bucket_s
        bslot = bucket % BUCKETS
        stale = self.bsec[idx, bslot] != bucket
        self.bmin[idx[stale], bslot[stale]] = np.inf
        self.bsec[idx, bslot] = bucket
        np.fmin.at(self.bmin, (idx, bslot), delay.astype(np.float32))

    def _other(self, idx: int | None, r) -> None:
        cls = r.__class__
        if cls is PathEvent:
            self.last_bad[idx] = max(self.last_bad[idx], r.ts // NS)
            if r.sport is not None:
                self.path_sport[idx] = r.sport
            if r.ts >= self.ev_ts[idx]:
                self.ev_ts[idx], self.ev_state[idx] = r.ts, 2 if r.state == "down" else 1
            if r.state == "down":
                _in_order(self.down_events, (r.ts, idx), lambda e: e[0])
        elif cls is ProbePath:
            old = self.probe_paths.get(idx)
            if old is None or r.ts >= old[0]:
                self.probe_paths[idx] = (r.ts, r.fwd_hops, r.rev_hops)
                if r.probed_sport is not None:
                    self.path_sport[idx] = r.probed_sport
                if r.fwd_complete and r.rev_complete:
                    self.whole.add(idx)
                    for sport in r.sports.split(","):
                        if sport.strip().isdigit():
                            self.flow_route[(*self.keys[idx][:4], int(sport))] = idx
                else:
                    self.whole.discard(idx)
                if old is None or old[1:] != (r.fwd_hops, r.rev_hops):
                    self.dirty_paths.add(idx)
        elif cls is InterfaceAddress:
            end = (r.device, r.port)
            if self.addresses.get(r.address) != end:
                self.addresses[r.address] = end
                self.addr_version += 1
        elif cls is PortSample:
            old = self.port_samples.get((r.device, r.port))
            if old is None or r.ts >= old.ts:
                self.port_samples[(r.device, r.port)] = r
        elif cls is PortRates:
            _in_order(self.port_rates.setdefault((r.device, r.port), deque()), r, _ts)
        elif cls is LinkEvent:
            _in_order(self.link_events.setdefault((r.device, r.port), deque()), r, _ts)
        elif cls is QueueRates:
            _in_order(self.queue_rates.setdefault((r.device, r.port), {}).setdefault(r.queue, deque()), r, _ts)
        elif cls is HostNicSample:
            old = self.nic_samples.get((r.host, r.nic))
            was = old.oper_status if old is not None else None
            if r.oper_status not in (None, "up") or was not in (None, "up"):  # down, or back up
                key = (r.host, r.nic)
                self.nic_changed[key] = max(self.nic_changed.get(key, -1), r.ts // NS)
            if old is None or r.ts > old.ts:
                self.nic_samples[(r.host, r.nic)] = r
                if old is not None:
                    self.nic_prev[(r.host, r.nic)] = old

    def prune(self, now_ns: int) -> None:
        horizon = now_ns - self.span * NS
        while self.down_events and self.down_events[0][0] < horizon:
            self.down_events.popleft()
        for q in self.port_rates.values():
            while len(q) > 1 and q[0].ts < horizon:  # the latest sample stays: polls can be slow
                q.popleft()
        for end, queues in list(self.queue_rates.items()):
            for name in [n for n, q in queues.items() if q[-1].ts < horizon]:
                del queues[name]  # a queue not heard of within the context says nothing now
            for q in queues.values():
                while q[0].ts < horizon:
                    q.popleft()
            if not queues:
                del self.queue_rates[end]
        for q in self.link_events.values():
            while q and q[0].ts < now_ns - self.flap_window_ns:
                q.popleft()
        for nic in [n for n, second in self.nic_changed.items() if second < horizon // NS - 2]:
            del self.nic_changed[nic]

    # -- per-step statistics ----------------------------------------------------------------------
    def stats(self, now_ns: int) -> PathStats:
        P, C = self.P, self.C
        now_s = now_ns // NS
        sec = self.sec[:P]
        valid = (sec >= now_s - self.span) & (sec <= now_s + 1)  # +1: small clock offsets
        sent = np.where(valid, self.sent[:P], 0)
        recv = np.where(valid, self.recv[:P], 0)
        newest = np.where(valid, sec, -1).max(axis=1)
        rows = np.arange(P)
        col = newest % C
        last_sent, last_recv = sent[rows, col], recv[rows, col]
        has = newest >= 0
        # fresh against the newest data, not the clock: when windows reach the service late (a loaded
        # host, a slow ingest) every path would go stale at once, nothing would clear an element, and
        # any down path would be pinned on a switch
        fresh = has & (newest >= min(now_s, self.newest) - 3)
        # loss counts only windows after the path's latest trouble (and the window after it): the
        # windows a link went down or came back in lose part of their exchanges, which is not partial
        # loss; so do its peers' paths around a NIC's own down/up, which they may lose probes to
        # without ever calling the path down. The newest window counts too: an agent holds back a
        # window whose tail went unanswered until its path answers again or is reported down
        last_bad = self.settled_after(P)
        settled_ok = valid & (recv > 0) & (sec > last_bad[:, None] + 1)
        sent_ok = np.where(settled_ok, sent, 0).sum(axis=1)
        lost_ok = np.where(settled_ok, sent - recv, 0).sum(axis=1)
        recent_ok = settled_ok & (sec > newest[:, None] - RECENT_LOSS)
        sent_recent = np.where(recent_ok, sent, 0).sum(axis=1)
        lost_recent = np.where(recent_ok, sent - recv, 0).sum(axis=1)
        # the settled counts by age (0: the fabric's newest second), for the sequential loss test
        age = np.where(settled_ok, np.clip(self.newest - sec, 0, C), C)
        sent_age = np.zeros((P, C + 1), np.int64)
        lost_age = np.zeros((P, C + 1), np.int64)
        sent_age[rows[:, None], age] = np.where(settled_ok, sent, 0)  # one slot per second: no collisions
        lost_age[rows[:, None], age] = np.where(settled_ok, sent - recv, 0)  # below C
        # down episodes, in time order; a missing window keeps the previous state
        order = (np.arange(now_s - C + 1, now_s + 1)) % C
        zero_t = (valid & (sent > 0) & (recv == 0))[:, order]
        at = np.where(valid[:, order], np.arange(C), -1)
        np.maximum.accumulate(at, axis=1, out=at)
        state = np.where(at >= 0, np.take_along_axis(zero_t, np.maximum(at, 0), axis=1), False)
        episodes = state[:, 0].astype(np.int32) + (state[:, 1:] & ~state[:, :-1]).sum(axis=1)
        if self.down_events:
            ev = np.fromiter((i for _, i in self.down_events), np.int64, len(self.down_events))
            episodes = np.maximum(episodes, np.bincount(ev, minlength=P)[:P])
        # state now: a down event holds until an up event; a silent latest window is down too,
        # unless an up event came after it
        ev_down = self.ev_state[:P] == 2
        zero_last = fresh & (last_sent > 0) & (last_recv == 0) & (
            (self.ev_state[:P] != 1) | (newest * NS >= self.ev_ts[:P]))
        down = ev_down | zero_last
        up = fresh & (last_recv > 0) & ~down
        inflation = self._inflation(P, now_s, newest)
        return PathStats(sent_ok, lost_ok, sent_recent, lost_recent, episodes, down, up, inflation, last_recv,
                         sent_age[:, :C], lost_age[:, :C])

    def explain_loss(self, paths: np.ndarray) -> None:
        """The paths' losses up to the newest second are a loss finding's that just ended: they are
        no evidence against any other link the paths cross (correlator/sequential.py)."""
        self.loss_explained[paths] = self.newest

    def settled_after(self, P: int) -> np.ndarray:
        """Per path, the second of its latest trouble (silent window, path event, a NIC's own down
        or back-up, the end of a loss finding on a link it crosses): loss counts only from two
        seconds after it."""
        last_bad = np.maximum(self.last_bad[:P], self.loss_explained[:P])
        if self.nic_changed:  # a NIC that went down or came back: every path through it
            changed = np.full(len(self.nic_ids), -1, np.int64)
            for nic, second in self.nic_changed.items():
                if (nid := self.nic_ids.get(nic)) is not None:
                    changed[nid] = second
            last_bad = np.maximum(last_bad, np.maximum(changed[self.src_nic[:P]], changed[self.dst_nic[:P]]))
        return last_bad

    def settled_second(self, s: int, last_bad: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Per path, the settled (sent, lost) of second `s` while it is still in the rings."""
        if s <= self.newest - self.C:
            return None
        P, col = len(last_bad), s % self.C
        ok = (self.sec[:P, col] == s) & (self.recv[:P, col] > 0) & (s > last_bad + 1)
        sent = np.where(ok, self.sent[:P, col], 0).astype(np.int64)
        return sent, np.where(ok, sent - self.recv[:P, col], 0).astype(np.int64)

    def _inflation(self, P: int, now_s: int, newest: np.ndarray) -> np.ndarray:
        rows = np.arange(P)
        recent = np.full((P, RECENT), np.nan, np.float32)
        for k in range(RECENT):
            s = newest - k
            col = s % self.C
            recent[:, k] = np.where(self.sec[rows, col] == s, self.delay[rows, col], np.nan)
        recent.sort(axis=1)  # NaN last
        n = np.isfinite(recent).sum(axis=1)
        med = recent[rows, np.maximum(n - 1, 0) // 2]  # lower median: the conservative one
        cur_bucket = now_s // self.bucket_s
        live = self.bsec[:P] > cur_bucket - BUCKETS
        base = np.where(live, self.bmin[:P], np.inf).min(axis=1)
        judged = (n >= 2) & np.isfinite(base) & (newest - self.first[:P] >= WARM_S)
        return np.where(judged, med - base, np.nan)

    # -- switch-side state -------------------------------------------------------------------------
    def latest_rates(self, end: End) -> PortRates | None:
        q = self.port_rates.get(end)
        return q[-1] if q else None


def _ts(record) -> int:
    return record.ts


def _in_order(queue: deque, item, ts: Callable[[Any], int]) -> None:
    """Append, or insert in time order what comes late (a member's re-read of the streams after a
    takeover hands older records after newer ones): the queues are pruned from the left and read
    as newest last, so an old record behind a new one would count as recent for ever."""
    if queue and ts(item) < ts(queue[-1]):
        bisect.insort(queue, item, key=ts)
    else:
        queue.append(item)
