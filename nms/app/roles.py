"""`nms serve --role`: which parts of the service a process runs (docs/cluster.md).

- api: the REST API (with a bus: ingest validates and publishes; otherwise it writes the store)
- poll: the switch collectors' polling and streams
- correlate: the correlator, clock solve, NCCL jobs, audits, actions and incident retention
- write: the bus's telemetry streams -> the store (needs cluster.bus)
- all: every role; with no bus configured, exactly the single process
"""

from __future__ import annotations

ROLES = ("api", "poll", "correlate", "write")


def parse_roles(text: str, has_bus: bool) -> frozenset[str]:
    """'api,write' -> {'api', 'write'}; 'all' -> every role the configuration allows. ValueError
    naming --role when a role is unknown or needs a bus that is not configured."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"--role: give one or more of {', '.join(ROLES)}, all (comma-separated)")
    unknown = [n for n in names if n not in (*ROLES, "all")]
    if unknown:
        raise ValueError(f"--role: unknown role {unknown[0]!r} (known: {', '.join(ROLES)}, all)")
    roles = set(names)
    if "all" in roles:
        roles.discard("all")
        roles.update(r for r in ROLES if r != "write" or has_bus)
    if "write" in roles and not has_bus:
        raise ValueError("--role write: needs a bus to consume (cluster.bus in the configuration); "
                         "without one, ingest writes the store itself")
    return frozenset(roles)
