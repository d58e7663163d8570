"""A throwaway PostgreSQL server for tests (Debian's postgresql 15), plus pytest fixtures that run
a state store test on SQLite and on PostgreSQL.

The cluster is made by initdb in its own temporary directory and listens on a Unix socket there
only (no TCP port). As root it runs as the `postgres` user (setpriv: PostgreSQL refuses root). One
server per test session; each test gets its own databases, dropped after it.
"""

from __future__ import annotations

import itertools
import os
import pwd
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nms.app import local_daemons
from nms.app.local_daemons import postgres_bin_dir
from nms.state import StateStore

SKIP_REASON = ("PostgreSQL server binaries (initdb, postgres) not installed: apt-get install postgresql "
               "(CI installs it: scripts/test.sh)")


class PostgresServer(local_daemons.PostgresServer):
    """The product's throwaway PostgreSQL (nms/app/local_daemons.py) with a new database per call."""

    def __init__(self, bin_dir: Path) -> None:
        super().__init__(bin_dir)
        self.ids = itertools.count(1)

    def create_database(self, name: str | None = None, exist_ok: bool = False) -> str:
        return super().create_database(name or f"t{next(self.ids)}", exist_ok)


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
