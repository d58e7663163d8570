"""A fabric lab with the service and one probe agent per host: the harness of the agent benchmarks
and of tests/lab/test_agent_mesh.py (which imports it from here).

The service is a real `nms serve` process on a free port, listening on 127.0.0.1 and on the lab's
management gateway (where the agents in the host namespaces reach it), with SNMP polling off (not
under test, and it would take CPU from the probes). Agents are started with `nms lab agents start`
machinery (nms.lab.agents). Everything needs root.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from nms.lab import agents, cleanup, paths
from nms.lab import lab as lab_mod
from nms.lab.state import LabDir, topology_of
from nms.lab.topology import Spec

REPO = Path(__file__).resolve().parents[1]
PROBE_PORT = 33434  # the agents' default probe port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MeshLab:
    def __init__(self, prefix: str, mgmt: str, link_rate_bps: int = 100_000_000, root: str | None = None, **shape):
        self.prefix = prefix
        self.spec = Spec(link_rate_bps=link_rate_bps, mgmt_subnet=mgmt, prefix=prefix, **shape)
        self.dir = LabDir(root or tempfile.mkdtemp(prefix="nms-lab-agent-"))  # under /tmp: lldpd needs access
        self.port = free_port()
        self.service: subprocess.Popen | None = None

    # -- lab and processes ------------------------------------------------------------------------
    def up(self, rate: float | None = None, start_agents: bool = True, probe_options: dict | None = None) -> MeshLab:
        cleanup.remove(self.prefix, self.dir)
        lab_mod.up(self.dir, self.spec)
        self.state = self.dir.load()
        self.topo = topology_of(self.state)
        self.token = self.dir.token.read_text().strip()
        config = yaml.safe_load(self.dir.config.read_text())
        config["api"]["port"] = self.port
        config["polling"] = {"enabled": False}
        self.config = self.dir.root / "nms-agent-test.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.config.chmod(0o600)
        self.start_service()
        if start_agents:
            self.start_agents(rate=rate, probe_options=probe_options)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def agent_url(self) -> str:
        return f"http://{self.topo.mgmt_gateway}:{self.port}"

    def start_service(self) -> None:
        log = open(self.dir.root / "service.log", "ab")
        self.service = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(self.config)],
                                        stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"service did not come up; see {self.dir.root / 'service.log'}")

    def stop_service(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(20)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait()
        self.service = None

    def start_agents(self, rate: float | None = None, hosts: list[str] | None = None,
                     probe_options: dict | None = None) -> None:
        agents.start(self.dir, self.agent_url, hosts, rate, probe_options)

    def down(self) -> None:
        try:
            agents.stop(self.dir)
        except Exception:
            pass
        self.stop_service()
        lab_mod.down(self.dir, self.prefix)

    # -- agents ----------------------------------------------------------------------------------------
    def agent_status(self) -> dict:
        return agents.status(self.dir)

    def wait_traced(self, timeout: float = 30.0) -> dict:
        """Until every agent probes its full set of paths (2 spines with symmetric ECMP hashing, every
        host a peer: one path to each host under the same leaf, one per spine to each other host) and
        all are up."""
        hosts = [n.name for n in self.topo.by_role("host")]
        hpl = self.spec.hosts_per_leaf
        want = hpl - 1 + 2 * (len(hosts) - hpl) if self.spec.spines == 2 and len(hosts) <= 13 else None
        deadline = time.monotonic() + timeout
        while True:
            status = self.agent_status()
            ok = all(h in status and (s := status[h].get("stats")) and s.get("tracing") == 0
                     and s.get("paths") == s.get("paths_up") and (want is None or s.get("paths") == want)
                     for h in hosts)
            if ok:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"agents did not trace every path within {timeout} s: "
                                   + json.dumps({h: status.get(h, {}).get("stats") for h in hosts}))
            time.sleep(0.5)

    # -- the service's API ---------------------------------------------------------------------------
    def api(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"},
                             timeout=30, **kw)

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
