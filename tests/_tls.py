"""Throwaway certificate authorities for TLS tests (cryptography; the lab's CA code, lab/tls.py): a CA,
a server certificate for 127.0.0.1 and localhost, a client certificate (for servers that verify
clients), written as PEM files in a directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.tls import _key, _validity, _write_cert, _write_key, issue, make_ca


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA's certificate (a client's ca_file, a server's ca_file for client certificates)
    server_cert: Path  # SAN 127.0.0.1 and localhost
    server_key: Path
    client_cert: Path  # CN nms-member, extendedKeyUsage clientAuth
    client_key: Path


def make_pki(root: Path, name: str = "test") -> Pki:
    root.mkdir(parents=True, exist_ok=True)
    ca, ca_key = root / f"{name}-ca.pem", root / f"{name}-ca.key"
    make_ca(ca, ca_key, name=f"nms {name} CA")
    server_cert, server_key = root / f"{name}-server.pem", root / f"{name}-server.key"
    issue(ca, ca_key, server_cert, server_key, "localhost", ["127.0.0.1"])
    client_cert, client_key = root / f"{name}-client.pem", root / f"{name}-client.key"
    issue_client(ca, ca_key, client_cert, client_key, "nms-member")
    return Pki(ca, server_cert, server_key, client_cert, client_key)


def issue_client(ca_cert_path: Path, ca_key_path: Path, cert_path: Path, key_path: Path, name: str) -> None:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    key = _key()
    cert = (_validity(x509.CertificateBuilder())
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
