"""The one connection of a state store, over SQLite or PostgreSQL: the SQL is written once (with
`?` placeholders and `{int}` / `{id}` column types) and the dialect fills in what differs.

A `Database` is used by one thread at a time (its lock). Writes go through `transaction()`:
SQLite's `BEGIN IMMEDIATE` takes the file's write lock; on PostgreSQL, `transaction(serial=...)`
also takes a transaction-level advisory lock, so rows whose ids are read as a cursor (`after=`:
incident and action events, agent commands) commit in the order of their ids across processes.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class StateUnavailable(RuntimeError):
    """The state database cannot be reached (PostgreSQL down, or refusing this connection). Its
    message names the database by `describe_dsn` and carries the driver's reason; `reason` is that
    message with anything shaped like a password taken out, for answers to API clients."""

    @property
    def reason(self) -> str:
        return redact_password(str(self))


_PASSWORDS = (re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),  # key=value DSN
              re.compile(r"(://[^/\s:@]*:)[^@\s/]*(@)"))  # URL DSN: scheme://user:password@host


def redact_password(text: str) -> str:
    """`text` with the passwords of DSNs in it replaced by `***`."""
    text = _PASSWORDS[0].sub(r"\1***", text)
    return _PASSWORDS[1].sub(r"\1***\2", text)


class Dialect:
    """SQLite: the SQL as written."""

    name = "sqlite"
    types = {"int": "INTEGER", "id": "INTEGER PRIMARY KEY AUTOINCREMENT"}
    begin = "BEGIN IMMEDIATE"

    def sql(self, text: str) -> str:
        return text

    def json_array_has(self, column: str, key: str) -> str:
        """A condition: the JSON array `key` of the TEXT column holds the value of the next parameter."""
        return f"EXISTS (SELECT 1 FROM json_each({column}, '$.{key}') WHERE value = ?)"

    def last_id(self, table: str) -> str:
        """A query of the highest id an identity key of `table` ever gave (NULL or no row: none)."""
        return f"SELECT seq FROM sqlite_sequence WHERE name = '{table}'"

    def columns(self, table: str) -> str:
        """A query whose rows name the columns of `table` in their second field."""
        return f"PRAGMA table_info({table})"

    def serial(self, name: str) -> str | None:
        """A statement that serializes transactions on `name` across processes (None: BEGIN does)."""
        return None


class PostgresDialect(Dialect):
    name = "postgresql"
    types = {"int": "BIGINT", "id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"}
    begin = "BEGIN"

    def sql(self, text: str) -> str:
        return _pg_placeholders(text)

    def json_array_has(self, column: str, key: str) -> str:
        return f"EXISTS (SELECT 1 FROM jsonb_array_elements_text(({column})::jsonb -> '{key}') AS j(value) " \
               "WHERE j.value = ?)"

    def last_id(self, table: str) -> str:
        return f"SELECT pg_sequence_last_value(pg_get_serial_sequence('{table}', 'id')::regclass)"

    def columns(self, table: str) -> str:
        return ("SELECT ordinal_position, column_name FROM information_schema.columns "
                f"WHERE table_schema = current_schema() AND table_name = '{table}'")

    def serial(self, name: str) -> str | None:
        return f"SELECT pg_advisory_xact_lock(hashtext('nms.state.{name}'))"


@lru_cache(maxsize=512)
def _pg_placeholders(text: str) -> str:
    if "%" in text:  # psycopg would read it as a placeholder: literals go in parameters
        raise ValueError(f"a literal % in state SQL: {text[:80]}")
    return text.replace("?", "%s")


class Database:
    """One connection of the state store; `where` names it in errors (no password)."""

    def __init__(self, conn: Any, dialect: Dialect, where: str, errors: tuple[type[Exception], ...] = (),
                 reconnect: Callable[[], Any] | None = None):
        self.where = where
        self._conn = conn  # sqlite3.Connection (autocommit) or psycopg.Connection (autocommit)
        self._lost = False
        self.dialect = dialect
        self.lock = threading.RLock()
        self._errors = errors  # connection-level errors of the driver, raised as StateUnavailable
        self._reconnect = reconnect  # () -> Connection, for a connection lost during an outage

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            cur: Cursor = self._conn.execute(self.dialect.sql(sql), params)
        except self._errors as e:
            self._lost = True
            raise StateUnavailable(f"state store at {self.where}: {e}") from e
        return cur

    def insert(self, sql: str, params: Sequence[Any] = ()) -> int | None:
        """Run an INSERT of one row; its new id, or None when it inserted nothing (ON CONFLICT DO NOTHING)."""
        row = self.execute(sql + " RETURNING id", params).fetchone()
        return None if row is None else int(row[0])

    def _ensure_connected(self) -> None:
        if self._lost and self._reconnect is not None:
            try:
                self._conn.close()
            except Exception:  # it is gone already
                pass
            self._conn = self._reconnect()
            self._lost = False

    @contextmanager
    def read(self) -> Iterator[Database]:
        """One thread at a time; each statement is its own transaction."""
        with self.lock:
            self._ensure_connected()
            yield self

    @contextmanager
    def transaction(self, serial: str | None = None) -> Iterator[Database]:
        """All of it is stored, or none."""
        with self.lock:
            self._ensure_connected()
            self.execute(self.dialect.begin)
            try:
                lock = self.dialect.serial(serial) if serial else None
                if lock is not None:
                    self.execute(lock)
                yield self
            except BaseException:
                try:
                    self.execute("ROLLBACK")
                except StateUnavailable:
                    pass  # the connection is gone, and the transaction with it
                raise
            self.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self._conn.close()


def open_sqlite(path: Path) -> sqlite3.Connection:
    """An SQLite database for service state: autocommit (explicit transactions), WAL, any thread."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def sqlite_database(path: Path) -> Database:
    return Database(open_sqlite(path), Dialect(), str(path))
