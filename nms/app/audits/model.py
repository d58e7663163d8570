"""What the audits read and what they say: the snapshot, findings, per-audit results, reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from nms.config.models import FabricConfig
from nms.records import ClockSolution, DeviceFacts, FabricTopology, PortRates, PortSample, Severity

End = tuple[str, str]  # (device, port)
SEVERITY_RANK = {"warning": 0, "minor": 1, "major": 2, "critical": 3}


@dataclass(frozen=True)
class ProbedPath:
    """One probe path with a recent window: who probed whom over which path id."""

    src_host: str
    dst_host: str
    path_id: str


@dataclass
class Snapshot:
    """Everything the checks read, taken once per run. `None` means the source is not there at all
    (a disabled service part), an empty collection that it has nothing yet."""

    now_ns: int
    fabric: FabricConfig
    topology: FabricTopology | None = None
    polled: set[str] = field(default_factory=set)  # switches whose last poll succeeded
    samples: dict[End, PortSample] = field(default_factory=dict)
    rates: dict[End, PortRates] = field(default_factory=dict)
    facts: dict[str, DeviceFacts] = field(default_factory=dict)
    clock: list[ClockSolution] | None = None  # newest solution per host; None: clock sync disabled
    probed: list[ProbedPath] | None = None  # None: not read (no store)
    configs: dict[str, str] = field(default_factory=dict)  # device -> newest configuration snapshot text
    # (host, nic) -> {"mtu": .., "speed_bps": ..}: the agents' newest NIC samples (host ends of cables)
    host_nics: dict[End, dict[str, int]] = field(default_factory=dict)
    # link -> probe loss evidence (the correlator's corrupting links); None: no correlator
    lossy_links: dict[str, dict[str, Any]] | None = None


class AuditFinding(BaseModel):
    audit: str
    severity: Severity
    element: str = Field(description="a link `dev:port--dev:port`, a port `dev:port`, a device, a host or a "
                                     "host pair `a<>b`")
    element_kind: Literal["link", "port", "device", "host", "host_pair", "role"]
    message: str
    remediation: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    escalates: bool = Field(True, description="false where the correlator tracks the same fault live (probe loss, "
                                              "a link down): it opens and resolves that incident itself")

    @property
    def key(self) -> str:
        """The same problem on the same element in two runs has the same key."""
        return f"{self.audit}:{self.element_kind}:{self.element}"


AuditStatus = Literal["clean", "findings", "no_data", "error"]


class AuditResult(BaseModel):
    audit: str
    status: AuditStatus
    reason: str | None = Field(None, description="no_data/error: why nothing could be judged")
    checked: int = Field(0, description="elements examined")
    notes: list[str] = Field(default_factory=list, description="parts left out for lack of data")
    findings: list[AuditFinding] = Field(default_factory=list)
    duration_s: float = 0.0


class AuditReport(BaseModel):
    id: int = 0
    trigger: Literal["schedule", "manual"]
    started_ns: int
    finished_ns: int
    results: list[AuditResult]

    @property
    def findings(self) -> list[AuditFinding]:
        return [f for r in self.results for f in r.findings]


def result(audit: str, findings: list[AuditFinding], checked: int, notes: list[str] | None = None,
           no_data: str | None = None) -> AuditResult:
    """A check's outcome: no elements to judge is `no_data` with its reason, never a finding."""
    if not findings and (no_data is not None or checked == 0):
        return AuditResult(audit=audit, status="no_data", reason=no_data or "nothing to check",
                           checked=checked, notes=notes or [])
    return AuditResult(audit=audit, status="findings" if findings else "clean", checked=checked,
                       notes=notes or [], findings=findings)


def link_name(a: End, b: End) -> str:
    """The topology's spelling of a link: both ends sorted, `dev:port--dev:port`."""
    x, y = sorted((a, b))  # as nms.topology sorts a cable's ends
    return f"{x[0]}:{x[1]}--{y[0]}:{y[1]}"
