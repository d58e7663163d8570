"""Settings of the gNMI collector: `collectors.gnmi` of a switch (fabric.switches[]), validated
through this model (its collector's `settings_model`, found by the `nms.collectors` entry point)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from nms.config.models import Seconds, Strict


class GnmiSettings(Strict):
    """gNMI (collectors/gnmi/collector.py, docs/gnmi.md): a Subscribe STREAM per device, openconfig-interfaces
    counters SAMPLEd every `interval`, oper-status ON_CHANGE (`mode: stream`); or a poll every
    `interval` on a kept Subscribe POLL (`poll`) or by Subscribe ONCE (`once`), for targets that do
    not stream. TLS unless `insecure`."""

    port: int = Field(9339, ge=1, le=65535)  # IANA gnmi; many vendors use 57400 or 6030
    username: str | None = None  # sent as gRPC metadata username/password
    password: SecretStr | None = None
    insecure: bool = False  # plaintext gRPC: only where explicitly configured (labs)
    ca_file: Path | None = None  # CA bundle for the target's certificate (default: the system's)
    cert_file: Path | None = None  # client certificate and key (mutual TLS)
    key_file: Path | None = None
    server_name: str | None = None  # the name in the target's certificate, where not its address
    interval: Seconds = 10.0  # SAMPLE interval of the counters (and the schedule of `--once` polls)
    timeout: Seconds = 5.0  # to connect, and for one Get / ONCE answer
    deadline: Seconds | None = None  # a ONCE poll still running then is cancelled (default: 0.8 x interval)
    stale_after: Seconds | None = (
        None  # a stream silent this long is dropped and reopened (default: 2 x interval + 2 s)
    )
    interfaces: list[str] = []  # fnmatch patterns of interface names to keep (all when empty)
    mode: Literal["stream", "poll", "once"] = "stream"
    inventory: bool = True  # Get /system/state (openconfig-system) for hostname, version, uptime
    queues: bool = True  # openconfig-qos output queue counters (drops, ECN marks) where the target has the model

    @model_validator(mode="after")
    def _tls(self) -> GnmiSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both cert_file and key_file (mutual TLS), or neither")
        if self.insecure and (self.ca_file or self.cert_file):
            raise ValueError("insecure (plaintext) and TLS files exclude each other")
        if (self.username is None) != (self.password is None):
            raise ValueError("give both username and password, or neither")
        return self
