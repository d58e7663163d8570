"""The whole stack on a lab: the fabric (`lab.lab`), a real `nms serve` on a free port, and a
probe agent in every host namespace. What `nms demo` runs, and the harness of the lab benchmarks
and end-to-end tests (lab/mesh.py adds their API helpers).

The service listens on 127.0.0.1 and on the lab's management gateway (where the agents in the host
namespaces reach it). SNMP polling is off unless `snmp_interval` is given, gNMI streaming unless
`gnmi_interval` is (both take CPU from the probes); `service_config` sections are merged into the
lab's generated config. Everything needs root.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import yaml

from hostprobe.config import ProbeSettings
from lab import agent_procs, cleanup
from lab import lab as lab_mod
from lab.state import LabDir, topology_of
from lab.topology import Spec
from nms.app.local_daemons import free_port
from nms.config.models import AgentsConfig

PEERS_RANDOM = AgentsConfig.model_fields["peers_random"].default
SPORTS = ProbeSettings.model_fields["sports"].default
MISS_CHANCE = 1e-3  # above this chance that some agent's source ports miss a spine, no count is expected


def expected_paths(spec: Spec, peers_random: int = PEERS_RANDOM, sports: int = SPORTS) -> int | None:
    """Probe paths per agent when every host is its peer (the service adds `peers_random` random
    peers under other leaves to those under its own): one to each host under its leaf, one per spine
    to each other host (symmetric ECMP hashing). None when chance decides the count: the random
    peers, or `sports` source ports per peer too few to hash onto every spine for every pair."""
    others = (spec.leaves - 1) * spec.hosts_per_leaf
    if others > peers_random:
        return None
    pairs = spec.leaves * spec.hosts_per_leaf * others
    if pairs * spec.spines * (1 - 1 / spec.spines) ** sports > MISS_CHANCE:
        return None
    return spec.hosts_per_leaf - 1 + spec.spines * others


class LabStack:
    def __init__(self, prefix: str, mgmt: str, link_rate_bps: int = 100_000_000, root: str | None = None,
                 snmp_interval: str | None = None, service_config: dict | None = None,
                 gnmi_interval: str | None = None, agent_config: dict | None = None, **shape):
        self.prefix = prefix
        self.spec = Spec(link_rate_bps=link_rate_bps, mgmt_subnet=mgmt, prefix=prefix, **shape)
        self.dir = LabDir(root or tempfile.mkdtemp(prefix="nms-lab-stack-"))  # under /tmp: lldpd needs access
        self.port = free_port()
        self.snmp_interval = snmp_interval
        self.gnmi_interval = gnmi_interval
        self.service_config = service_config or {}
        self.service: subprocess.Popen | None = None
        self.service_started_ns = 0  # when the running service was started (wait_service_ready's `since`)
        self.probe_options: dict = {}  # the agents' extra probe settings (up(probe_options=))
        self.agent_config = agent_config or {}  # more top-level sections of every agent's config (e.g. steering)

    def up(self, rate: float | None = None, start_agents: bool = True, probe_options: dict | None = None) -> LabStack:
        cleanup.remove(self.prefix, self.dir)
        lab_mod.up(self.dir, self.spec)
        self.state = self.dir.load()
        self.topo = topology_of(self.state)
        self.token = self.dir.token.read_text().strip()
        config = yaml.safe_load(self.dir.config.read_text())
        config["api"]["port"] = self.port
        intervals = {"snmp": self.snmp_interval, "gnmi": self.gnmi_interval}
        polling = any(intervals.values())
        for switch in config["fabric"]["switches"]:
            collectors = switch["collectors"]
            for name, interval in intervals.items():
                if interval is not None and name in collectors:
                    collectors[name]["interval"] = interval
                elif interval is None and (polling or name == "gnmi"):  # not polled: not configured
                    collectors.pop(name, None)
        if not polling:
            config["polling"] = {"enabled": False}
        for section, values in self.service_config.items():
            config[section] = {**config.get(section, {}), **values}
        self.config = self.dir.root / "nms-stack.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.config.chmod(0o600)
        self.start_service()
        self.probe_options = probe_options or {}
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
        self.service_started_ns = time.time_ns()
        self.service = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(self.config)],
                                        stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.service.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        tail = (self.dir.root / "service.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"service did not come up (exit {self.service.poll()}); "
                           f"{self.dir.root / 'service.log'} ends:\n{tail}")

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
        agent_procs.start(self.dir, self.agent_url, hosts, rate, probe_options, self.agent_config)

    def down(self) -> None:
        try:
            agent_procs.stop(self.dir)
        except Exception:
            pass
        self.stop_service()
        lab_mod.down(self.dir, self.prefix)

    def agent_status(self) -> dict:
        return agent_procs.status(self.dir)

    def wait_traced(self, timeout: float = 30.0) -> dict:
        """Until every agent probes its full set of paths (expected_paths, where it can be known) and
        all are up."""
        hosts = [n.name for n in self.topo.by_role("host")]
        peers_random = self.service_config.get("agents", {}).get("peers_random", PEERS_RANDOM)
        want = expected_paths(self.spec, peers_random, self.probe_options.get("sports", SPORTS))
        deadline = time.monotonic() + timeout
        while True:
            status = self.agent_status()
            ok = all(h in status and (s := status[h].get("stats")) and s.get("tracing") == 0
                     and s.get("paths") == s.get("paths_up") and (want is None or s.get("paths") == want)
                     for h in hosts)
            if ok:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"agents did not trace every path within {timeout} s (want {want} each): "
                                   + json.dumps(_untraced(status, hosts)))
            time.sleep(0.5)

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"},
                             timeout=30, **kw)


def _untraced(status: dict, hosts: list[str]) -> dict:
    """Per host, what wait_traced looked at, short: whether its agent runs, its path counts, the paths
    not up (peer, NIC, sport, state), the responses that said no one listens there."""
    keys = ("paths", "paths_up", "paths_down", "tracing", "port_unreachable", "path_down_events", "uptime_s")
    out = {}
    for h in hosts:
        entry = status.get(h, {})
        stats = entry.get("stats") or {}
        out[h] = {"running": entry.get("running"), **{k: stats.get(k) for k in keys},
                  "not_up": [f"{p['peer']}:{p['peer_nic']} sport {p['sport']} {p['state']}"
                             for p in entry.get("paths") or [] if p.get("state") != "up"][:12]}
    return out

