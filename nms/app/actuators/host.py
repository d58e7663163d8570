"""host_reroute: the target hosts' agents steer their flows off the element (agent commands
`steer` / `unsteer`, signed at delivery; hostprobe/steer.py carries them out, docs/steering.md).

Applied when every target agent reported success; otherwise ActuatorError with each host's
reason (those that did steer are told to unsteer by the manager's rollback of the failure).
"""

from __future__ import annotations

import asyncio
import time

from correlator.actions.base import Actuator, ActuatorError
from nms.app.agent_registry import AgentRegistry
from nms.records import Action

POLL_S = 0.2


class HostRerouteActuator(Actuator):
    kinds = frozenset({"host_reroute"})

    def __init__(self, agents: AgentRegistry, timeout: float = 30.0):
        self.agents = agents
        self.timeout = timeout  # seconds every target agent has to answer

    async def read(self, action: Action) -> dict:
        """Which targets have an agent now, and what else steers them (the state steer changes)."""
        registered = self.agents.registered()
        return {"hosts": {h: {"agent": h in registered} for h in action.targets}}

    async def apply(self, action: Action) -> dict:
        registered = self.agents.registered()  # with any API worker of a cluster
        missing = [h for h in action.targets if not self.agents.known(h) or h not in registered]
        if missing:
            raise ActuatorError(f"no agent registered on {', '.join(missing)}")
        p = action.params
        commands = {}
        stripe = p.get("stripe") or {h: [i, len(action.targets)] for i, h in enumerate(action.targets)}
        for host in action.targets:
            rank, movers = stripe.get(host, [0, 1])
            args = {"action_id": action.id, "element": action.element, "avoid_hops": list(p.get("avoid_hops", [])),
                    "dsts": list(p.get("dsts", {}).get(host, [])), "proto": p.get("proto", "udp"),
                    "dport": p.get("dport", 4791), "expires_ns": action.expires_ns or 0,
                    # the moved-to links' loads: the agent places its ports by them (docs/steering.md)
                    "hop_loads": dict(p.get("hop_loads") or {}),
                    # the agents behind one switch place at once: each takes its own slots of one stripe
                    "rank": rank, "movers": movers,
                    # the service's placement of every mover's flows: the agent follows it where it can
                    "routes": dict((p.get("routes") or {}).get(host) or {})}
            (cmd,) = await self.agents.issue([host], "steer", args, f"action {action.id}")
            commands[host] = cmd.id
        return await self._outcome(commands, "steer")

    async def revert(self, action: Action) -> dict:
        hosts = action.targets
        if action.state == "failed":  # undoing a partial apply: only where steer was done
            hosts = [h for h, r in action.after.get("hosts", {}).items() if r.get("status") == "done"]
        commands = {}
        for host in hosts:
            (cmd,) = await self.agents.issue([host], "unsteer", {"action_id": action.id}, f"action {action.id}")
            commands[host] = cmd.id
        return await self._outcome(commands, "unsteer")

    async def _outcome(self, commands: dict[str, int], kind: str) -> dict:
        """Wait for every host's result; the state as the agents reported it, or ActuatorError."""
        deadline = time.monotonic() + self.timeout
        results = {}
        while True:
            for host, cid in commands.items():
                if host not in results:
                    cmd = self.agents.command(host, cid)
                    if cmd is not None and cmd.status in ("done", "failed", "expired"):
                        results[host] = cmd
            if len(results) == len(commands) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        state = {"hosts": {h: {"command": commands[h], "status": c.status, "message": c.message,
                               **({"result": c.details} if c.details else {})} for h, c in results.items()}}
        problems = [f"{h}: {c.status}: {c.message}" for h, c in sorted(results.items()) if c.status != "done"]
        problems += [f"{h}: no answer within {self.timeout:g} s" for h in sorted(commands) if h not in results]
        if problems:
            done = any(c.status == "done" for c in results.values())
            raise ActuatorError(f"{kind} not done on {len(problems)} of {len(commands)} hosts: " + "; ".join(problems),
                                state if done else None)
        return state
