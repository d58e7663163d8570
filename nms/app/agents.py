"""Host probe agents as the service sees them: who registered, whom each one probes, commands.

Peer plan: each host probes every host under the same leaf (sharing a switch on any NIC) plus K
random others. The choice is a pure function of the inventory and a seed, so a restarted service
hands out the same lists. The union of all lists, as an undirected graph, is made connected (one
edge between consecutive components), since clock sync solves over the probe graph.

Commands live in memory only: they are steering hints ("trace again", "probe faster"), not state;
an agent that reconnects to a restarted service (new `instance`) registers again and starts over.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import time
from dataclasses import dataclass, field

from nms.config.models import AgentsConfig, FabricConfig

COMMANDS = {"reprobe_paths": "trace every path again now", "set_rate": "args.rate: exchanges/s per path",
            "refresh_peers": "fetch the peer list again now"}


def plan_peers(hosts: dict[str, set[str]], k: int, seed: str) -> dict[str, list[str]]:
    """hosts: name -> the switches its NICs hang off. Returns name -> sorted peer names."""
    names = sorted(hosts)
    peers: dict[str, set[str]] = {h: set() for h in names}
    for h in names:
        peers[h] |= {o for o in names if o != h and hosts[h] & hosts[o]}
        others = [o for o in names if o != h and o not in peers[h]]
        rng = random.Random(hashlib.sha256(f"{seed}/{h}".encode()).digest())
        peers[h] |= set(rng.sample(others, min(k, len(others))))
    _connect(names, peers)
    return {h: sorted(p) for h, p in peers.items()}


def _connect(names: list[str], peers: dict[str, set[str]]) -> None:
    parent = {h: h for h in names}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for h in names:
        for p in peers[h]:
            parent[find(h)] = find(p)
    roots = sorted({find(h) for h in names})
    for a, b in zip(roots, roots[1:]):  # one undirected edge joins two components
        peers[a].add(b)
        peers[b].add(a)


@dataclass
class AgentInfo:
    host: str
    session: str
    version: str
    transport: str
    nics: list[dict]
    registered_ns: int
    last_seen_ns: int
    token: str


@dataclass
class Command:
    id: int
    kind: str
    args: dict
    issued_ns: int
    by: str


@dataclass
class _Mailbox:
    commands: list[Command] = field(default_factory=list)


class AgentRegistry:
    def __init__(self, fabric: FabricConfig, settings: AgentsConfig):
        self.settings = settings
        self.instance = secrets.token_hex(8)  # changes on every service start
        self.hosts = {h.name: h for h in fabric.hosts}
        leaves = {h.name: {n.switch for n in h.nics if n.switch} or {f"~{h.name}"} for h in fabric.hosts}
        self.plan = plan_peers(leaves, settings.peers_random, settings.seed)
        self.leaves = leaves
        self.generation = hashlib.sha256(repr(sorted(self.plan.items())).encode()).hexdigest()[:12]
        self.agents: dict[str, AgentInfo] = {}
        self._boxes: dict[str, _Mailbox] = {}
        self._next_id = 1
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def known(self, host: str) -> bool:
        return host in self.hosts

    def peers(self, host: str) -> list[dict]:
        out = []
        for name in self.plan.get(host, []):
            h = self.hosts[name]
            out.append({"host": name, "same_leaf": bool(self.leaves[host] & self.leaves[name]),
                        "nics": [{"name": n.name, "address": n.address} for n in h.nics],
                        "agent": name in self.agents})
        return out

    def register(self, host: str, body: dict, token_name: str) -> AgentInfo:
        now = time.time_ns()
        info = AgentInfo(host=host, session=body["session"], version=body.get("version", ""),
                         transport=body.get("transport", "udp"), nics=body.get("nics", []),
                         registered_ns=now, last_seen_ns=now, token=token_name)
        self.agents[host] = info
        self._boxes.setdefault(host, _Mailbox())
        return info

    def seen(self, host: str) -> None:
        if host in self.agents:
            self.agents[host].last_seen_ns = time.time_ns()

    async def issue(self, hosts: list[str], kind: str, args: dict, by: str) -> list[Command]:
        out = []
        async with self._condition():
            for host in hosts:
                cmd = Command(self._next_id, kind, args, time.time_ns(), by)
                self._next_id += 1
                box = self._boxes.setdefault(host, _Mailbox())
                box.commands.append(cmd)
                del box.commands[:-100]  # an agent that never polls does not grow the service
                out.append(cmd)
            self._condition().notify_all()
        return out

    async def wait(self, host: str, after: int, timeout: float, give_up=None) -> list[Command]:
        """Commands for `host` newer than `after`, waiting up to `timeout` seconds for one. The wait is
        cut into short slices so that `give_up()` (client gone, server stopping) ends it early: a held
        long-poll would otherwise keep a stopping server waiting for its connections."""
        cond = self._condition()
        box = self._boxes.setdefault(host, _Mailbox())

        def pending() -> list[Command]:
            return [c for c in box.commands if c.id > after]

        deadline = time.monotonic() + timeout
        while True:
            async with cond:
                try:
                    await asyncio.wait_for(cond.wait_for(lambda: bool(pending())),
                                           max(0.0, min(0.5, deadline - time.monotonic())))
                except asyncio.TimeoutError:
                    pass
                found = pending()
            if found or time.monotonic() >= deadline or (give_up is not None and await give_up()):
                self.seen(host)
                return found
