"""The mesh lab served by a cluster (docs/cluster.md) instead of one `nms serve`: `nms cluster up`'s
launcher (nms/app/cluster_launcher.py) with the lab's config as its base, so the members poll the
lab's switches and the lab's agents report to every API worker in turn (`service.urls`). For the
tests and benchmarks that kill members during real faults (tests/lab/test_cluster_lab.py)."""

from __future__ import annotations

import os
import signal
import time

from lab import agent_procs
from lab.mesh import MeshLab
from nms.app import cluster_launcher
from nms.app.cluster_launcher import Member
from nms.app.local_daemons import stop_pid


class ClusterMesh(MeshLab):
    def __init__(self, prefix: str, mgmt: str, counts: dict[str, int], nats_nodes: int = 1, **kw) -> None:
        super().__init__(prefix, mgmt, **kw)
        self.counts, self.nats_nodes = counts, nats_nodes
        self.members: dict[str, Member] = {}
        self.killed: set[str] = set()

    @property
    def cluster_dir(self):
        return self.dir.root / "cluster"

    def start_service(self) -> None:
        self.service_started_ns = time.time_ns()
        members = cluster_launcher.up(self.cluster_dir, self.counts, base_config=self.config,
                                      nats_nodes=self.nats_nodes, timeout=120)
        self.members = {m.name: m for m in members}
        self.killed = set()
        self._use_api()

    def _use_api(self) -> None:
        """The tests' own API calls go to the first API worker alive."""
        alive = [m for name, m in sorted(self.members.items()) if m.role == "api" and name not in self.killed]
        self.port = int(alive[0].url.rsplit(":", 1)[1])

    @property
    def agent_urls(self) -> list[str]:
        gateway = self.topo.mgmt_gateway
        return [f"http://{gateway}:{m.url.rsplit(':', 1)[1]}"
                for _, m in sorted(self.members.items()) if m.role == "api"]

    def start_agents(self, rate: float | None = None, hosts: list[str] | None = None,
                     probe_options: dict | None = None) -> None:
        agent_procs.start(self.dir, self.agent_urls, hosts, rate, probe_options)

    def kill(self, name: str) -> None:
        """SIGKILL one member (a server too: `nats-2`); the tests' API calls move off a dead API worker."""
        os.kill(self.members[name].pid, signal.SIGKILL)
        self.killed.add(name)
        if self.members[name].role == "api":
            self._use_api()

    def stop_member(self, name: str) -> str:
        """Stop one member as systemd would (SIGTERM: it delivers what it holds, then exits)."""
        m = self.members[name]
        return stop_pid(m.pid, m.started, timeout=30)

    def ledger(self, name: str) -> dict | None:
        """What InfluxDB acknowledged to the member (its store's ledger: nms/store/influx.py)."""
        return cluster_launcher.member_ledger(cluster_launcher.ClusterDir(self.cluster_dir), name)

    def stop_service(self) -> None:
        if self.members:
            cluster_launcher.down(self.cluster_dir)
            self.members = {}
