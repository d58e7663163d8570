"""The bus over TLS (cluster.bus.tls, nms/bus/nats.py) against a real nats-server whose client port has
a `tls {}` block, with throwaway CAs (tests/_tls.py): the right CA connects and carries JetStream
traffic, a wrong CA or a wrong name is refused at once with the cause, mutual TLS wants the client
certificate, and a member and a server that disagree on TLS are refused before anything is sent.
Then the configuration: files relative to the config file, each problem an error naming its field."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

from nms.app.local_daemons import NatsServer, free_port
from nms.bus import BusUnavailable, StreamSpec
from nms.bus.nats import NatsBus
from nms.config.loader import ConfigError, parse_config
from nms.config.models import BusConfig
from tests._nats import SKIP_REASON, have_nats_server
from tests._tls import Pki, make_pki


class TlsNatsServer(NatsServer):
    """nats-server with JetStream and TLS on its client port (the `tls {}` block of docs/deploy.md),
    `verify: true` when `verify_clients`; its monitoring port tells each connection's TLS version."""

    def __init__(self, pki: Pki, verify_clients: bool = False) -> None:
        super().__init__()
        self.http_port = free_port()
        verify = f"  ca_file: {json.dumps(str(pki.ca))}\n  verify: true\n" if verify_clients else ""
        self.conf = self.dir / "nats.conf"
        self.conf.write_text(f"http: \"127.0.0.1:{self.http_port}\"\n"
                             "tls {\n"
                             f"  cert_file: {json.dumps(str(pki.server_cert))}\n"
                             f"  key_file: {json.dumps(str(pki.server_key))}\n"
                             f"{verify}"
                             "  timeout: 2\n"
                             "}\n")

    @property
    def tls_url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def spawn(self, argv, ready, timeout, what) -> None:  # type: ignore[no-untyped-def]
        super().spawn([*argv, "-c", str(self.conf)], ready, timeout, what)

    def connections(self) -> list[dict]:
        return httpx.get(f"http://127.0.0.1:{self.http_port}/connz", timeout=5).json()["connections"] or []


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), "site")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki-other"), "other")


def _server(pki: Pki, verify_clients: bool):
    if not have_nats_server():
        pytest.skip(SKIP_REASON)
    server = TlsNatsServer(pki, verify_clients)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def tls_server(pki):
    yield from _server(pki, verify_clients=False)


@pytest.fixture(scope="module")
def mtls_server(pki):
    yield from _server(pki, verify_clients=True)


def _connect_error(config: BusConfig, within_s: float = 5.0) -> str:
    async def scenario() -> str:
        bus = NatsBus(config)
        try:
            await asyncio.wait_for(bus.connect(), within_s)  # refused at once: no hang, no endless retries
        except BusUnavailable as e:
            return str(e)
        await bus.close()
        raise AssertionError("connected")

    return asyncio.run(scenario())


def _round_trip(config: BusConfig, stream: str) -> tuple[list[bytes], dict]:
    """Publish two messages and fetch them through a durable consumer: what came back, and health."""
    async def scenario():
        bus = NatsBus(config)
        await bus.connect()
        try:
            await bus.ensure_streams([StreamSpec(stream, (f"{stream.lower()}.>",), max_age_s=3600)])
            acks = [await bus.publish(f"{stream.lower()}.a", data, msg_id=data.decode()) for data in (b"m1", b"m2")]
            assert [a.seq for a in acks] == [1, 2]
            consumer = await bus.consumer(stream, "reader", f"{stream.lower()}.>", ack_wait_s=30, max_pending=10)
            got = await consumer.fetch(10, 2.0)
            for m in got:
                await m.ack()
            return [m.data for m in got], bus.health()
        finally:
            await bus.close()

    return asyncio.run(scenario())


def test_the_right_ca_connects_over_tls_and_carries_jetstream(tls_server, pki):
    config = BusConfig(servers=[tls_server.tls_url], tls={"ca_file": pki.ca})

    async def check_server_side():  # the server sees this member's connection as TLS
        bus = NatsBus(config)
        await bus.connect()
        try:
            await bus.ensure_streams([StreamSpec("T_TLS_PROBE", ("t.tls.probe.>",), max_age_s=3600)])
            return tls_server.connections()
        finally:
            await bus.close()

    conns = asyncio.run(check_server_side())
    assert len(conns) == 1 and conns[0]["tls_version"].startswith("1.") and conns[0]["tls_cipher_suite"]
    data, health = _round_trip(config, "T_TLS_A")
    assert data == [b"m1", b"m2"]
    assert health["ok"] is True and health["server"] == tls_server.tls_url
    # the name in the certificate (DNS localhost) works as well as its address
    data, _ = _round_trip(BusConfig(servers=[f"tls://localhost:{tls_server.port}"], tls={"ca_file": pki.ca}),
                          "T_TLS_B")
    assert data == [b"m1", b"m2"]


