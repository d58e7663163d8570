"""/agents: host probe agents register, fetch their peers, long-poll for commands and report their
results (scope ingest); operators list agents and commands (read) and send commands (act).
Reports go through /ingest/<kind>. A host-bound token may use only /agents/<its host>/...
(nms.app.binding)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nms.agent_commands import MAX_FOCUS_S, MAX_RATE, PATH_ID, focus_args_problem, rate_problem
from nms.app.agent_registry import COMMANDS, AgentInfo, AgentRegistry, NicInfo
from nms.app.api.deps import AgentsDep
from nms.app.auth import AUTH_RESPONSES, BAD_BODY_RESPONSE, ErrorDetail, Principal, require
from nms.app.binding import check_agent_path
from nms.state import AgentCommand, CommandStatus

router = APIRouter(prefix="/agents", tags=["agents"], responses={
    **AUTH_RESPONSES, **BAD_BODY_RESPONSE,
    403: {"model": ErrorDetail, "description": "token lacks the required scope, or is bound to another host"}})
HostName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]
UNKNOWN = {404: {"model": ErrorDetail, "description": "host not in the fabric inventory"}}
NO_COMMAND = {404: {"model": ErrorDetail, "description": "host not in the inventory, or no such command for it"}}
DETAILS_MAX = 4096  # bytes of JSON (command args, result details)


def access(scope: str):
    """Dependency: `require(scope)`, and a host-bound token only for its own host's path."""
    check = require(scope)

    def bound(request: Request, who: Principal = Depends(check)) -> Principal:
        try:
            check_agent_path(who, request.path_params.get("host"))
        except HTTPException:
            request.app.state.metrics.auth_failures.labels("host").inc()
            raise
        return who

    return bound


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class QpTarget(BaseModel):
    device: str
    lqpn: int
    sport: int = Field(description="the QP's RoCE v2 UDP source port")
    src_addr: str
    dst_addr: str = Field(description="the peer end's address: where the QP's packets go")
    peer_host: str


class PeerList(BaseModel):
    host: str
    generation: str = Field(description="changes when the peer plan changes")
    peers: list[Peer]
    qps: list[QpTarget] = Field(default_factory=list, description="this host's NCCL QPs joined with their peers' "
                                                                   "ends: the agent traces each one's 5-tuple")


class Registered(PeerList):
    instance: str = Field(description="this service run; a new value means the service restarted")
    command_wait_max: float
    command_key: str | None = Field(None, description="the service's Ed25519 public key (base64) that signs "
                                                      "commands; agents pin it (docs/actions.md)")


class Commands(BaseModel):
    instance: str
    last_id: int = Field(description="the highest command id this service has given out: an agent whose cursor "
                                     "is beyond it polls from 0 (the state store was reset)")
    commands: list[AgentCommand]


_KINDS = ("reprobe_paths", "set_rate", "refresh_peers", "steer", "unsteer", "focus")
_RATE = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RATE}
API_FOCUS_PATHS = 50  # so that a focus command's args always fit DETAILS_MAX


