"""Host probe agents as the service sees them: who registered, whom each one probes, commands.

Peer plan: each host probes every host under the same leaf (sharing a switch on any NIC) plus K
random others. The choice is a pure function of the inventory and a seed, so a restarted service
hands out the same lists. The union of all lists, as an undirected graph, is made connected (one
edge between consecutive components), since clock sync solves over the probe graph.

Registrations live in memory: an agent that reaches a restarted service (new `instance`)
registers again. With a state store that several processes share (`share_registrations`), each is
also written there (its last_seen every SEEN_WRITE_S, all hosts in one transaction), so that every
member knows every agent (`registered()`: a correlate member's host actuator, the peers' RDMA QPs,
GET /agents on any API worker), read back at most every REGISTERED_READ_S.

Commands live in the state store (nms.state): pending until an agent's long-poll receives them,
expired when none does within `agents.command_ttl`, done or failed when the agent reports its
result. With a shared state, commands another process issued (a correlate member's focus or
steering) wake this process's long-polls too: `follow_commands` reads the new commands' hosts every
COMMANDS_FOLLOW_S. Their ids are never reused, so an agent keeps its `after` cursor across a service
restart and still gets what was issued while it was away; an agent that itself restarts polls from
0 and gets every command for its host that is pending, or delivered but unfinished and younger than
the TTL (at-least-once: the cursor, not the delivery, is the acknowledgement).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nms.config.models import AgentsConfig, FabricConfig
from nms.state import AgentCommand, StateStore

log = logging.getLogger(__name__)

COMMANDS = {"reprobe_paths": "trace every path again now", "set_rate": "args.rate: exchanges/s per path",
            "refresh_peers": "fetch the peer list again now",
            "steer": "move job flows off an element (docs/steering.md)", "unsteer": "args.action_id: undo a steer",
            "focus": "args.paths, rate, for_s: probe these paths at rate exchanges/s for a while"}


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


class NicInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    address: str = Field(min_length=1, max_length=64)
    qpn: int | None = Field(None, ge=2, le=0xFFFFFF, description="the NIC's RDMA UD responder QP (transport verbs)")


class AgentInfo(BaseModel):
    """A registered agent (also what GET /agents lists)."""

    host: str
    session: str = Field(description="the agent process's random session id (hex)")
    version: str
    transport: str
    nics: list[NicInfo]
    registered_ns: int
    last_seen_ns: int = Field(description="last registration, peer fetch or command poll")
    token: str = Field(description="name of the token it registered with")
    peers: int = Field(description="how many peers it probes")


COMMANDS_FOLLOW_S = 0.25  # how often a shared state's new commands are looked for
SEEN_WRITE_S = 10.0  # an agent's last_seen goes to a shared state at most this often
REGISTERED_READ_S = 2.0  # the registrations of a shared state are read back at most this often
PENDING_MAX = 100  # pending commands kept per host: an agent that never polls does not grow the service
KEEP = 1000  # commands (any status) kept per host


class AgentRegistry:
    def __init__(self, fabric: FabricConfig, settings: AgentsConfig, state: StateStore,
                 clock: Callable[[], int] = time.time_ns):
        self.settings = settings
        self.state = state
        self.clock = clock  # ns; tests move it to expire commands
        self.ttl_ns = int(settings.command_ttl * 1e9)
        self.instance = secrets.token_hex(8)  # changes on every service start
        self.hosts = {h.name: h for h in fabric.hosts}
        leaves = {h.name: {n.switch for n in h.nics if n.switch} or {f"~{h.name}"} for h in fabric.hosts}
        self.plan = plan_peers(leaves, settings.peers_random, settings.seed)
        self.leaves = leaves
        self.generation = hashlib.sha256(repr(sorted(self.plan.items())).encode()).hexdigest()[:12]
        self.agents: dict[str, AgentInfo] = {}
        self._issued: defaultdict[str, int] = defaultdict(int)  # per host, bumped by every command: wakes its long-poll
        self._changed: asyncio.Condition | None = None
        self.signer = None  # a CommandSigner (nms.signing): delivered commands carry its envelope
        # host -> its NCCL QPs joined with their peers' ends (correlator/jobs_nccl.py NcclJobs.qp_targets):
        # handed out with the peer list, the agent traces each QP's 5-tuple (hostprobe/qp_trace.py)
        self.qp_targets: Callable[[str], list[dict]] | None = None
        self._commands_seen: int | None = None  # the newest command id followed (share_commands)
        self._shared = False  # registrations also in the state store (share_registrations)
        self._seen_unwritten: set[str] = set()  # hosts seen since their last_seen was written there
        self._registered: tuple[float, dict[str, AgentInfo]] = (-REGISTERED_READ_S, {})  # (read at, monotonic)
        self._parsed: dict[str, AgentInfo] = {}  # a registration's JSON -> the AgentInfo it reads as

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def known(self, host: str) -> bool:
        return host in self.hosts

    def share_registrations(self) -> None:
        """Several processes share the state store: registrations go there too, and `registered()` reads
        every process's."""
        self._shared = True

    def registered(self) -> dict[str, AgentInfo]:
        """Every registered agent by host: this process's own, and with a shared state every process's."""
        if not self._shared:
            return self.agents
        read_at, known = self._registered
        if time.monotonic() - read_at >= REGISTERED_READ_S:
            known, parsed = {}, {}
            for last_seen, body in self.state.agents():
                # a registration's JSON is parsed once (thousands of agents are read back every few seconds)
                info = parsed[body] = self._parsed.get(body) or AgentInfo.model_validate_json(body)
                known[info.host] = (info if last_seen <= info.last_seen_ns
                                    else info.model_copy(update={"last_seen_ns": last_seen}))
            self._registered, self._parsed = (time.monotonic(), known), parsed
        return {**known, **self.agents}  # this process's own are the freshest

    def peers(self, host: str) -> list[dict]:
        out = []
        registered = self.registered()
        for name in self.plan.get(host, []):
            h = self.hosts[name]
            agent = registered.get(name)
            qpns = self._qpns(agent)
            out.append({"host": name, "same_leaf": bool(self.leaves[host] & self.leaves[name]),
                        "nics": [{"name": n.name, "address": n.address,
                                  **({"qpn": qpns[(n.name, n.address)]} if (n.name, n.address) in qpns else {})}
                                 for n in h.nics],
                        "agent": agent is not None})
        return out

    @staticmethod
    def _qpns(agent: AgentInfo | None) -> dict[tuple[str, str], int]:
        """(NIC, address) -> RDMA UD responder QP the agent registered: its peers probe those NICs over
        RDMA UD (hostprobe.verbs), the others over UDP."""
        return {(n.name, n.address): n.qpn for n in agent.nics if n.qpn} if agent else {}

    def qps(self, host: str) -> list[dict]:
        """The host's QPs to trace; none when the service tracks no NCCL job (or fails to say)."""
        if self.qp_targets is None:
            return []
        try:
            return self.qp_targets(host)
        except Exception:  # the peer list must not fail on the QP join
            log.exception("joining %s's QPs failed", host)
            return []

    def probed_by(self, host: str) -> list[str]:
        return sorted(h for h, peers in self.plan.items() if host in peers)

    def register(self, host: str, body: dict, token_name: str) -> bool:
        """Record the agent; True when what its peers need to probe it (its RDMA UD QPs) changed."""
        now = self.clock()
        info = AgentInfo(host=host, session=body["session"], version=body.get("version", ""),
                         transport=body.get("transport", "udp"), nics=body.get("nics", []),
                         registered_ns=now, last_seen_ns=now, token=token_name, peers=len(self.plan.get(host, [])))
        before = self._qpns(self.agents.get(host) or self._registered[1].get(host))  # no read of the state here
        self.agents[host] = info
        if self._shared:
            self.state.put_agent(host, info.model_dump_json(), now)
        return self._qpns(info) != before

    def seen(self, host: str) -> None:
        if host in self.agents:
            self.agents[host].last_seen_ns = self.clock()
            if self._shared:
                self._seen_unwritten.add(host)

    def write_seen(self) -> int:
        """A shared state: the last_seen of the agents seen since the last call, in one transaction (the
        service calls it every SEEN_WRITE_S in a worker thread). How many."""
        hosts, self._seen_unwritten = self._seen_unwritten, set()
        seen = {h: self.agents[h].last_seen_ns for h in hosts if h in self.agents}
        self.state.put_agents_seen(seen)
        return len(seen)

    # --- commands -------------------------------------------------------------------------------

    def share_commands(self) -> None:
        """Other processes issue commands into the state store too: from now on `follow_commands` wakes the
        long-polls of their hosts."""
        self._commands_seen, _ = self.state.command_hosts_after(None)

    async def follow_commands(self) -> set[str]:
        """The hosts that got commands since the last call, whoever issued them; their held long-polls
        re-read the store (one that finds nothing new waits on)."""
        if self._commands_seen is None:
            return set()
        self._commands_seen, hosts = await asyncio.to_thread(self.state.command_hosts_after, self._commands_seen)
        if hosts:
            async with self._condition():
                for host in hosts:
                    self._issued[host] += 1
                self._condition().notify_all()
        return hosts

    async def issue(self, hosts: list[str], kind: str, args: dict, by: str) -> list[AgentCommand]:
        out = self.state.add_commands(hosts, kind, args, by, self.clock(), PENDING_MAX, KEEP)
        async with self._condition():
            for host in hosts:
                self._issued[host] += 1
            self._condition().notify_all()
        return out

    async def wait(self, host: str, after: int, timeout: float, give_up=None) -> list[AgentCommand]:
        """Commands for `host` newer than `after` (now delivered), waiting up to `timeout` seconds for
        one. The store is read when the wait starts and when a command for `host` is issued. The wait
        is cut into short slices so that `give_up()` (client gone, server stopping) ends it early: a
        held long-poll would otherwise keep a stopping server waiting for its connections."""
        cond = self._condition()
        deadline = time.monotonic() + timeout
        issued = self._issued[host]
        found = self.state.deliver_commands(host, after, self.clock(), self.ttl_ns)
        while not found:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (give_up is not None and await give_up()):
                break
            async with cond:
                try:
                    await asyncio.wait_for(
                        cond.wait_for(lambda issued=issued: self._issued[host] != issued), min(0.5, remaining)
                    )
                except TimeoutError:
                    pass
            if self._issued[host] != issued:
                issued = self._issued[host]
                found = self.state.deliver_commands(host, after, self.clock(), self.ttl_ns)
        self.seen(host)
        return found if self.signer is None else [self._signed(c) for c in found]

    def _signed(self, c: AgentCommand) -> AgentCommand:
        """Signed at each delivery (a fresh nonce): valid until the command's TTL ends."""
        env = self.signer.envelope(c.host, c.id, c.kind, c.args, c.issued_ns + self.ttl_ns)
        return c.model_copy(update={"envelope": env})

    def finish(self, host: str, command_id: int, status: Literal["done", "failed"], message: str,
               details: dict | None) -> tuple[AgentCommand | None, bool]:
        """An agent's result: (the command, or None when `host` has no such command; whether it changed)."""
        known = self.state.get_command(command_id)
        if known is None or known.host != host:
            return None, False
        return self.state.finish_command(command_id, status, message, details, self.clock())

    def command(self, host: str, command_id: int) -> AgentCommand | None:
        self.state.expire_commands(self.clock(), self.ttl_ns)
        found = self.state.get_command(command_id)
        return found if found is not None and found.host == host else None

    def commands(self, host: str | None = None, status: str | None = None, limit: int = 100) -> list[AgentCommand]:
        self.state.expire_commands(self.clock(), self.ttl_ns)
        return self.state.list_commands(host, status, limit)
