"""Settings of the UFM collector: `collectors.ufm` of a switch (fabric.switches[]), validated
through this model (its collector's `settings_model`, found by the `nms.collectors` entry point)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from nms.config.models import HttpUrl, Seconds, Strict


class UfmSettings(Strict):
    """NVIDIA UFM Enterprise REST API (collectors/ufm/collector.py, docs/ufm.md). The device is the UFM server;
    its polls report the switches UFM manages. One credential: `token` (/ufmRestV3), username and
    password (/ufmRest), or a client certificate `cert_file` + `key_file` (/ufmRest, UFM's client
    authentication)."""

    url: HttpUrl | None = None  # default https://<mgmt_address>; give it for a host name or another port
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None  # an access token (UFM Settings > Access Tokens)
    cert_file: Path | None = None  # client certificate (PEM) whose SAN UFM associates with a user
    key_file: Path | None = None  # its private key (PEM, unencrypted)
    verify_tls: bool = True
    ca_file: Path | None = None  # CA bundle for UFM's certificate (default: the system's)
    # UFM Telemetry's Prometheus endpoint (e.g. http://ufm:9001/enterprise): when set, the port
    # counters come from it instead of the Monitoring snapshot
    telemetry_url: HttpUrl | None = None
    telemetry_data_unit: Literal["octets", "words"] = "octets"  # Port*DataExtended in octets or 4-octet words
    interval: Seconds = 30.0
    timeout: Seconds = 10.0  # per request
    retries: int = Field(2, ge=0, le=10)  # after a timeout, a refused connection, HTTP 429 or 5xx
    backoff: Seconds = 0.5  # before the first retry; doubles per retry
    deadline: Seconds | None = None  # a poll still running then is cancelled (default: 0.8 x interval)
    page_size: int = Field(1000, ge=0, le=1_000_000)  # links asked page by page (rpp); 0: in one answer
    systems: list[str] = []  # fnmatch patterns of switch names to report (all when empty)
    counters: bool = True  # port counters (Monitoring REST API snapshot)
    links: bool = True  # links as LldpNeighbor records (for the topology)
    alarms: bool = True
    events: bool = True  # events: link down / flap evidence for the correlator, and stored
    timezone: str = "UTC"  # the UFM server's clock, for event and alarm timestamps (they carry no zone)

    @field_validator("url", "telemetry_url")
    @classmethod
    def _no_userinfo(cls, v: str | None) -> str | None:
        if v is not None and "@" in v.split("//", 1)[1].split("/", 1)[0]:
            raise ValueError("give the credentials as username/password, token or certificate, not in the URL")
        return v

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (an IANA name such as UTC or Europe/Berlin)") from None
        return v

    @model_validator(mode="after")
    def _credentials(self) -> UfmSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        given = [k for k, v in (("token", self.token), ("username/password", self.username or self.password),
                                ("cert_file/key_file", self.cert_file)) if v]
        if len(given) > 1:
            raise ValueError(f"give one credential, not {' and '.join(given)}")
        if not given or (given == ["username/password"] and not (self.username and self.password)):
            raise ValueError("UFM needs a token, a username and a password, or cert_file and key_file")
        return self
