"""The lab stack (lab.stack: fabric, `nms serve`, an agent per host) with query helpers: the
harness of the agent and correlator benchmarks and of the lab tests (which import it from here).
"""

from __future__ import annotations

import time

from lab import paths
from lab.stack import LabStack

PROBE_PORT = 33434  # the agents' default probe port


class MeshLab(LabStack):
    """The lab stack (lab.stack) with the query helpers the benchmarks and tests use."""

    # -- the service's API ---------------------------------------------------------------------------
    def query(self, measurement: str, start_ns: int, end_ns: int | None = None, **tags: str) -> list[dict]:
        """Rows (dicts with the series' tags merged in) of one measurement in [start, end)."""
        body = {"measurement": measurement, "start": start_ns, "end": end_ns or time.time_ns() + 10**10,
                "tags": {k: [v] for k, v in tags.items()}, "limit": 100_000}
        r = self.api("POST", "/telemetry/query", json=body)
        r.raise_for_status()
        rows = []
        for series in r.json()["series"]:
            for values in series["values"]:
                rows.append({**series["tags"], **dict(zip(series["columns"], values))})
        return rows

    def probed_paths(self) -> dict[tuple[str, str, str], int]:
        """{(src, dst, path_id): probing source port} of every agent right now."""
        return {(host, p["peer"], p["path_id"]): p["sport"]
                for host, a in self.agent_status().items() for p in a.get("paths", [])}

    def wait_service_ready(self, since_ns: int, timeout: float = 60.0) -> None:
        """After a (re)start of the service at `since_ns`: until it can see a fault again, i.e. every
        agent registered with it, re-announced its probe paths (their hops localize loss) and reports
        windows, and every switch was polled. /health answers long before that; a fault injected in
        between is found late or not at all."""
        hosts = sorted(n.name for n in self.topo.by_role("host"))

        def missing() -> list[str]:
            out = [f"agent {h}" for h in sorted(set(hosts) - {a["host"] for a in self.api("GET", "/agents").json()})]
            for measurement in ("probe_path", "probe_window"):
                reported = {r["src_host"] for r in self.query(measurement, since_ns)}
                out += [f"{measurement} from {h}" for h in hosts if h not in reported]
            out += [f"poll of {d['device']} ({d['collector']})" for d in self.api("GET", "/devices").json()
                    if (d.get("last_success_ns") or 0) < since_ns]
            return out

        deadline = time.monotonic() + timeout
        while (left := missing()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service was not ready {timeout:g} s after its start: no {', '.join(left)}")
            time.sleep(0.5)

    def command(self, kind: str, args: dict | None = None, hosts: list[str] | None = None) -> list[dict]:
        r = self.api("POST", "/agents/commands", json={"kind": kind, "args": args or {}, "hosts": hosts})
        r.raise_for_status()
        return r.json()


def legs_through(topo, src: str, dst: str, sport: int, link: str, direction: tuple[str, str] | None = None,
                 port: int = PROBE_PORT) -> set:
    """Which legs of the exchange src:sport <-> dst:port cross `link` (in `direction` only, if given):
    "fwd" (the probe), "rev" (the reply), as the kernel routes them (`ip route get` on the leaves)."""
    ln = topo.find_link(link)
    out = set()
    for leg, (a, b, sp, dp) in (("fwd", (src, dst, sport, port)), ("rev", (dst, src, port, sport))):
        spine = paths.predict(topo, a, b, "udp", sp, dp)["spine"]
        if spine is None:
            continue
        a_leaf, b_leaf = topo.link_of_port(a, "eth0").a.node, topo.link_of_port(b, "eth0").a.node
        for x, y in ((a_leaf, spine), (spine, b_leaf)):
            if {x, y} == {ln.a.node, ln.b.node} and (direction is None or (x, y) == direction):
                out.add(leg)
    return out
