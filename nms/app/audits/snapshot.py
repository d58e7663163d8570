"""What the audits read (a SnapshotSource, wired by the service) -> one Snapshot for a run: the
poller's recent window and topology (on the event loop, where the poller changes them), then the
clock's newest solutions, the correlator's lossy links and what the store holds (probe windows,
configuration snapshots) in a worker thread."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nms.app.audits.model import ProbedPath, Snapshot
from nms.config.models import FabricConfig
from nms.store.base import Query, TimeSeriesStore

if TYPE_CHECKING:
    from nms.app.audits.escalation import IncidentFeed
    from nms.app.clock_service import ClockService
    from nms.app.polling import Poller

log = logging.getLogger(__name__)
NS = 10**9


@dataclass
class SnapshotSource:
    """What the audits read, wired by the service: the poller (its recent window and topology), the
    fabric inventory, the store (probe windows, configuration snapshots, host NICs), the clock sync
    (None when disabled) and the feed holding the correlator's latest findings (None without a
    correlator)."""

    fabric: FabricConfig
    poller: Poller
    store: TimeSeriesStore
    clock: ClockService | None = None
    feed: IncidentFeed | None = None


def from_poller(source: SnapshotSource, now_ns: int | None = None) -> Snapshot:
    """The in-memory part (call on the event loop)."""
    poller = source.poller
    now_ns = time.time_ns() if now_ns is None else now_ns
    polled = {d for (_, d), st in poller.status.items() if st.state == "ok"}
    for device in list(polled):
        polled |= poller.recent.covered.get(device, set())
    return Snapshot(now_ns=now_ns, fabric=source.fabric, topology=poller.topology() if poller.status else None,
                    polled=polled, samples=dict(poller.recent.samples), rates=dict(poller.recent.rates),
                    facts=dict(poller.recent.facts))


def complete(snap: Snapshot, source: SnapshotSource, probe_max_age_s: float) -> Snapshot:
    """The rest (blocking reads; call in a worker thread)."""
    if source.clock is not None:
        snap.clock = source.clock.snapshot()[0]
    if source.feed is not None:
        snap.lossy_links = {f.element: f.evidence.get("loss", {}) for f in source.feed.correlator_findings
                            if f.kind == "corrupting_link" and f.element_kind == "link"}
    try:
        snap.probed = probed_paths(source.store, snap.now_ns, probe_max_age_s)
    except Exception as e:
        log.warning("audit: probe windows unreadable: %s", e)
    try:
        for series in source.store.latest("device_config", fields=["text"]):
            device, text = series.tags.get("device"), series.values[0][1] if series.values else None
            if device and isinstance(text, str):
                snap.configs[device] = text
    except Exception as e:
        log.warning("audit: configuration snapshots unreadable: %s", e)
    try:
        snap.host_nics = host_nic_settings(source.store, snap.now_ns, probe_max_age_s)
    except Exception as e:
        log.warning("audit: host NIC samples unreadable: %s", e)
    return snap


def host_nic_settings(store, now_ns: int, max_age_s: float) -> dict[tuple[str, str], dict[str, int]]:
    """The newest MTU and speed each agent reported per NIC, if not older than `max_age_s`."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for series in store.latest("host_nic", fields=["mtu", "speed_bps"]):
        host, nic = series.tags.get("host"), series.tags.get("nic")
        if not (host and nic and series.values) or series.values[0][0] < now_ns - int(max_age_s * NS):
            continue
        row = dict(zip(series.columns[1:], series.values[0][1:]))
        values = {k: int(v) for k, v in row.items() if k in ("mtu", "speed_bps") and isinstance(v, int) and v > 0}
        if values:
            out[(host, nic)] = values
    return out


def probed_paths(store, now_ns: int, max_age_s: float) -> list[ProbedPath]:
    series = store.query(Query(measurement="probe_window", start=max(0, now_ns - int(max_age_s * NS)),
                               end=now_ns + NS, fields=["sent"], limit=1))
    return sorted({ProbedPath(s.tags["src_host"], s.tags["dst_host"], s.tags["path_id"]) for s in series
                   if s.values and {"src_host", "dst_host", "path_id"} <= s.tags.keys()},
                  key=lambda p: (p.src_host, p.dst_host, p.path_id))
