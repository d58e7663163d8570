"""Daemons run on this machine, in a directory of their own, on loopback only: nats-server with
JetStream, influxd (InfluxDB 1.x), a throwaway PostgreSQL (initdb, Unix socket). `nms cluster` starts
its members with them and the tests their servers.

A daemon starts until it is ready, logs to `<dir>/<name>.log` (appended: a restart keeps the earlier
log) and stops with its own "shut down now" signal, SIGKILL after a bound. `stop_pid` stops one by
pid, for a launcher that ran it in an earlier process: the pid counts as the same process only while
its start time (from /proc) is the one recorded, so a reused pid is never signalled.
"""

from __future__ import annotations

import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

# binary -> the Debian package that installs it
PACKAGES = {"nats-server": "nats-server", "influxd": "influxdb", "initdb": "postgresql", "postgres": "postgresql",
            "setpriv": "util-linux"}


class MissingBinary(RuntimeError):
    """A program a daemon needs is not installed; the message names its Debian package."""


# Ports handed to daemons come from below the kernel's ephemeral range (32768-60999 by default):
# a port the kernel picks for "port 0" stays free only until any outgoing connection takes it as its
# source port, which happened in CI between free_port() and influxd's bind ("address already in use").
_LISTEN_PORTS = range(20000, 32768)
_handed_out: set[int] = set()
_pick = random.SystemRandom()  # not the module's generator: code that seeds it would make processes pick alike


def free_port(udp: bool = False) -> int:
    """A loopback TCP (or UDP) port nobody listens on, outside the ephemeral range, not handed out
    before by this process (a daemon binds it later; two callers must not get the same one)."""
    for _ in range(200):
        port = _pick.choice(_LISTEN_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_LISTEN_PORTS.start}-{_LISTEN_PORTS.stop - 1}")


def which(name: str) -> str | None:
    """The program on PATH (Debian's nats-server is /usr/sbin/nats-server: PATH must hold /usr/sbin)."""
    return shutil.which(name)


def require(name: str) -> str:
    found = which(name)
    if found is None:
        raise MissingBinary(f"{name} not found on PATH: apt-get install {PACKAGES.get(name, name)}")
    return found


def postgres_bin_dir() -> Path | None:
    """Debian keeps initdb and postgres in /usr/lib/postgresql/<version>/bin, outside PATH."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists() and Path(candidate, "postgres").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("postgres") else None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name (field 2) may hold spaces and parentheses
    if fields[0] == "Z":  # a zombie has exited
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def stop_pid(pid: int, started: int | None, sig: int = signal.SIGTERM, timeout: float = 15.0) -> str:
    """Stop the process `pid` if it is still the one started at `started`: `sig`, then SIGKILL after
    `timeout`. Returns "not running", "stopped" or "killed"."""
    if not alive(pid, started):
        return "not running"
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid, started):
            return "stopped"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    while alive(pid, started):
        time.sleep(0.02)
    return "killed"


class LocalDaemon:
    name = "daemon"  # what the errors call it; the log is `<name>.log` in `dir`
    stop_signal = signal.SIGTERM  # the daemon's own "shut down now"
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self, argv: list[str], ready: Callable[[int], bool], timeout: float, what: str) -> None:
        """Run argv in its own session (it outlives the process that started it), logging to
        log_path, until ready(offset of this start in the log) holds; `what` says what was awaited if
        it never does."""
        assert self.proc is None, "already running"
        log = open(self.log_path, "ab")
        seen = log.tell()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"{self.name} exited at start; log:\n{self.log_tail()}")
            if ready(seen):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} {what} within {timeout}s; log:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(self.stop_signal)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _own_dir(dir: Path | None, prefix: str) -> Path:
    if dir is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    dir.mkdir(parents=True, exist_ok=True)
    return dir


def nats_answers(url: str) -> bool:
    """nats-server at nats://host:port greets every client first: it answers when it says INFO."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2.0) as s:
            return s.recv(4096).startswith(b"INFO ")
    except OSError:
        return False


def influx_answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ping", timeout=2.0).status_code == 204
    except httpx.HTTPError:
        return False


