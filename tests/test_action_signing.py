"""Signed agent commands: the service's envelope (nms/signing.py) and the agent's
check before dispatch (hostprobe/verify.py)."""

from __future__ import annotations

import stat

import pytest

from hostprobe.config import SigningSettings
from hostprobe.verify import CommandVerifier
from nms.signing import CommandSigner

NOW = 1_700_000_000 * 10**9
STEER = {"action_id": 3, "element": "leaf1:up1--spine1:leaf1", "avoid_hops": ["10.1.1.0", "10.1.1.1"],
         "dsts": ["h3"], "proto": "udp", "dport": 4791, "expires_ns": NOW + 3600 * 10**9}


def _command(signer: CommandSigner, host: str = "h1", cid: int = 11, args: dict | None = None,
             expires_ns: int = NOW + 60 * 10**9) -> dict:
    args = dict(STEER if args is None else args)
    return {"id": cid, "host": host, "kind": "steer", "args": args,
            "envelope": signer.envelope(host, cid, "steer", args, expires_ns)}


@pytest.fixture
def signer(tmp_path):
    return CommandSigner(tmp_path / "service")


def _verifier(tmp_path, signer=None, **settings) -> CommandVerifier:
    cfg = SigningSettings(**({"public_key": signer.public_key} if signer else {}) | settings)
    return CommandVerifier("h1", cfg, tmp_path / "agent", clock=lambda: NOW)


def test_the_key_is_private_and_stable(tmp_path, signer):
    mode = stat.S_IMODE(signer.path.stat().st_mode)
    assert mode == 0o600
    assert CommandSigner(tmp_path / "service").public_key == signer.public_key
    assert "PRIVATE" not in repr(signer) and signer.key_id in repr(signer)


def test_a_good_command_passes_once(tmp_path, signer):
    (tmp_path / "agent").mkdir()
    v = _verifier(tmp_path, signer)
    cmd = _command(signer)
    assert v.check(cmd) is None
    assert "replayed" in v.check(cmd)
    # also with a fresh envelope (new nonce) for the same command id, and after an agent restart
    assert "replayed" in v.check(_command(signer))
    assert "replayed" in _verifier(tmp_path, signer).check(cmd)


def test_tampered_other_host_expired_and_foreign_key_are_refused(tmp_path, signer):
    (tmp_path / "agent").mkdir()
    v = _verifier(tmp_path, signer)
    tampered = _command(signer)
    tampered["args"]["avoid_hops"] = ["10.9.9.9"]
    assert "bad signature" in v.check(tampered)
    kind = _command(signer, cid=12)
    kind["kind"] = "unsteer"
    assert "bad signature" in v.check(kind)
    assert "bad signature" in v.check(_command(signer, host="h2", cid=13))  # signed for h2, h1 checks it
    assert "expired" in v.check(_command(signer, cid=14, expires_ns=NOW - 60 * 10**9))
    other = CommandSigner(tmp_path / "other")
    assert "bad signature" in v.check(_command(other, cid=15))
    broken = _command(signer, cid=16)
    broken["envelope"]["sig"] = "!!"
    assert "malformed envelope" in v.check(broken)
    # none of the refused ones counted as seen: the genuine command 12 still runs
    assert v.check(_command(signer, cid=12)) is None


def test_unsigned_commands_bootstrap_then_refused_once_pinned(tmp_path, signer):
    (tmp_path / "agent").mkdir()
    v = _verifier(tmp_path)
    unsigned = {"id": 1, "kind": "reprobe_paths", "args": {}}
    assert not v.pinned and v.check(unsigned) is None  # nothing pinned yet: the bootstrap
    v.offer_key(signer.public_key)  # registration announces the key: trust on first use
    assert v.pinned and (tmp_path / "agent" / "service_key.pub").read_text().strip() == signer.public_key
    assert "unsigned command refused" in v.check({"id": 2, "kind": "reprobe_paths", "args": {}})
    # a restarted agent keeps the pin; a service with another key does not replace it
    again = _verifier(tmp_path)
    again.offer_key(CommandSigner(tmp_path / "other").public_key)
    assert again.check(_command(signer, cid=3)) is None
    assert "bad signature" in again.check(_command(CommandSigner(tmp_path / "other"), cid=4))


def test_require_always_and_never(tmp_path, signer):
    (tmp_path / "agent").mkdir()
    always = _verifier(tmp_path, require="always", trust_on_first_use=False)
    assert "signing.require: always" in always.check({"id": 1, "kind": "reprobe_paths", "args": {}})
    assert "no service key pinned" in always.check(_command(signer))
    never = _verifier(tmp_path, require="never")
    assert never.check({"id": 1, "kind": "reprobe_paths", "args": {}}) is None


def test_a_bad_configured_key_names_the_field():
    with pytest.raises(ValueError, match="public_key"):
        SigningSettings(public_key="bm90IGEga2V5")
