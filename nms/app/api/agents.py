"""/agents: host probe agents register, fetch their peers and long-poll for commands (scope ingest);
operators list agents (read) and send them commands (act). Reports go through /ingest/<kind>."""

from __future__ import annotations

import threading
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nms.app.agents import COMMANDS, AgentRegistry
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, ErrorDetail, Principal, require

router = APIRouter(prefix="/agents", tags=["agents"], responses={**AUTH_RESPONSES, **BAD_BODY_RESPONSE})
HostName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]
UNKNOWN = {404: {"model": ErrorDetail, "description": "host not in the fabric inventory"}}
_lock = threading.Lock()


def registry(request: Request) -> AgentRegistry:
    state = request.app.state
    with _lock:  # sync routes run in a thread pool
        if getattr(state, "agents", None) is None:  # built on first use from the service's config
            config = state.service.config
            state.agents = AgentRegistry(config.fabric, config.agents)
    return state.agents


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NicInfo(Strict):
    name: str = Field(min_length=1, max_length=64)
    address: str = Field(min_length=1, max_length=64)


class Registration(Strict):
    session: str = Field(pattern=r"^[0-9a-f]{1,16}$")
    version: str = Field("", max_length=64)
    transport: Literal["udp", "verbs"] = "udp"
    probe_port: int = Field(ge=1, le=65535)
    nics: list[NicInfo] = Field(default_factory=list, max_length=64)


class Peer(BaseModel):
    host: str
    same_leaf: bool
    nics: list[NicInfo]
    agent: bool = Field(description="an agent on that host has registered with this service instance")


class PeerList(BaseModel):
    host: str
    generation: str = Field(description="changes when the peer plan changes")
    peers: list[Peer]


class Registered(PeerList):
    instance: str = Field(description="this service run; a new value means the service restarted")
    command_wait_max: float


class CommandOut(BaseModel):
    id: int
    kind: str
    args: dict
    issued_ns: int
    by: str


class Commands(BaseModel):
    instance: str
    commands: list[CommandOut]


class CommandIn(Strict):
    kind: Literal["reprobe_paths", "set_rate", "refresh_peers"] = Field(
        description="; ".join(f"{k}: {v}" for k, v in COMMANDS.items()))
    args: dict = Field(default_factory=dict, max_length=16)
    hosts: list[str] | None = Field(None, max_length=100_000,
                                    description="POST /agents/commands only: default every registered agent")

    @model_validator(mode="after")
    def _args(self) -> CommandIn:
        if self.kind == "set_rate":
            rate = self.args.get("rate")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= 10_000:
                raise ValueError("set_rate needs args.rate: exchanges per second per path, 0 < rate <= 10000")
        return self


class AgentOut(BaseModel):
    host: str
    session: str
    version: str
    transport: str
    nics: list[dict]
    registered_ns: int
    last_seen_ns: int
    token: str
    peers: int


def _known(reg: AgentRegistry, host: str) -> None:
    if not reg.known(host):
        raise HTTPException(404, f"host {host!r} is not in the fabric inventory (fabric.hosts)")


@router.post("/{host}/register", response_model=Registered, responses=UNKNOWN, summary="An agent announces itself")
def register(host: HostName, body: Registration, request: Request,
             who: Principal = Depends(require("ingest"))) -> Registered:
    reg = registry(request)
    _known(reg, host)
    reg.register(host, body.model_dump(), who.name)
    return Registered(host=host, generation=reg.generation, peers=reg.peers(host), instance=reg.instance,
                      command_wait_max=reg.settings.command_wait_max)


@router.get("/{host}/peers", response_model=PeerList, responses=UNKNOWN, summary="Whom this host probes",
            dependencies=[Depends(require("ingest"))])
def peers(host: HostName, request: Request) -> PeerList:
    reg = registry(request)
    _known(reg, host)
    reg.seen(host)
    return PeerList(host=host, generation=reg.generation, peers=reg.peers(host))


@router.get("/{host}/commands", response_model=Commands, responses=UNKNOWN,
            summary="Long-poll: commands newer than `after`, waiting up to `wait` seconds",
            dependencies=[Depends(require("ingest"))])
async def commands(host: HostName, request: Request, after: Annotated[int, Query(ge=0)] = 0,
                   wait: Annotated[float, Query(ge=0, le=3600)] = 0.0) -> Commands:
    reg = registry(request)
    _known(reg, host)
    if host not in reg.agents:  # not registered with this instance: answer at once, the agent registers
        return Commands(instance=reg.instance, commands=[])

    async def give_up() -> bool:
        server = getattr(request.app.state, "server", None)  # set by `nms serve`
        return bool(getattr(server, "should_exit", False)) or await request.is_disconnected()

    found = await reg.wait(host, after, min(wait, reg.settings.command_wait_max), give_up)
    return Commands(instance=reg.instance, commands=[CommandOut(**vars(c)) for c in found])


@router.post("/{host}/commands", response_model=CommandOut, responses=UNKNOWN, summary="Send one agent a command")
async def command_one(host: HostName, body: CommandIn, request: Request,
                      who: Principal = Depends(require("act"))) -> CommandOut:
    reg = registry(request)
    _known(reg, host)
    if body.hosts is not None:
        raise HTTPException(422, [{"loc": ["body", "hosts"], "msg": "hosts is only for POST /agents/commands",
                                   "type": "value_error"}])
    (cmd,) = await reg.issue([host], body.kind, body.args, who.name)
    return CommandOut(**vars(cmd))


@router.post("/commands", response_model=list[CommandOut], responses=UNKNOWN, summary="Send several agents a command")
async def command_many(body: CommandIn, request: Request,
                       who: Principal = Depends(require("act"))) -> list[CommandOut]:
    reg = registry(request)
    hosts = sorted(reg.agents) if body.hosts is None else body.hosts
    for host in hosts:
        _known(reg, host)
    return [CommandOut(**vars(c)) for c in await reg.issue(hosts, body.kind, body.args, who.name)]


@router.get("", response_model=list[AgentOut], summary="Registered agents",
            dependencies=[Depends(require("read"))])
def list_agents(request: Request) -> list[AgentOut]:
    reg = registry(request)
    return [AgentOut(**vars(a), peers=len(reg.plan.get(a.host, []))) for a in reg.agents.values()]