def postgres_answers(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class NatsServer(LocalDaemon):
    """nats-server with JetStream on a loopback port, its store in `dir` (a temporary one if None);
    restart keeps the port and the streams. `token`: clients must present it.

    As one node of a cluster (`nats_cluster` makes them): `server_name` (JetStream knows its peers by
    it, so it stays the same across restarts while ports change), a `cluster_port` the other nodes'
    routes reach, and `routes` to theirs."""

    name = "nats"

    def __init__(self, dir: Path | None = None, port: int | None = None, token: str | None = None,
                 server_name: str | None = None, cluster_port: int | None = None,
                 cluster_name: str = "nms") -> None:
        self.binary = require("nats-server")
        self.dir = _own_dir(dir, "nms-nats-")
        self.port = port or free_port()
        self.token = token
        self.server_name = server_name
        self.cluster_port = cluster_port
        self.cluster_name = cluster_name
        self.routes: list[str] = []
        if server_name is not None:
            self.name = server_name  # its log: <dir>/<server_name>.log
        self.proc = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def route_url(self) -> str:
        return f"nats://127.0.0.1:{self.cluster_port}"

    def answers(self) -> bool:
        return nats_answers(self.url)

    def start(self, timeout: float = 30.0) -> None:
        def ready(seen: int) -> bool:  # a restart appends to the log: only what this start logs counts
            return "Server is ready" in self.log_since(seen) and self.answers()
        auth = ["--auth", self.token] if self.token else []
        cluster: list[str] = []
        if self.cluster_port is not None:
            cluster = ["--cluster_name", self.cluster_name, "--cluster", self.route_url]
            if self.routes:
                cluster += ["--routes", ",".join(self.routes)]
        self.spawn([self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir / "js"),
                    "-n", self.server_name or f"nms-{self.port}", *auth, *cluster], ready, timeout, "not ready")


def nats_cluster(root: Path, nodes: int, token: str | None = None) -> list[NatsServer]:
    """`nodes` nats-server nodes of one JetStream cluster on loopback, not started: node i is
    `nats-i`, its store in `root/nats-i`, routes to every other node."""
    servers = [NatsServer(root / f"nats-{i}", token=token, server_name=f"nats-{i}", cluster_port=free_port())
               for i in range(1, nodes + 1)]
    for server in servers:
        server.routes = [other.route_url for other in servers if other is not server]
    return servers


def jetstream_ready(url: str, token: str | None = None, timeout: float = 2.0) -> bool:
    """JetStream at `url` answers its account info (in a cluster: a metadata leader was elected)."""
    import asyncio

    import nats

    async def ask() -> None:
        nc = await nats.connect(url, token=token, connect_timeout=timeout, allow_reconnect=False,
                                max_reconnect_attempts=0)
        try:
            await nc.jetstream(timeout=timeout).account_info()
        finally:
            await nc.close()

    try:
        asyncio.run(ask())
    except Exception:  # not up, no leader yet, no answer in time: not ready
        return False
    return True


def start_nats_cluster(servers: list[NatsServer], timeout: float = 60.0) -> float:
    """Start every node, then wait until JetStream answers through each (a metadata leader was
    elected); returns the seconds it took. On a failure the nodes started are stopped."""
    started = time.monotonic()
    deadline = started + timeout
    try:
        for server in servers:
            server.start(max(1.0, deadline - time.monotonic()))
        while not all(jetstream_ready(s.url, s.token) for s in servers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"NATS cluster: JetStream elected no metadata leader within {timeout:g}s; "
                                   f"log of {servers[0].name}:\n{servers[0].log_tail()}")
            time.sleep(0.2)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return time.monotonic() - started


