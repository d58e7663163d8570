"""Retention policies and continuous queries that downsample the InfluxDB store (opt-in).

Each tier (config `store.influxdb.downsampling.tiers`) is a retention policy filled by one
continuous query per downsampled measurement, computed from the tier before it (the first from
the raw data): `GROUP BY time(every), *` keeps every tag. A field keeps its name for its first
aggregate (mean, sum or min) and gets `_max` for its maximum, so that a dashboard query such as
`SELECT mean("in_utilization")` reads raw data and every tier alike.

`reconcile` runs once per start, from the store's sender thread, and is idempotent:
- a missing retention policy is created; one with another duration is altered (logged);
- continuous queries are named `nms_ds_<measurement>_<tier>_<hash of the definition>`: ours whose
  definition changed (another name) are dropped and created anew; other people's are never touched.
InfluxDB cannot alter a continuous query, hence the hash in the name.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nms.config.models import InfluxStoreConfig

log = logging.getLogger(__name__)

CQ_PREFIX = "nms_ds_"

# measurement -> (field, aggregates); the first aggregate keeps the field's name, "max" adds `_max`.
_RATES = ("in_bps", "out_bps", "in_utilization", "out_utilization", "in_errors_ps", "out_errors_ps",
          "in_discards_ps", "out_discards_ps")
_DELAYS = tuple(f"owd_{d}_{s}{c}_ns" for d in ("fwd", "rev") for s in ("min", "p50", "p99") for c in ("", "_corr")) + \
    ("rtt_min_ns", "rtt_p50_ns", "rtt_p99_ns")
DOWNSAMPLED: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "port_rates": tuple((f, ("mean", "max")) for f in _RATES),
    "probe_window": (("sent", ("sum",)), ("received", ("sum",)))
    + tuple((f, ("min",) if "_min_" in f else ("mean", "max")) for f in _DELAYS),
    "clock_solution": (("offset_ns", ("mean", "max")), ("drift_ppb", ("mean",)), ("bound_ns", ("mean", "max"))),
    "queue_rates": tuple((f, ("mean", "max")) for f in ("transmit_bps", "dropped_pps", "ecn_marked_pps")),
}


def column(field_name: str, agg: str, first: bool) -> str:
    """The name an aggregate of a raw field has in a downsampled tier."""
    return field_name if first else f"{field_name}_{agg}"


def influx_duration(seconds: float) -> str:
    """Whole seconds as an InfluxQL duration literal in the largest exact unit (86400 -> 1d)."""
    s = int(seconds)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_go_duration(text: str) -> float:
    """InfluxDB's SHOW RETENTION POLICIES durations ("720h0m0s"; "0s" = infinite) in seconds."""
    return sum(float(n) * _GO_UNITS[u] for n, u in _GO_DURATION.findall(text))


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ContinuousQuery:
    name: str
    measurement: str
    tier: str
    select: str  # SELECT ... INTO ... FROM ... GROUP BY ...: also runnable by hand with a WHERE time range
    create: str


def continuous_queries(cfg: InfluxStoreConfig) -> list[ContinuousQuery]:
    """The continuous queries the configuration asks for, in tier order."""
    db, out = cfg.database, []
    source_rp, first_tier = cfg.retention_policy, True  # None: the database's default policy
    for tier in cfg.downsampling.tiers:
        for measurement, spec in DOWNSAMPLED.items():
            parts = []
            for name, aggs in spec:
                for i, agg in enumerate(aggs):
                    # From a tier, each aggregate reads its own column: mean of means, max of maxima.
                    src = name if first_tier else column(name, agg, i == 0)
                    parts.append(f"{agg}({_q(src)}) AS {_q(column(name, agg, i == 0))}")
            source = f"{_q(db)}.{_q(source_rp) if source_rp else ''}.{_q(measurement)}"
            select = (f"SELECT {', '.join(parts)} INTO {_q(db)}.{_q(tier.retention_policy)}.{_q(measurement)} "
                      f"FROM {source} GROUP BY time({influx_duration(tier.every)}), *")
            resample = influx_duration(tier.resample_for or 2 * tier.every)
            body = f"RESAMPLE FOR {resample} BEGIN {select} END"
            digest = hashlib.sha256(body.encode()).hexdigest()[:8]
            name = f"{CQ_PREFIX}{measurement}_{tier.retention_policy}_{digest}"
            out.append(ContinuousQuery(name, measurement, tier.retention_policy, select,
                                       f"CREATE CONTINUOUS QUERY {_q(name)} ON {_q(db)} {body}"))
        source_rp, first_tier = tier.retention_policy, False
    return out


@dataclass
class Outcome:
    """What one reconcile did (logged, and shown by the store's health)."""

    created: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    continuous_queries: list[str] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"created": self.created, "altered": self.altered, "dropped": self.dropped,
                "continuous_queries": self.continuous_queries, "error": self.error}


Run = Callable[[str], list[dict[str, Any]]]  # one InfluxQL statement -> its series (raises StoreError)


def _retention_policies(run: Run, db: str) -> dict[str, tuple[float, bool]]:
    series = run(f"SHOW RETENTION POLICIES ON {_q(db)}")
    rows = [dict(zip(s["columns"], v)) for s in series for v in s["values"]]
    return {r["name"]: (parse_go_duration(r["duration"]), bool(r["default"])) for r in rows}


def _ensure_policy(
    run: Run, db: str, name: str, seconds: float, existing: dict[str, tuple[float, bool]], outcome: Outcome
) -> None:
    duration = influx_duration(seconds)
    if name not in existing:
        run(f"CREATE RETENTION POLICY {_q(name)} ON {_q(db)} DURATION {duration} REPLICATION 1")
        outcome.created.append(f"retention policy {name} ({duration})")
    elif existing[name][0] != seconds:
        run(f"ALTER RETENTION POLICY {_q(name)} ON {_q(db)} DURATION {duration}")
        was = "infinite" if existing[name][0] == 0 else influx_duration(existing[name][0])
        outcome.altered.append(f"retention policy {name}: duration {was} -> {duration}")


def reconcile(run: Run, cfg: InfluxStoreConfig) -> Outcome:
    """Make the database's retention policies and our continuous queries match the configuration."""
    db, ds, outcome = cfg.database, cfg.downsampling, Outcome()
    policies = _retention_policies(run, db)
    if ds.raw_duration is not None:
        raw = cfg.retention_policy or next((n for n, (_, default) in policies.items() if default), "autogen")
        _ensure_policy(run, db, raw, ds.raw_duration, policies, outcome)
    for tier in ds.tiers:
        _ensure_policy(run, db, tier.retention_policy, tier.duration, policies, outcome)
    wanted = {cq.name: cq for cq in continuous_queries(cfg)}
    present = {row[0] for s in run("SHOW CONTINUOUS QUERIES") if s.get("name") == db for row in s["values"]}
    for name in sorted(present - wanted.keys()):
        if name.startswith(CQ_PREFIX):  # ours, from an older definition
            run(f"DROP CONTINUOUS QUERY {_q(name)} ON {_q(db)}")
            outcome.dropped.append(f"continuous query {name}")
    for name, cq in wanted.items():
        if name not in present:
            run(cq.create)
            outcome.created.append(f"continuous query {name}")
    outcome.continuous_queries = sorted(wanted)
    return outcome
