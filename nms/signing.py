"""Signed agent commands: an Ed25519 envelope binding host, command id, kind, args, expiry and a
nonce, so that an agent acts only on what this service issued, for that host, once, in time.

The service key lives in the data directory (`command_signing.key`, PEM PKCS#8, mode 0600),
generated on first start. Agents pin the public key (their config, or trust on first use at
registration; docs/actions.md). The signed bytes are `canonical_bytes(...)`: JSON with sorted keys
and no spaces, so both sides build them alike (hostprobe/verify.py imports it from here).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ENVELOPE_VERSION = 1
KEY_FILE = "command_signing.key"


def canonical_bytes(host: str, command_id: int, kind: str, args: dict[str, Any], expires_ns: int,
                    nonce: str) -> bytes:
    body = {"v": ENVELOPE_VERSION, "host": host, "id": command_id, "kind": kind, "args": args,
            "expires_ns": expires_ns, "nonce": nonce}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def public_from_b64(text: str) -> Ed25519PublicKey:
    """A raw 32-byte Ed25519 public key in base64; ValueError when it is not one."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError("not base64") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def _load_or_create(path: Path) -> Ed25519PrivateKey:
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.replace(tmp, path)
    return key


class CommandSigner:
    """The service side: signs command envelopes with the data directory's key."""

    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / KEY_FILE
        self._key = _load_or_create(self.path)
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()  # what agents pin
        self.key_id = key_id(raw)

    def __repr__(self) -> str:  # never the private key
        return f"CommandSigner(key_id={self.key_id})"

    def envelope(self, host: str, command_id: int, kind: str, args: dict[str, Any], expires_ns: int
                 ) -> dict[str, Any]:
        nonce = secrets.token_hex(12)
        sig = self._key.sign(canonical_bytes(host, command_id, kind, args, expires_ns, nonce))
        return {"v": ENVELOPE_VERSION, "key_id": self.key_id, "expires_ns": expires_ns, "nonce": nonce,
                "sig": base64.b64encode(sig).decode()}
