"""`nms cluster up|down|status`: a whole cluster on this machine, on loopback only, for trying it and
for tests (docs/cluster.md). nats-server with JetStream (one node, or a 3-node JetStream cluster with
replicas 3), a throwaway PostgreSQL (Unix socket), influxd, and N `nms serve --role R` members per
role, each with its own config derived from a base config. The launcher makes the bus's streams and
membership buckets once, before any member starts (a member then finds them as wanted and asks
JetStream nothing more). Everything lives in one directory:

    state.json            what runs: every member's name, role, pid (+ start time), url, log
    secrets/              0600: API tokens (admin, ingest), the NATS token, the command signing key
    nats/ (or nats-1/ nats-2/ nats-3/) influxd/ postgres/   the servers' data and logs
    members/<name>/       nms.yaml (secrets referenced as ${file:...}), data/, serve.log

`up` in a directory holding a stopped cluster starts it again on its data (new ports); one holding a
running cluster is refused. `down` stops every member (SIGTERM, SIGKILL after a bound) and keeps the
directory unless asked to purge it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from nms.app.local_daemons import (
    InfluxServer,
    MissingBinary,
    NatsServer,
    PostgresServer,
    alive,
    free_port,
    influx_answers,
    nats_answers,
    nats_cluster,
    postgres_answers,
    postgres_bin_dir,
    start_nats_cluster,
    start_time,
    stop_pid,
    which,
)
from nms.store.influx import read_ledger

ROLES = ("api", "poll", "correlate", "write")
NATS_NODES = (1, 3)  # one nats-server, or a JetStream cluster of three (streams with replicas 3)
MAKE_BUS_TRY_S = 5.0  # how long one JetStream request of make_bus waits before it is sent again
DEFAULT_DIR = "/tmp/nms-cluster"
STOP_TIMEOUT = 15.0
# what the built-in base config holds: no switches, nothing to poll; every member's own settings
# (data_dir, api, store, state, cluster.bus) are filled in per member
BUILTIN_BASE: dict[str, Any] = {"site": "local-cluster", "log_level": "info",
                                "cluster": {"write": {"batch_messages": 64, "fetch_timeout": 0.5}}}


class ClusterError(RuntimeError):
    """A launcher refusal or failure, said in one line."""


@dataclass
class Member:
    name: str
    role: str  # "nats", "postgres", "influxd" or an `nms serve` role
    pid: int
    started: int | None  # /proc start time: the pid is this member only while it matches
    url: str
    log: str

    def alive(self) -> bool:
        return alive(self.pid, self.started)


def missing_binaries() -> list[str]:
    """What `up` needs and this machine lacks, each with its Debian package."""
    missing = [f"{name} (apt-get install {pkg})" for name, pkg in (("nats-server", "nats-server"),
                                                                    ("influxd", "influxdb")) if which(name) is None]
    if postgres_bin_dir() is None:
        missing.append("initdb/postgres (apt-get install postgresql)")
    if os.geteuid() == 0 and which("setpriv") is None:
        missing.append("setpriv (apt-get install util-linux)")
    return missing


class ClusterDir:
    def __init__(self, path: str | os.PathLike) -> None:
        self.root = Path(path).resolve()

    state = property(lambda self: self.root / "state.json")
    secrets = property(lambda self: self.root / "secrets")

    def member_dir(self, name: str) -> Path:
        return self.root / "members" / name

    def member_data(self, name: str) -> Path:
        """The member's `data_dir` (its store's spool is `spool` in it, the InfluxDB store's default)."""
        return self.member_dir(name) / "data"

    def members(self) -> list[Member]:
        if not self.state.exists():
            return []
        return [Member(**m) for m in json.loads(self.state.read_text())["members"]]

    def save(self, members: list[Member], **extra: Any) -> None:
        tmp = self.root / "state.tmp"
        tmp.write_text(json.dumps({"members": [m.__dict__ for m in members], **extra}, indent=2) + "\n")
        tmp.rename(self.state)

    def secret(self, name: str, make: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> Path:
        """secrets/<name>, made once (0600) and reused by every later `up`."""
        path = self.secrets / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(make() + "\n")
        return path


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def bus_settings(base: dict[str, Any], nats_urls: list[str], token: str | None) -> dict[str, Any]:
    """`cluster.bus` of every member: the base's, with the launcher's servers, token and replicas (one
    per node: 1 or 3)."""
    bus = _merge((base.get("cluster") or {}).get("bus") or {},
                 {"servers": list(nats_urls), "token": token, "replicas": len(nats_urls)})
    for key in ("username", "password"):
        bus.pop(key, None)
    return bus


def member_config(base: dict[str, Any], cdir: ClusterDir, name: str, port: int, nats_urls: str | list[str],
                  influx_url: str, pg_dsn: str) -> dict[str, Any]:
    """The base config with this member's own settings; secrets stay in secrets/ (${file:...}). The
    base's API tokens (its agents', say) are kept, the launcher's two added."""
    tokens = [*((base.get("api") or {}).get("tokens") or []),
              {"name": "cluster-admin", "scopes": ["admin"], "token": f"${{file:{cdir.secrets / 'api-token'}}}"},
              {"name": "cluster-ingest", "scopes": ["ingest"], "token": f"${{file:{cdir.secrets / 'ingest-token'}}}"}]
    urls = [nats_urls] if isinstance(nats_urls, str) else nats_urls
    bus = bus_settings(base, urls, f"${{file:{cdir.secrets / 'nats-token'}}}")
    own = {"data_dir": str(cdir.member_data(name)),
           "api": {"host": "127.0.0.1", "port": port, "tokens": tokens},
           "store": {"backend": "influxdb", "influxdb": {"url": influx_url, "database": "nms", "flush_interval": 0.2}},
           "state": {"backend": "postgresql", "dsn": pg_dsn},
           # a stable name in the bus: a restarted member takes its own share back, under its own consumer
           "cluster": {"bus": bus, "poll": {"member": name}, "correlate": {"member": name}}}
    doc = _merge(base, own)
    doc["store"] = own["store"]  # not merged: the base's store (another backend's keys) is replaced
    doc["state"] = own["state"]
    return doc


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _wait(what: str, check: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterError(f"{what} exited at start (status {proc.returncode}); log {log}:\n{_tail(log, 2000)}")
        if check():
            return
        time.sleep(0.1)
    raise ClusterError(f"{what} did not answer within {timeout:.0f}s; log {log}:\n{_tail(log, 2000)}")


def _tail(log: Path, n: int) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def last_line(log: str | Path) -> str:
    lines = _tail(Path(log), 4000).strip().splitlines()
    return lines[-1] if lines else ""


def _api_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def up(path: str | os.PathLike, counts: dict[str, int], base_config: Path | None = None,
       timeout: float = 90.0, step: Callable[[str], None] = lambda _: None, nats_nodes: int = 1) -> list[Member]:
    """Start the cluster in `path`; returns its members once each answers. On a failure what was
    started is stopped again."""
    unknown = set(counts) - set(ROLES)
    if unknown or any(n < 0 for n in counts.values()):
        raise ClusterError(f"member counts: roles are {', '.join(ROLES)}, each 0 or more")
    if nats_nodes not in NATS_NODES:
        raise ClusterError(f"--nats-nodes {nats_nodes}: one of {', '.join(map(str, NATS_NODES))}")
    if counts.get("api", 0) < 1:
        raise ClusterError("--api: a cluster needs at least one API member")
    missing = missing_binaries()
    if missing:
        raise ClusterError(f"cannot start a cluster: not found on PATH: {', '.join(missing)}")
    cdir = ClusterDir(path)
    running = [m.name for m in cdir.members() if m.alive()]
    if running:
        raise ClusterError(f"{cdir.root} holds a running cluster ({', '.join(running)}): "
                           f"`nms cluster down --dir {cdir.root}` first")
    base = BUILTIN_BASE
    if base_config is not None:
        try:
            base = yaml.safe_load(Path(base_config).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ClusterError(f"--config {base_config}: {e}") from None
        if not isinstance(base, dict):
            raise ClusterError(f"--config {base_config}: not a YAML mapping")
    cdir.root.mkdir(parents=True, exist_ok=True)
    # PostgreSQL runs as `postgres` when we are root: it must pass through the directory (not list it)
    os.chmod(cdir.root, 0o711 if os.geteuid() == 0 else 0o700)
    cdir.secrets.mkdir(mode=0o700, exist_ok=True)
    for name in ("api-token", "ingest-token", "nats-token"):
        cdir.secret(name)

    members: list[Member] = []
    nats_token = (cdir.secrets / "nats-token").read_text().strip()
    try:
        if nats_nodes == 1:
            step("nats-server")
            nats = NatsServer(cdir.root / "nats", token=nats_token)
            nats.start(timeout)
            nodes = [nats]
        else:
            step(f"{nats_nodes} nats-server nodes")
            nodes = nats_cluster(cdir.root, nats_nodes, nats_token)
            took = start_nats_cluster(nodes, timeout)
            step(f"NATS cluster ready in {took:.1f} s")
        members.extend(_daemon_member(node.name, node, node.url, "nats") for node in nodes)
        nats_urls = [node.url for node in nodes]
        step("streams and buckets")
        make_bus(base, nats_urls, nats_token, counts, timeout)
        step("PostgreSQL")
        pg = PostgresServer(dir=cdir.root / "postgres")
        pg.start(timeout)
        members.append(_daemon_member("postgres", pg, str(pg.dir)))
        dsn = pg.create_database("nms", exist_ok=True)
        step("influxd")
        influx = InfluxServer(cdir.root / "influxd")
        influx.start(timeout)
        members.append(_daemon_member("influxd", influx, influx.url))
        cdir.save(members, base_config=str(base_config) if base_config else None)

        signing_key = _signing_key(cdir)
        started: list[tuple[Member, subprocess.Popen, int]] = []
        for role in ROLES:
            for i in range(1, counts.get(role, 0) + 1):
                started.append(_start_member(cdir, base, role, f"{role}-{i}", signing_key,
                                             {"nats_urls": nats_urls, "influx_url": influx.url, "pg_dsn": dsn}))
                members.append(started[-1][0])
                cdir.save(members, base_config=str(base_config) if base_config else None)
        for member, proc, offset in started:
            step(f"waiting for {member.name}")
            log = Path(member.log)
            if member.role == "api":
                _wait(member.name, lambda m=member: _api_healthy(m.url), proc, log, timeout)
            else:
                _wait(member.name, lambda lg=log, o=offset: _logged_since(lg, o, "service started: roles"),
                      proc, log, timeout)
    except (ClusterError, MissingBinary, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        step("stopping what started")
        _stop_all(members)
        cdir.save(members, base_config=str(base_config) if base_config else None)
        if isinstance(e, ClusterError):
            raise
        raise ClusterError(str(e)) from None
    return members


def make_bus(base: dict[str, Any], nats_urls: list[str], token: str | None, counts: dict[str, int],
             timeout: float) -> None:
    """The telemetry streams and the membership buckets of the roles started, made once here with the
    members' own settings, asked again until `timeout`: with replicas 3, making them is a JetStream
    cluster's proposal, which took longer than a member's `publish_timeout` on a loaded machine when
    every member made them at its start; and after a restart of the nodes a stream answers nothing
    until its replicas elected a leader (a request sent before is never answered: asked again)."""
    from nms.app import member_health
    from nms.app.membership import bucket_spec
    from nms.app.telemetry_bus import stream_specs
    from nms.bus import BusError, BusUnavailable
    from nms.bus.nats import NatsBus
    from nms.config.models import ClusterConfig

    try:
        cfg = ClusterConfig.model_validate({**(base.get("cluster") or {}),
                                            "bus": {**bus_settings(base, nats_urls, token),
                                                    "publish_timeout": MAKE_BUS_TRY_S, "connect_timeout": timeout}})
    except ValueError as e:
        raise ClusterError(f"the base config's cluster section: {e}") from None
    assert cfg.bus is not None
    heartbeats = {"poll": cfg.poll.heartbeat, "correlate": cfg.correlate.heartbeat}
    buckets = [bucket_spec(cfg.bus, role, heartbeats[role]) for role in heartbeats if counts.get(role, 0)]
    buckets.append(bucket_spec(cfg.bus, member_health.ROLE, member_health.HEARTBEAT_S))  # every member's health

    async def make() -> None:
        bus = NatsBus(cfg.bus)  # type: ignore[arg-type]
        await bus.connect()
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    await bus.ensure_streams(stream_specs(cfg.bus))  # type: ignore[arg-type]
                    for spec in buckets:
                        await bus.key_value(spec)
                    return
                except BusUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await bus.close()

    try:
        asyncio.run(make())
    except BusError as e:
        raise ClusterError(f"NATS at {', '.join(nats_urls)}: {e}") from None


def _start_member(cdir: ClusterDir, base: dict[str, Any], role: str, name: str, signing_key: Path,
                  servers: dict[str, str]) -> tuple[Member, subprocess.Popen, int]:
    """Write the member's config and start `nms serve --role <role>`; returns it, its process and where
    this run's log begins."""
    mdir = cdir.member_dir(name)
    cdir.member_data(name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(signing_key, cdir.member_data(name) / "command_signing.key")  # API workers sign agent commands alike
    port = free_port()
    config = mdir / "nms.yaml"
    _write_private(config, yaml.safe_dump(member_config(base, cdir, name, port, **servers), sort_keys=False))
    log = mdir / "serve.log"
    with open(log, "ab") as out:
        offset = out.tell()  # the log of an earlier `up` of this directory does not count
        proc = subprocess.Popen([sys.executable, "-m", "nms", "serve", "--config", str(config), "--role", role],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "NMS_CLUSTER_MEMBER": name})
    url = f"http://127.0.0.1:{port}" if role == "api" else ""
    return Member(name, role, proc.pid, start_time(proc.pid), url, str(log)), proc, offset


def _logged_since(log: Path, offset: int, text: str) -> bool:
    with open(log, "rb") as f:
        f.seek(offset)
        return text in f.read().decode(errors="replace")


def _daemon_member(name: str, daemon: Any, url: str, role: str | None = None) -> Member:
    pid = daemon.pid
    return Member(name, role or name, pid, start_time(pid), url, str(daemon.log_path))


def _signing_key(cdir: ClusterDir) -> Path:
    from nms.signing import KEY_FILE, _load_or_create

    path = cdir.secrets / KEY_FILE
    _load_or_create(path)  # made 0600 by the service's own code, once
    return path


def _stop_all(members: list[Member]) -> dict[str, str]:
    """The nms members first (they flush to the servers), then influxd, PostgreSQL, NATS."""
    def stop(member: Member) -> str:
        sig = signal.SIGINT if member.role == "postgres" else signal.SIGTERM  # PostgreSQL's fast shutdown
        return stop_pid(member.pid, member.started, sig, STOP_TIMEOUT)

    with ThreadPoolExecutor(max(1, len(members))) as pool:  # the nms members stop together
        results = dict(zip([m.name for m in members if m.role in ROLES],
                           pool.map(stop, [m for m in members if m.role in ROLES]), strict=True))
    for member in reversed([m for m in members if m.role not in ROLES]):
        results[member.name] = stop(member)
    return results


def down(path: str | os.PathLike, purge: bool = False) -> dict[str, str]:
    cdir = ClusterDir(path)
    if not cdir.state.exists():
        raise ClusterError(f"no cluster in {cdir.root} (no state.json)")
    results = _stop_all(cdir.members())
    if purge:
        shutil.rmtree(cdir.root)
    return results


# how status asks each server whether it answers, given its url
SERVERS: dict[str, Callable[[str], bool]] = {
    "nats": nats_answers, "influxd": influx_answers,
    "postgres": lambda socket_dir: postgres_answers(PostgresServer.socket_dsn(socket_dir))}


def status(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Each member: name, role, pid, url, alive, health (API: /health's answer; others: the last log line)."""
    cdir = ClusterDir(path)
    if not cdir.state.exists():
        raise ClusterError(f"no cluster in {cdir.root} (no state.json)")
    rows = []
    members = cdir.members()
    entries = _member_entries(cdir, [m for m in members if m.role == "api" and m.alive()])
    for m in members:
        is_alive = m.alive()
        health: str
        if not is_alive:
            health = "dead" + _stored_words(member_ledger(cdir, m.name))
        elif m.name in entries:
            health = _summary(entries[m.name])
        elif m.role == "api":
            try:
                r = httpx.get(f"{m.url}/health", timeout=2.0)
                health = f"{r.status_code} {r.json().get('status', '')}".strip()
            except (httpx.HTTPError, ValueError) as e:
                health = f"no answer: {e}"
        elif m.role in SERVERS:
            health = "answers" if SERVERS[m.role](m.url) else f"no answer; log: {last_line(m.log)}"
        else:
            health = last_line(m.log).split(": ", 1)[-1]  # without the timestamp and level
        rows.append({"name": m.name, "role": m.role, "pid": m.pid, "url": m.url, "log": m.log,
                     "state": "alive" if is_alive else "dead", "health": health})
    return rows


def member_ledger(cdir: ClusterDir, name: str) -> dict[str, Any] | None:
    """What InfluxDB acknowledged to the member (its store's ledger, nms/store/influx.py), dead or alive."""
    return read_ledger(cdir.member_data(name) / "spool")


def _stored_words(ledger: dict[str, Any] | None) -> str:
    if not ledger or not any(ledger[k] for k in ("points_written", "points_in_flight", "spool_points")):
        return ""
    words = f"; InfluxDB acknowledged {ledger['points_written']:,} points to it"
    if ledger["points_in_flight"]:
        words += f", {ledger['points_in_flight']:,} were on their way when it stopped"
    if ledger["spool_points"]:
        words += f", {ledger['spool_points']:,} wait in its spool (start it again to deliver them)"
    return words


def _member_entries(cdir: ClusterDir, apis: list[Member]) -> dict[str, dict[str, Any]]:
    """The members' health entries in the bus (GET /cluster/members of the first API worker answering)."""
    token = cdir.secrets / "api-token"
    for api in apis:
        try:
            r = httpx.get(f"{api.url}/cluster/members", timeout=2.0,
                          headers={"Authorization": f"Bearer {token.read_text().strip()}"})
            if r.status_code == 200:
                return {e["member"]: e for e in r.json()}
        except (httpx.HTTPError, OSError, ValueError):
            continue
    return {}


def _summary(entry: dict[str, Any]) -> str:
    """One line of a member's health entry: ok or degraded, what is down, its share."""
    h = entry.get("health") or {}
    down = [name for name in ("store", "bus", "state") if h.get(f"{name}_ok") is False]
    share = [f"{h['switches']} switches" if "switches" in h else "",
             f"partitions {','.join(h['partitions'])}" if h.get("partitions") else ""]
    words = ["ok" if h.get("ok") else "degraded", *(f"{d} down" for d in down), *filter(None, share)]
    return ", ".join(words)
