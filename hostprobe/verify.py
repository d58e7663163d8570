"""The agent's check of every command before it acts: the service's Ed25519 signature over host,
command id, kind, args, expiry and nonce (nms/signing.py), for this host, not expired,
not seen before.

Key: `signing.public_key` from the config, else the one pinned in `<buffer_dir>/service_key.pub`,
else (trust on first use) the key the service announces at registration, which is then pinned.
A pinned key never changes by itself: a service with a new key is refused until an operator
removes the pin file or configures the new key. Unsigned commands are refused once a key is
pinned (`require: pinned`), always (`always`), or never (`never`: signatures are not checked).
Command ids accepted are kept with their expiry in `<buffer_dir>/commands_seen.json`, so a replay
is refused also after an agent restart; entries past expiry are dropped (expired ones are refused
anyway).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from hostprobe.config import SigningSettings
from nms.signing import canonical_bytes, key_id, public_from_b64

log = logging.getLogger(__name__)
PIN_FILE = "service_key.pub"
SEEN_FILE = "commands_seen.json"


class CommandVerifier:
    def __init__(self, host: str, settings: SigningSettings, state_dir: Path, clock=time.time_ns):
        self.host = host
        self.settings = settings
        self.clock = clock
        self.pin_path = Path(state_dir) / PIN_FILE
        self.seen_path = Path(state_dir) / SEEN_FILE
        self._lock = threading.Lock()
        self._key_text: str | None = settings.public_key
        if self._key_text is None:
            try:
                self._key_text = self.pin_path.read_text().strip() or None
            except OSError:
                pass
        self._key = public_from_b64(self._key_text) if self._key_text else None
        self._seen: dict[str, int] = {}
        try:
            self._seen = {str(k): int(v) for k, v in json.loads(self.seen_path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            pass

    @property
    def pinned(self) -> bool:
        return self._key is not None

    def offer_key(self, text: str | None) -> None:
        """The key the service announced at registration: pinned when none is (trust on first use)."""
        if not text:
            return
        with self._lock:
            if self._key is not None:
                if text != self._key_text:
                    log.warning("the service announces command key %s, but %s is pinned: its commands will be "
                                "refused (configure signing.public_key or remove %s to pin the new one)",
                                _kid(text), _kid(self._key_text), self.pin_path)
                return
            if not self.settings.trust_on_first_use or self.settings.require == "never":
                return
            try:
                key = public_from_b64(text)
            except ValueError as e:
                log.warning("the service announced a bad command key: %s", e)
                return
            tmp = self.pin_path.with_suffix(".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, self.pin_path)
            self._key, self._key_text = key, text
            log.info("pinned the service's command key %s (trust on first use) in %s", _kid(text), self.pin_path)

    def check(self, command: dict) -> str | None:
        """None when the command may run; else why it is refused."""
        if self.settings.require == "never":
            return None
        env = command.get("envelope")
        with self._lock:
            if env is None:
                if self._key is None and self.settings.require == "pinned":
                    return None  # bootstrap: nothing pinned yet
                return "unsigned command refused (a service key is pinned)" if self._key is not None else \
                    "unsigned command refused (signing.require: always)"
            if self._key is None:
                return "signed command refused: no service key pinned"
            try:
                sig = base64.b64decode(env["sig"], validate=True)
                expires, nonce = int(env["expires_ns"]), str(env["nonce"])
                data = canonical_bytes(self.host, int(command["id"]), str(command["kind"]), command.get("args") or {},
                                       expires, nonce)
                self._key.verify(sig, data)
            except InvalidSignature:
                return "bad signature (not signed by the pinned service key, for this host, with these args)"
            except (KeyError, TypeError, ValueError) as e:
                return f"malformed envelope: {type(e).__name__}"
            now = self.clock()
            if now > expires + int(self.settings.max_skew * 1e9):
                return f"expired {(now - expires) / 1e9:.0f} s ago"
            cid = str(command["id"])
            if cid in self._seen:
                return f"replayed: command {cid} was accepted before"
            self._seen = {k: v for k, v in self._seen.items() if v + int(self.settings.max_skew * 1e9) >= now}
            self._seen[cid] = expires
            self._save()
        return None

    def _save(self) -> None:
        tmp = self.seen_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self._seen))
            os.replace(tmp, self.seen_path)
        except OSError as e:  # replay protection then lasts until the agent restarts
            log.warning("could not persist the commands seen: %s", e)


def _kid(text: str | None) -> str:
    try:
        return key_id(base64.b64decode(text or ""))
    except ValueError:
        return "?"
