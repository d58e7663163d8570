"""Settings of the CLI (SSH command line) collector: `collectors.cli` of a switch (fabric.switches[]), validated
through this model (its collector's `settings_model`, found by the `nms.collectors` entry point)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from nms.config.models import Seconds, Strict

# netmiko device types with a command set (collectors/cli/collector.py); cisco_ios through napalm's getters
CLI_PLATFORMS = ("linux", "arista_eos", "cisco_nxos", "cisco_ios")
NAPALM_PLATFORMS = ("cisco_ios",)  # the `cli` extra: collectors/cli/napalm_getters.py


class CliSettings(Strict):
    """SSH command line (collectors/cli/collector.py, docs/cli_collector.md): logs in with netmiko and reads
    interfaces, counters, LLDP neighbours and facts every `interval`, the running configuration at
    most every `config_interval`. The device's host key must be in `known_hosts` unless
    `verify_host_key: false`."""

    platform: str = "linux"  # netmiko device_type; picks the commands and parsers (CLI_PLATFORMS)
    port: int = Field(22, ge=1, le=65535)
    username: str = Field(min_length=1)
    password: SecretStr | None = None
    key_file: Path | None = None  # private key (OpenSSH or PEM: Ed25519, ECDSA, RSA)
    key_passphrase: SecretStr | None = None  # when key_file is encrypted
    known_hosts: Path | None = None  # OpenSSH known_hosts holding the device's host key (hashed entries too)
    verify_host_key: bool = True  # false: any host key is accepted (labs only)
    interval: Seconds = 60.0
    timeout: Seconds = 10.0  # TCP connect, SSH banner, authentication, and silence within one command
    deadline: Seconds | None = None  # a poll still running then is cancelled (default: 0.8 x interval)
    config: bool = True  # snapshot the running configuration (device_config points, diffs on change)
    config_interval: Seconds = 3600.0  # ... at most this often
    lldp: bool = True  # LLDP neighbours (lldpctl)
    interfaces: list[str] = []  # fnmatch patterns of interface names to keep (all when empty)

    @field_validator("platform")
    @classmethod
    def _platform(cls, v: str) -> str:
        if v not in CLI_PLATFORMS:
            raise ValueError(f"no command set for platform {v!r} yet (supported: {', '.join(CLI_PLATFORMS)}; "
                             "see docs/cli_collector.md)")
        if v in NAPALM_PLATFORMS and importlib.util.find_spec("napalm") is None:
            raise ValueError(f"platform {v!r} reads through napalm, which is not installed "
                             "(pip install 'fabric-nms[cli]')")
        return v

    @model_validator(mode="after")
    def _credentials(self) -> CliSettings:
        if self.password is None and self.key_file is None:
            raise ValueError("give a password or a key_file (or both)")
        if self.key_passphrase is not None and self.key_file is None:
            raise ValueError("key_passphrase needs key_file")
        if self.verify_host_key and self.known_hosts is None:
            raise ValueError("known_hosts is required: host keys are checked against it "
                             "(verify_host_key: false turns the check off, for labs only)")
        return self