class InfluxServer(LocalDaemon):
    """influxd (1.x) on free loopback ports with config, meta, data and WAL in `dir` (a temporary one
    if None); restart keeps the port and the data."""

    name = "influxd"

    def __init__(self, dir: Path | None = None, auth: bool = False, port: int | None = None) -> None:
        self.binary = require("influxd")
        self.dir = _own_dir(dir, "nms-influxd-")
        self.port = port or free_port()
        self.rpc_port = free_port()
        self.auth = auth
        self.proc = None
        self.config = self.dir / "influxdb.conf"
        self.config.write_text(self._config_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config_text(self) -> str:
        d = self.dir
        return f"""\
reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"

[meta]
  dir = "{d}/meta"
  logging-enabled = false

[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
  query-log-enabled = false
  trace-logging-enabled = false

[monitor]
  store-enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{self.port}"
  auth-enabled = {"true" if self.auth else "false"}
  log-enabled = false

[logging]
  level = "warn"

[continuous_queries]
  enabled = false
"""

    def answers(self) -> bool:
        return influx_answers(self.url)

    def start(self, timeout: float = 30.0) -> None:
        self.spawn([self.binary, "-config", str(self.config)], lambda _: self.answers(), timeout,
                   "did not answer /ping")

    def restart(self) -> None:
        self.stop()
        self.start()

    def query(self, q: str, db: str | None = None, auth: tuple[str, str] | None = None,
              method: str = "POST") -> dict:
        """Run InfluxQL directly (bypassing the store), for setup and independent checks."""
        params = {"q": q, "epoch": "ns"}
        if db:
            params["db"] = db
        r = httpx.request(method, f"{self.url}/query", params=params, auth=auth, timeout=10.0)
        return r.json()


class PostgresServer(LocalDaemon):
    """A throwaway PostgreSQL made by initdb in `dir` (a temporary one if None; kept if it holds one
    already), listening on a Unix socket there only (no TCP), superuser `nms`, trust authentication
    (the socket's directory is the access control). As root it runs as the `postgres` user (setpriv:
    PostgreSQL refuses root); fsync is off: for trying and tests, not for data to keep."""

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM would wait for every client to leave
    port = 5432  # names the socket file only: nothing listens on TCP

    def __init__(self, bin_dir: Path | None = None, dir: Path | None = None) -> None:
        found = bin_dir or postgres_bin_dir()
        if found is None:
            raise MissingBinary("initdb and postgres not found: apt-get install postgresql")
        self.bin_dir = found
        self.dir = _own_dir(dir, "nms-pg-")
        self.proc = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                pg = pwd.getpwnam("postgres")
            except KeyError:
                raise MissingBinary("running as root, PostgreSQL needs a `postgres` user to run as: "
                                    "apt-get install postgresql makes it") from None
            os.chown(self.dir, pg.pw_uid, pg.pw_gid)
            self._as_user = [require("setpriv"), f"--reuid={pg.pw_uid}", f"--regid={pg.pw_gid}", "--init-groups", "--"]
        if not (self.dir / "data" / "PG_VERSION").exists():
            subprocess.run([*self._as_user, str(self.bin_dir / "initdb"), "-D", str(self.dir / "data"), "-U", "nms",
                            "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C.UTF-8"],
                           check=True, capture_output=True, timeout=120)

    @classmethod
    def socket_dsn(cls, socket_dir: str | Path, dbname: str = "postgres") -> str:
        return f"host={socket_dir} port={cls.port} user=nms dbname={dbname}"

    def dsn(self, dbname: str = "postgres") -> str:
        return self.socket_dsn(self.dir, dbname)

    def answers(self) -> bool:
        return postgres_answers(self.dsn())

    def start(self, timeout: float = 60.0) -> None:
        def ready(seen: int) -> bool:
            return "ready to accept connections" in self.log_since(seen)

        self.spawn([*self._as_user, str(self.bin_dir / "postgres"), "-D", str(self.dir / "data"), "-k", str(self.dir),
                    "-p", str(self.port), "-c", "listen_addresses=", "-c", "fsync=off",
                    "-c", "synchronous_commit=off", "-c", "full_page_writes=off"], ready, timeout, "not ready")

    def create_database(self, name: str, exist_ok: bool = False) -> str:
        """The database `name` (made now); returns its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            if not (exist_ok and admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()):
                admin.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        import psycopg

        name = dsn.rsplit("dbname=", 1)[1]
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