class CommandIn(Strict):
    # set_rate's and focus's args, stated in the schema; args' size as JSON (DETAILS_MAX) is not expressible there
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"properties": {"kind": {"enum": [k for k in _KINDS if k not in ("set_rate", "focus")]}}},
        {"required": ["args"], "properties": {"kind": {"const": "set_rate"}, "args": {
            "required": ["rate"], "properties": {"rate": _RATE}}}},
        {"required": ["args"], "properties": {"kind": {"const": "focus"}, "args": {
            "required": ["paths", "rate", "for_s"], "properties": {
                "paths": {"type": "array", "minItems": 1, "maxItems": API_FOCUS_PATHS,
                          "items": {"type": "string", "pattern": PATH_ID}},
                "rate": _RATE, "for_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_FOCUS_S}}}}}]})

    kind: Literal["reprobe_paths", "set_rate", "refresh_peers", "steer", "unsteer", "focus"] = Field(
        description="; ".join(f"{k}: {v}" for k, v in COMMANDS.items()))
    args: dict = Field(default_factory=dict, max_length=16)
    hosts: list[str] | None = Field(None, max_length=100_000,
                                    description="POST /agents/commands only: default every registered agent")

    @model_validator(mode="after")
    def _args(self) -> CommandIn:
        if _json_size(self.args) is None:
            return self  # refused by plain_json in the route (see there)
        if self.kind == "set_rate":
            if reason := rate_problem(self.args.get("rate")):
                raise ValueError(f"set_rate needs args.rate: {reason}")
        if self.kind == "focus" and (reason := focus_args_problem(self.args, API_FOCUS_PATHS)):
            raise ValueError(f"focus: {reason}")
        return self


class CommandResult(Strict):
    status: Literal["done", "failed"]
    message: str = Field("", max_length=1024)
    details: dict | None = Field(None, description=f"at most {DETAILS_MAX} bytes as JSON")


def _json_size(value: dict) -> int | None:
    """Its size as JSON; None when it holds NaN or Infinity, which JSON cannot carry."""
    try:
        return len(json.dumps(value, allow_nan=False))
    except ValueError:
        return None


def plain_json(value: dict | None, where: str) -> None:
    """422 unless `value` is small JSON that can be stored and read back. Checked in the routes, not
    the models: a model's validation error echoes its input in the 422 body, and a NaN there makes
    the answer a 500."""
    size = 0 if value is None else _json_size(value)
    msg = ("must be plain JSON (no NaN or Infinity)" if size is None
           else f"larger than {DETAILS_MAX} bytes as JSON" if size > DETAILS_MAX else "")
    if msg:
        raise HTTPException(422, [{"loc": ["body", where], "msg": msg, "type": "value_error"}])


def _known(reg: AgentRegistry, host: str) -> None:
    if not reg.known(host):
        raise HTTPException(404, f"host {host!r} is not in the fabric inventory (fabric.hosts)")


@router.post("/{host}/register", response_model=Registered, responses=UNKNOWN, summary="An agent announces itself")
async def register(host: HostName, body: Registration, reg: AgentsDep,
                   who: Principal = Depends(access("ingest"))) -> Registered:
    _known(reg, host)
    if reg.register(host, body.model_dump(), who.name):
        # its RDMA UD QPs are new: the hosts probing it fetch their peer lists now, not at the next refresh
        await reg.issue(reg.probed_by(host), "refresh_peers", {}, "service")
    return Registered(host=host, generation=reg.generation, peers=reg.peers(host), qps=reg.qps(host),
                      instance=reg.instance,
                      command_wait_max=reg.settings.command_wait_max,
                      command_key=reg.signer.public_key if reg.signer is not None else None)


@router.get("/{host}/peers", response_model=PeerList, responses=UNKNOWN, summary="Whom this host probes",
            dependencies=[Depends(access("ingest"))])
def peers(host: HostName, reg: AgentsDep) -> PeerList:
    _known(reg, host)
    reg.seen(host)
    return PeerList(host=host, generation=reg.generation, peers=reg.peers(host), qps=reg.qps(host))


@router.get("/{host}/commands", response_model=Commands, responses=UNKNOWN,
            summary="Long-poll: commands newer than `after`, waiting up to `wait` seconds",
            dependencies=[Depends(access("ingest"))])
async def commands(host: HostName, request: Request, reg: AgentsDep, after: Annotated[int, Query(ge=0)] = 0,
                   wait: Annotated[float, Query(ge=0, le=3600)] = 0.0) -> Commands:
    _known(reg, host)
    if host not in reg.agents:  # not registered with this instance: answer at once, the agent registers
        return Commands(instance=reg.instance, last_id=reg.state.last_command_id(), commands=[])

    async def give_up() -> bool:
        server = getattr(request.app.state, "server", None)  # set by `nms serve`
        return bool(getattr(server, "should_exit", False)) or await request.is_disconnected()

    found = await reg.wait(host, after, min(wait, reg.settings.command_wait_max), give_up)
    return Commands(instance=reg.instance, last_id=reg.state.last_command_id(), commands=found)


@router.post("/{host}/commands/{command_id}/result", response_model=AgentCommand, summary="An agent's result",
             responses={**NO_COMMAND, 409: {"model": ErrorDetail, "description": "the command already has an outcome"}})
def command_result(host: HostName, command_id: int, body: CommandResult, reg: AgentsDep,
                   who: Principal = Depends(access("ingest"))) -> AgentCommand:
    _known(reg, host)
    plain_json(body.details, "details")
    cmd, changed = reg.finish(host, command_id, body.status, body.message, body.details)
    if cmd is None:
        raise HTTPException(404, f"host {host!r} has no command {command_id}")
    if not changed:
        raise HTTPException(409, f"command {command_id} is already {cmd.status}")
    reg.seen(host)
    return cmd


@router.get("/{host}/commands/{command_id}", response_model=AgentCommand, responses=NO_COMMAND,
            summary="One command with its status and result", dependencies=[Depends(access("read"))])
def command_status(host: HostName, command_id: int, reg: AgentsDep) -> AgentCommand:
    _known(reg, host)
    cmd = reg.command(host, command_id)
    if cmd is None:
        raise HTTPException(404, f"host {host!r} has no command {command_id}")
    return cmd


@router.get("/commands", response_model=list[AgentCommand], summary="Commands, newest first",
            dependencies=[Depends(access("read"))])
def list_commands(reg: AgentsDep, host: Annotated[str | None, Query(max_length=128)] = None,
                  status: CommandStatus | None = None,
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[AgentCommand]:
    return reg.commands(host, status, limit)


@router.post("/{host}/commands", response_model=AgentCommand, responses=UNKNOWN, summary="Send one agent a command")
async def command_one(host: HostName, body: CommandIn, reg: AgentsDep,
                      who: Principal = Depends(access("act"))) -> AgentCommand:
    _known(reg, host)
    if body.hosts is not None:
        raise HTTPException(422, [{"loc": ["body", "hosts"], "msg": "hosts is only for POST /agents/commands",
                                   "type": "value_error"}])
    plain_json(body.args, "args")
    (cmd,) = await reg.issue([host], body.kind, body.args, who.name)
    return cmd


@router.post("/commands", response_model=list[AgentCommand], responses=UNKNOWN,
             summary="Send several agents a command")
async def command_many(body: CommandIn, reg: AgentsDep,
                       who: Principal = Depends(access("act"))) -> list[AgentCommand]:
    plain_json(body.args, "args")
    hosts = sorted(reg.registered()) if body.hosts is None else body.hosts
    for host in hosts:
        _known(reg, host)
    return await reg.issue(hosts, body.kind, body.args, who.name)


@router.get("", response_model=list[AgentInfo], summary="Registered agents", dependencies=[Depends(access("read"))])
def list_agents(reg: AgentsDep) -> list[AgentInfo]:
    return list(reg.registered().values())
