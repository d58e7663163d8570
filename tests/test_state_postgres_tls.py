"""The state store on PostgreSQL over TLS: the DSN goes to libpq as it is, so `sslmode=verify-full
sslrootcert=<ca>` verifies the server's certificate and name. A real PostgreSQL (tests/_postgres.py)
with `ssl = on`, listening on 127.0.0.1 with `hostssl` (password) and `hostnossl ... reject` in
pg_hba.conf; throwaway CAs from tests/_tls.py."""

from __future__ import annotations

import os
import pwd
import shutil

import pytest

from nms.app.local_daemons import PostgresServer, free_port, postgres_bin_dir
from nms.config.loader import parse_config
from nms.state import StateStore, StateUnavailable
from tests._postgres import SKIP_REASON
from tests._tls import Pki, make_pki

PASSWORD = "pg-Secret-4711-do-not-log"


class TlsPostgresServer(PostgresServer):
    """The product's throwaway PostgreSQL, also on 127.0.0.1 with TLS: TCP clients must use TLS and a
    password (user `member`); the Unix socket stays as it is (trust, for the test's own setup)."""

    def __init__(self, pki: Pki) -> None:
        super().__init__()
        self.port = free_port()  # the socket's name, and the TCP port
        data = self.dir / "data"
        for src, name in ((pki.server_cert, "server.crt"), (pki.server_key, "server.key")):
            shutil.copyfile(src, data / name)
            (data / name).chmod(0o600)  # PostgreSQL refuses a key others may read
            if os.geteuid() == 0:
                pg = pwd.getpwnam("postgres")
                os.chown(data / name, pg.pw_uid, pg.pw_gid)
        hba = data / "pg_hba.conf"
        hba.write_text("hostssl all member 127.0.0.1/32 scram-sha-256\n"
                       "hostnossl all all 127.0.0.1/32 reject\n" + hba.read_text())

    def spawn(self, argv, ready, timeout, what) -> None:  # type: ignore[no-untyped-def]
        argv = ["listen_addresses=127.0.0.1" if a == "listen_addresses=" else a for a in argv]  # the product's: no TCP
        super().spawn([*argv, "-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key"],
                      ready, timeout, what)

    def dsn(self, dbname: str = "postgres") -> str:  # the socket of this port (the product's: 5432)
        return f"host={self.dir} port={self.port} user=nms dbname={dbname}"

    def tcp_dsn(self, dbname: str, **params: str) -> str:
        extra = "".join(f" {k}={v}" for k, v in params.items())
        return f"host=127.0.0.1 port={self.port} user=member password={PASSWORD} dbname={dbname}{extra}"


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory):
    if postgres_bin_dir() is None:
        pytest.skip(SKIP_REASON)
    root = tmp_path_factory.mktemp("pgtls")
    pki, other = make_pki(root / "site", "site"), make_pki(root / "other", "other")
    if os.geteuid() == 0:  # the postgres user reads the CA files through this directory
        for d in (root, root / "site", root / "other"):
            d.chmod(0o755)
    server = TlsPostgresServer(pki)
    try:
        server.start()
        import psycopg

        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE member LOGIN PASSWORD '{PASSWORD}'")
            admin.execute('CREATE DATABASE "state_tls" OWNER member')
        yield server, pki, other
    finally:
        server.cleanup()


def test_verify_full_with_the_right_ca_keeps_state_over_tls(tls_postgres, tmp_path):
    server, pki, _ = tls_postgres
    dsn = server.tcp_dsn("state_tls", sslmode="verify-full", sslrootcert=str(pki.ca))
    # the member's configuration takes the DSN with its TLS parameters as it is
    config = parse_config(f"state: {{backend: postgresql, dsn: '{dsn}'}}\n", "member.yaml", base_dir=tmp_path)
    store = StateStore.open(config.state, tmp_path)
    try:
        store.put_agent("h1", '{"host": "h1"}', 1)
        assert store.agents() == [(1, '{"host": "h1"}')]
        with store.database.read() as db:
            ssl, version = db.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert ssl is True and version.startswith("TLSv1.")
        assert PASSWORD not in store.where
    finally:
        store.close()


def test_a_wrong_ca_a_wrong_name_or_no_tls_are_refused_without_the_password(tls_postgres):
    server, pki, other = tls_postgres
    with pytest.raises(StateUnavailable) as wrong_ca:
        StateStore(dsn=server.tcp_dsn("state_tls", sslmode="verify-full", sslrootcert=str(other.ca)),
                   connect_timeout=3)
    message = str(wrong_ca.value)
    assert message.startswith(f"state store: cannot connect to PostgreSQL at postgresql://member@127.0.0.1:"
                              f"{server.port}/state_tls: ")
    assert "certificate verify failed" in message and PASSWORD not in message
    # the right CA, but the name the member dials is not in the certificate (verify-full checks it)
    with pytest.raises(StateUnavailable) as wrong_name:
        StateStore(dsn=server.tcp_dsn("state_tls", sslmode="verify-full", sslrootcert=str(pki.ca),
                                      hostaddr="127.0.0.1").replace("host=127.0.0.1", "host=db.invalid"),
                   connect_timeout=3)
    assert 'does not match host name "db.invalid"' in str(wrong_name.value)
    assert PASSWORD not in str(wrong_name.value)
    # a member without TLS: the server's pg_hba refuses it
    with pytest.raises(StateUnavailable) as plain:
        StateStore(dsn=server.tcp_dsn("state_tls", sslmode="disable"), connect_timeout=3)
    assert "no encryption" in str(plain.value) and PASSWORD not in str(plain.value)
