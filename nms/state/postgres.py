"""PostgreSQL connections for the state store (psycopg 3, autocommit: transactions are explicit).

The DSN may carry a password: only `describe_dsn` (user, host, port, database) is ever logged or
put in an error.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from nms.state.db import Database, PostgresDialect, StateUnavailable


def describe_dsn(dsn: str) -> str:
    """`postgresql://user@host:port/dbname` of a DSN, without its password (or `<invalid DSN>`)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<invalid DSN>"
    host = str(info.get("host") or "<local socket>")
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{host}{port}/{info.get('dbname') or ''}"


def _connect(dsn: str, connect_timeout: float) -> psycopg.Connection:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout)))
    except psycopg.OperationalError as e:
        # libpq's message names host and port, never the password
        reason = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise StateUnavailable(f"state store: cannot connect to PostgreSQL at {describe_dsn(dsn)}: {reason}") from e


def postgres_database(dsn: str, connect_timeout: float = 10.0) -> Database:
    """Connect now (a clear StateUnavailable when PostgreSQL cannot be reached); after an outage the
    next use connects again."""
    return Database(_connect(dsn, connect_timeout), PostgresDialect(), describe_dsn(dsn),
                    errors=(psycopg.OperationalError,), reconnect=lambda: _connect(dsn, connect_timeout))
