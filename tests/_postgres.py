"""A throwaway PostgreSQL server for tests (Debian's postgresql 15), plus pytest fixtures that run
a state store test on SQLite and on PostgreSQL.

The cluster is made by initdb in its own temporary directory and listens on a Unix socket there
only (no TCP port). As root it runs as the `postgres` user (setpriv: PostgreSQL refuses root). One
server per test session; each test gets its own databases, dropped after it.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from _daemon import LocalDaemon

from nms.state import StateStore

SKIP_REASON = ("PostgreSQL server binaries (initdb, postgres) not installed: apt-get install postgresql "
               "(CI installs it: scripts/test.sh)")


def postgres_bin_dir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists() and Path(candidate, "postgres").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("postgres") else None


class PostgresServer(LocalDaemon):
    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM would wait for every client to leave
    port = 5432  # names the socket file only: nothing listens on TCP

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="nms-pg-"))
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(self.dir, pg.pw_uid, pg.pw_gid)
            self._as_user = ["setpriv", f"--reuid={pg.pw_uid}", f"--regid={pg.pw_gid}", "--init-groups", "--"]
        subprocess.run([*self._as_user, str(bin_dir / "initdb"), "-D", str(self.dir / "data"), "-U", "nms",
                        "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C.UTF-8"],
                       check=True, capture_output=True, timeout=120)
        self.ids = itertools.count(1)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.dir} port={self.port} user=nms dbname={dbname}"

    def start(self, timeout: float = 60.0) -> None:
        def ready(seen: int) -> bool:
            return "ready to accept connections" in self.log_since(seen)

        self.spawn([*self._as_user, str(self.bin_dir / "postgres"), "-D", str(self.dir / "data"), "-k", str(self.dir),
                    "-p", str(self.port), "-c", "listen_addresses=", "-c", "fsync=off",
                    "-c", "synchronous_commit=off", "-c", "full_page_writes=off"], ready, timeout, "not ready")

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        name = f"t{next(self.ids)}"
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        name = dsn.rsplit("dbname=", 1)[1]
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(SKIP_REASON)
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, PostgreSQL needs a `postgres` user to run as (Debian's package makes it)")
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def postgres_database(postgres_server: PostgresServer) -> Iterator[Callable[[], str]]:
    """Make fresh databases (`dsn = make()`), dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(postgres_server.create_database())
        return made[-1]

    yield make
    for dsn in made:
        postgres_server.drop_database(dsn)


@pytest.fixture(params=["sqlite", "postgresql"])
def open_state(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., StateStore]:
    """`open_state(name="state")`: a StateStore of the test's backend; the same name opens the same
    database again (a restart). Run once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return lambda name="state": StateStore(tmp_path / f"{name}.sqlite")
    make = request.getfixturevalue("postgres_database")
    dsns: dict[str, str] = {}

    def open_pg(name: str = "state") -> StateStore:
        if name not in dsns:
            dsns[name] = make()
        return StateStore(dsn=dsns[name])

    return open_pg
