"""The stored schema (measurement, tags, time, fields and their types), read from the code.

Records declare theirs (`TelemetryRecord.measurement/tag_keys/time_attr`, field types through
`nms.store.base.declare_fields`); generic points are described here beside the module that writes
them, with their declared types where the writer declares them. `nms dashboards schema` prints
this; docs/schema.md is its markdown output (a test keeps them equal).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points

from correlator.actions import manager as action_manager
from nms.app.dashboards import incident_points
from nms.records import INGEST_KINDS, TelemetryRecord
from nms.store.base import declared_fields
from nms.store.influx_downsampling import DOWNSAMPLED, column

# Who writes each record measurement besides POST /ingest/<kind>.
_WRITERS = {
    "port_counters": "switch collectors through the poller (SNMP, gNMI, UFM, CLI)",
    "port_rates": "the poller (counter math on port_counters)",
    "link_event": "the poller (oper-status changes; UFM link events)",
    "lldp_neighbor": "the poller (SNMP LLDP-MIB, UFM links, CLI lldpctl)",
    "device_facts": "the poller (every switch collector)",
    "interface_address": "the poller (SNMP IP-MIB)",
    "clock_solution": "the service's clock solve (from clock_edge)",
    "probe_window": "host agents (stored with *_corr_ns filled by the service's clock sync)",
    "nccl_collective_perf": "the service (correlator/jobs_nccl.py: a collective assembled from its ranks' "
                            "nccl_* records)",
}


@dataclass(frozen=True)
class Measurement:
    name: str
    source: str  # the record type or the module that writes it
    written_by: str
    tags: tuple[str, ...]
    time: str  # the attribute the timestamp comes from
    fields: dict[str, str]  # field -> stored type; "*" names fields that vary
    note: str = ""


def _record_subclasses() -> list[type[TelemetryRecord]]:
    out, todo = [], list(TelemetryRecord.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if "measurement" in cls.__dict__:
            out.append(cls)
    return out


def _records() -> list[Measurement]:
    kinds = {cls: kind for kind, cls in INGEST_KINDS.items()}
    out = []
    for cls in _record_subclasses():
        writers = [f"POST /ingest/{kinds[cls]}"] if cls in kinds else []
        if cls.measurement in _WRITERS:
            writers.append(_WRITERS[cls.measurement])
        declared = declared_fields(cls.measurement)
        out.append(Measurement(cls.measurement, cls.__name__, "; ".join(writers) or "nothing yet",
                               tuple(cls.tag_keys), cls.time_attr, {f: declared[f] for f in cls._value_keys}))
    return out


def _generic() -> list[Measurement]:
    """GenericPoint kinds the service and its plugins write (POST /ingest/points, collectors)."""
    for ep in entry_points(group="nms.collectors"):
        ep.load()  # a collector declares its generic points' field types on import
    return [
        Measurement("device_config", "collectors/cli/config.py", "the CLI collector (configuration snapshots)",
                    ("device",), "ts", dict(declared_fields("device_config"))),
        Measurement("device_config_change", "collectors/cli/config.py", "the CLI collector (a snapshot differs)",
                    ("device",), "ts", dict(declared_fields("device_config_change"))),
        Measurement("ufm_event", "collectors/ufm/events.py", "the UFM collector",
                    ("ufm", "device", "port", "event", "severity", "category"), "ts",
                    {"id": "integer", "description": "string", "event_type": "string", "counter": "string"},
                    "tags and string fields UFM leaves empty are absent"),
        Measurement("ufm_alarm", "collectors/ufm/events.py", "the UFM collector",
                    ("ufm", "device", "port", "alarm", "severity"), "ts",
                    {"id": "integer", "event_count": "integer", "description": "string", "reason": "string",
                     "event_type": "string", "counter": "string"},
                    "tags and string fields UFM leaves empty are absent"),
        Measurement("snmp_extra", "collectors/snmp/collector.py", "the SNMP collector (configured extra OIDs)",
                    ("device", "object", "index"), "ts", {"value": "integer", "text": "string"},
                    "one of the two per point: numbers in value, everything else in text"),
        Measurement("agent_stats", "hostprobe/agent.py", "host agents (POST /ingest/points, every stats_interval)",
                    ("host",), "ts", {"*": "integer or float"},
                    "the agent's counters (targets, paths, paths_up, paths_down, cpu_user_s, max_rss_kib, ...)"),
        Measurement(incident_points.MEASUREMENT, "nms/app/dashboards/incident_points.py",
                    "the service (each incident event: opened, updated, resolved, acknowledged)",
                    incident_points.TAGS, "ts", dict(declared_fields(incident_points.MEASUREMENT))),
        Measurement(action_manager.MEASUREMENT, "correlator/actions/manager.py",
                    "the service (each action event: proposed, approved, rejected, applied, failed, rolled_back, "
                    "expired; the audit log itself is in SQLite, docs/actions.md)",
                    action_manager.TAGS, "ts", dict(declared_fields(action_manager.MEASUREMENT))),
    ]


def measurements() -> list[Measurement]:
    return sorted(_records() + _generic(), key=lambda m: m.name)


def by_name() -> dict[str, Measurement]:
    return {m.name: m for m in measurements()}


def as_json() -> str:
    return json.dumps([asdict(m) for m in measurements()], indent=2) + "\n"


def as_markdown() -> str:
    lines = ["# Stored schema", "",
             "Generated by `nms dashboards schema` from the record declarations (`nms/records.py`) and the",
             "modules that write generic points; do not edit by hand (a test compares this file with the",
             "command's output). Both backends store the same schema; in InfluxDB 1.x `unsigned` fields are",
             "signed 64-bit integers holding the same bits (docs/configuration.md, \"Field types\").", "",
             "| measurement | written by | tags | time from |", "|---|---|---|---|"]
    for m in measurements():
        lines.append(f"| `{m.name}` | {m.written_by} | {', '.join(m.tags)} | `{m.time}` |")
    for m in measurements():
        lines += ["", f"## `{m.name}`", "", f"Source: `{m.source}`. Tags: {', '.join(f'`{t}`' for t in m.tags)}."]
        if m.note:
            lines.append(f"Note: {m.note}.")
        lines += ["", "| field | type |", "|---|---|"]
        lines += [f"| `{f}` | {t} |" for f, t in m.fields.items()]
    lines += ["", "## Downsampled tiers (InfluxDB, opt-in)", "",
              "With `store.influxdb.downsampling.enabled`, each tier's retention policy holds these measurements",
              "with the same tags, one point per `every` (docs/configuration.md, \"Downsampling\"):", "",
              "| measurement | fields |", "|---|---|"]
    for name, spec in DOWNSAMPLED.items():
        cols = [f"`{column(f, agg, i == 0)}` ({agg})" for f, aggs in spec for i, agg in enumerate(aggs)]
        lines.append(f"| `{name}` | {', '.join(cols)} |")
    return "\n".join(lines) + "\n"