def test_a_member_reconnects_over_tls_after_the_server_restarted(tls_server, pki):
    """A reconnection makes the TLS handshake again on the same transport (nms/bus/nats.py keeps its own)."""
    async def scenario():
        bus = NatsBus(BusConfig(servers=[tls_server.tls_url], tls={"ca_file": pki.ca}))
        await bus.connect()
        try:
            await bus.ensure_streams([StreamSpec("T_TLS_RE", ("t.tls.re.>",), max_age_s=3600)])
            await bus.publish("t.tls.re.a", b"before", msg_id="before")
            await asyncio.to_thread(tls_server.stop)
            await asyncio.to_thread(tls_server.start)
            deadline = asyncio.get_running_loop().time() + 20
            while not bus.health()["ok"]:
                assert asyncio.get_running_loop().time() < deadline, "no reconnection over TLS"
                await asyncio.sleep(0.1)
            ack = await bus.publish("t.tls.re.a", b"after", msg_id="after")
            return ack.seq, tls_server.connections()
        finally:
            await bus.close()

    seq, conns = asyncio.run(scenario())
    assert seq == 2  # the stream kept the first, the second came over the new connection
    assert len(conns) == 1 and conns[0]["tls_version"].startswith("1.")


def test_a_wrong_ca_the_system_cas_or_a_wrong_name_are_refused_with_the_cause(tls_server, pki, other_pki):
    wrong_ca = _connect_error(BusConfig(servers=[tls_server.tls_url], tls={"ca_file": other_pki.ca}))
    assert wrong_ca == (f"no NATS server answered at {tls_server.tls_url}: TLS: certificate verify failed: "
                        "unable to get local issuer certificate")
    # no ca_file: the system's CAs, which do not know the site's private CA
    system = _connect_error(BusConfig(servers=[tls_server.tls_url]))
    assert "TLS: certificate verify failed: unable to get local issuer certificate" in system
    # the right CA, but the server is not who the member expects: the name is always checked
    wrong_name = _connect_error(BusConfig(servers=[tls_server.tls_url],
                                          tls={"ca_file": pki.ca, "server_name": "nats.invalid"}))
    assert "TLS: certificate verify failed: Hostname mismatch, certificate is not valid for 'nats.invalid'" \
        in wrong_name


def test_verify_tls_false_connects_to_any_certificate_and_says_so(tls_server, caplog):
    config = BusConfig(servers=[tls_server.tls_url], tls={"verify_tls": False})
    with caplog.at_level(logging.WARNING, logger="nms.bus.nats"):
        data, _ = _round_trip(config, "T_TLS_NOVERIFY")
    assert data == [b"m1", b"m2"]
    assert any("WITHOUT verifying the servers' certificates" in r.getMessage() for r in caplog.records)


def test_a_plain_member_against_the_tls_port_is_told_to_use_tls(tls_server):
    plain = f"nats://127.0.0.1:{tls_server.port}"
    message = _connect_error(BusConfig(servers=[plain], connect_timeout=2))
    assert message == (f"no NATS server answered at {plain}: TLS: the server requires TLS: give tls:// URLs "
                        "(and cluster.bus.tls.ca_file for a private CA)")


def test_mutual_tls_needs_the_client_certificate(mtls_server, pki, other_pki):
    no_cert = _connect_error(BusConfig(servers=[mtls_server.tls_url], tls={"ca_file": pki.ca}))
    assert "TLS: the server refused this member's client certificate, or its lack of one" in no_cert
    foreign = _connect_error(BusConfig(servers=[mtls_server.tls_url],
                                       tls={"ca_file": pki.ca, "cert_file": other_pki.client_cert,
                                            "key_file": other_pki.client_key}))
    assert "TLS: the server refused this member's client certificate" in foreign
    data, health = _round_trip(BusConfig(servers=[mtls_server.tls_url],
                                         tls={"ca_file": pki.ca, "cert_file": pki.client_cert,
                                              "key_file": pki.client_key}), "T_MTLS")
    assert data == [b"m1", b"m2"] and health["ok"] is True


