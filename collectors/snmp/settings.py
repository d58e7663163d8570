"""Settings of the SNMP collector: `collectors.snmp` of a switch (fabric.switches[]), validated
through this model (its collector's `settings_model`, found by the `nms.collectors` entry point)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from nms.config.models import Seconds, Strict


class SnmpSettings(Strict):
    version: Literal["2c", "3"] = "2c"
    port: int = Field(161, ge=1, le=65535)
    community: SecretStr | None = None
    user: str | None = None
    auth_protocol: Literal["sha", "sha256", "sha512", "md5"] = "sha"
    auth_key: SecretStr | None = None
    priv_protocol: Literal["aes", "aes256", "des"] = "aes"
    priv_key: SecretStr | None = None
    interval: Seconds = 10.0
    timeout: Seconds = 2.0
    retries: int = Field(1, ge=0, le=10)
    deadline: Seconds | None = None  # a poll still running then is cancelled (default: 0.8 x interval)
    max_repetitions: int = Field(20, ge=1, le=1000)  # GETBULK rows per column and request
    lldp: bool = True  # also walk LLDP-MIB (neighbours, for the topology)
    interfaces: list[str] = []  # fnmatch patterns of ifName to keep (all when empty)
    # numeric OIDs (1.3.6.1.4.1.x.y...), or MIB::name resolved from MIB modules in mibs/ (needs pysmi);
    # an OID ending in .0 is read with GET, anything else is walked
    extra_oids: list[str] = []

    @field_validator("extra_oids")
    @classmethod
    def _oids(cls, v: list[str]) -> list[str]:
        for oid in v:
            if not re.fullmatch(r"\.?\d+(\.\d+)+|[A-Za-z][\w-]*::[A-Za-z][\w-]*(\.\d+)*", oid):
                raise ValueError(f"extra OID {oid!r}: give a numeric OID (1.3.6.1...) or MIB-NAME::object[.index]")
        return v

    @model_validator(mode="after")
    def _credentials(self) -> SnmpSettings:
        if self.version == "2c" and self.community is None:
            raise ValueError("SNMP v2c needs a community")
        if self.version == "3":
            if not self.user:
                raise ValueError("SNMPv3 needs a user")
            if self.priv_key is not None and self.auth_key is None:
                raise ValueError("SNMPv3 privacy (priv_key) needs authentication (auth_key)")
            for key in (self.auth_key, self.priv_key):
                if key is not None and len(key.get_secret_value()) < 8:
                    raise ValueError("SNMPv3 keys must be at least 8 characters")
        return self
