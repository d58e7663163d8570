"""Replayed collector cases (tests/collector_cases/<collector>/<case>/, README there): loading a case,
polling it through the collector with its replay transport, and comparing the result with
`expected.yaml`.

A case is `settings.yaml` (the device's `collectors.<name>`, validated through the collector's own
settings model by SwitchConfig), `responses.*` (what the peer answered, in the transport's terms) and
`expected.yaml`:

    records:                 # every record type the poll yields, in the poll's order within a type
      DeviceFacts:
        - {sys_name: leaf1, interfaces: 4}      # only the fields given are compared
      PortSample:
        - {port: Ethernet1, oper_status: up, in_octets: 1234}
    problems:                # PollResult.problems, in order (`reason` compared when given)
      - {what: "show ip interface | json", reason: "..."}

`ts` (when the replay ran) is never compared.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from collectors.base import PollResult
from nms.config.models import SwitchConfig

CASES_DIR = Path(__file__).parent / "collector_cases"
DEVICE, ADDRESS = "dut", "192.0.2.1"  # TEST-NET-1: nothing is ever sent there
VOLATILE = {"ts"}


@dataclass(frozen=True)
class Case:
    dir: Path

    @property
    def collector(self) -> str:
        return self.dir.parent.name

    @property
    def id(self) -> str:
        return f"{self.collector}/{self.dir.name}"

    def device(self) -> SwitchConfig:
        settings = yaml.safe_load((self.dir / "settings.yaml").read_text()) or {}
        return SwitchConfig(name=DEVICE, mgmt_address=ADDRESS, collectors={self.collector: settings})

    def responses(self) -> Path:
        found = sorted(self.dir.glob("responses.*"))
        assert len(found) == 1, f"{self.dir}: expected one responses.* file, found {[p.name for p in found]}"
        return found[0]

    def expected(self) -> dict:
        return yaml.safe_load((self.dir / "expected.yaml").read_text()) or {}


def all_cases() -> list[Case]:
    return [Case(p.parent) for p in sorted(CASES_DIR.glob("*/*/settings.yaml"))]


def replay(case: Case) -> PollResult:
    """One poll of the case's device through the real collector, its transport answering from the case."""
    module = importlib.import_module(f"_replay_{case.collector}")  # tests/_replay_<collector>.py
    return asyncio.run(getattr(module, f"replay_{case.collector}")(case.device(), case.responses()))


def record_fields(record: Any) -> dict[str, Any]:
    """A record's fields as YAML-able values, `ts` and unset fields left out."""
    return {k: v for k, v in record.model_dump(mode="json").items() if k not in VOLATILE and v is not None}


def observed(result: PollResult, expected: dict) -> dict:
    """The result in expected.yaml's shape, each record cut to the fields `expected` names for it."""
    want = expected.get("records") or {}
    records: dict[str, list[dict]] = {}
    for r in result.records:
        kind = type(r).__name__
        records.setdefault(kind, []).append(record_fields(r))
    for kind, got in records.items():
        wants = want.get(kind) or []
        for i, fields in enumerate(got):
            keys = wants[i].keys() if i < len(wants) else fields.keys()
            got[i] = {k: fields.get(k) for k in keys}
    problems = []
    for i, p in enumerate(result.problems):
        wanted = (expected.get("problems") or [])[i] if i < len(expected.get("problems") or []) else None
        keys = wanted.keys() if wanted else ("what", "reason", "kind")
        problems.append({k: getattr(p, k) for k in keys})
    return {"records": records, "problems": problems}


def difference(expected: dict, got: dict) -> str:
    """'' when equal; else a unified diff of the two as YAML (expected first)."""
    want = {"records": expected.get("records") or {}, "problems": expected.get("problems") or []}
    if want == got:
        return ""
    a = yaml.safe_dump(want, sort_keys=False, width=120).splitlines()
    b = yaml.safe_dump(got, sort_keys=False, width=120).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "expected.yaml", "this poll", lineterm="", n=2))


def draft_expected(result: PollResult) -> dict:
    """Every field of every record and problem: the start of an expected.yaml, to be checked by a person
    against the device (and cut to the fields that matter) before it is committed."""
    records: dict[str, list[dict]] = {}
    for r in result.records:
        records.setdefault(type(r).__name__, []).append(record_fields(r))
    return {"records": records,
            "problems": [{"what": p.what, "reason": p.reason, "kind": p.kind} for p in result.problems]}