def test_a_tls_member_sends_nothing_to_a_server_that_offers_no_tls():
    """nats-py upgrades only when the server's INFO asks for TLS: a tls:// member must not go on in
    plaintext (its token in the CONNECT) with a server, or a man in the middle, that does not."""
    received = bytearray()
    token = "s3cret-bus-token-0123456789"

    async def scenario() -> str:
        async def plaintext_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b'INFO {"server_id":"x","version":"2.9.10","proto":1,"max_payload":1048576,'
                         b'"auth_required":true}\r\n')
            await writer.drain()
            try:
                while chunk := await asyncio.wait_for(reader.read(4096), 2):
                    received.extend(chunk)
            except (TimeoutError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(plaintext_server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        bus = NatsBus(BusConfig(servers=[f"tls://127.0.0.1:{port}"], token=token, connect_timeout=1))
        try:
            await bus.connect()
        except BusUnavailable as e:
            return str(e)
        finally:
            server.close()
        raise AssertionError("connected in plaintext")

    message = asyncio.run(scenario())
    assert message.endswith("TLS: the server does not offer TLS (tls:// wanted; refused before sending anything)")
    assert bytes(received) == b""  # no CONNECT, no token


# --- configuration ----------------------------------------------------------------------------

def _config(tmp_path: Path, tls_yaml: str, servers: str = "[tls://nats1:4222]") -> object:
    text = ("store: {backend: influxdb}\n"
            "cluster:\n"
            "  bus:\n"
            f"    servers: {servers}\n"
            "    tls:\n" + "".join(f"      {line}\n" for line in tls_yaml.splitlines()))
    return parse_config(text, "member.yaml", base_dir=tmp_path)


def _issues(tmp_path: Path, tls_yaml: str, servers: str = "[tls://nats1:4222]") -> list[str]:
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, tls_yaml, servers)
    return [str(i) for i in e.value.issues]


def test_tls_files_are_relative_to_the_config_file_and_each_problem_names_its_field(tmp_path, pki, other_pki):
    conf_dir = tmp_path / "conf"
    (conf_dir / "tls").mkdir(parents=True)
    for src, name in ((pki.ca, "ca.pem"), (pki.client_cert, "member.pem"), (pki.client_key, "member.key")):
        (conf_dir / "tls" / name).write_bytes(src.read_bytes())
    good = _config(conf_dir, "ca_file: tls/ca.pem\ncert_file: tls/member.pem\nkey_file: tls/member.key")
    tls = good.cluster.bus.tls  # type: ignore[attr-defined]
    assert tls.ca_file == conf_dir / "tls" / "ca.pem" and tls.key_file == conf_dir / "tls" / "member.key"
    assert tls.ssl_context().verify_mode.name == "CERT_REQUIRED" and tls.ssl_context().check_hostname

    assert _issues(conf_dir, "ca_file: tls/missing.pem") == [
        f"line 6: cluster.bus.tls.ca_file: Value error, cannot read '{conf_dir}/tls/missing.pem': "
        "No such file or directory"]
    assert _issues(conf_dir, "ca_file: tls/ca.pem\ncert_file: tls/member.pem") == [
        "line 5: cluster.bus.tls: Value error, key_file: a client certificate needs both cert_file and key_file, "
        "or neither"]
    mismatched = _issues(conf_dir, f"cert_file: tls/member.pem\nkey_file: {other_pki.client_key}")
    assert len(mismatched) == 1 and "cert_file/key_file:" in mismatched[0] and "KEY_VALUES_MISMATCH" in mismatched[0]
    not_a_ca = _issues(conf_dir, "ca_file: tls/member.key")
    assert len(not_a_ca) == 1 and "ca_file: " in not_a_ca[0] and "holds no usable CA certificate" in not_a_ca[0]
    assert "BEGIN" not in " ".join(mismatched + not_a_ca)  # never a file's content
    assert _issues(conf_dir, "ca_file: tls/ca.pem", servers="[nats://nats1:4222]") == [
        "line 3: cluster.bus: Value error, servers: with tls, the servers' URLs are tls://"]
    assert _issues(conf_dir, "verify_tls: false\nca_file: tls/ca.pem") == [
        "line 5: cluster.bus.tls: Value error, verify_tls: false checks no certificate: ca_file and server_name "
        "are for verify_tls: true"]
    mixed = _issues(conf_dir, "ca_file: tls/ca.pem", servers="[tls://nats1:4222, nats://nats2:4222]")
    assert mixed == ["line 3: cluster.bus: Value error, servers: give every URL tls:// (TLS) or every one nats://, "
                     "not both"]


def test_an_encrypted_key_is_a_config_error_not_a_prompt(tmp_path, pki):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), password=None)
    encrypted = tmp_path / "member-encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"passphrase")))
    issues = _issues(tmp_path, f"cert_file: {pki.client_cert}\nkey_file: {encrypted}")
    assert issues == [f"line 5: cluster.bus.tls: Value error, key_file: '{encrypted}' is encrypted: give an "
                      "unencrypted key (readable by the service only)"]
