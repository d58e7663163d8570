"""Record a replayed collector case from a real device (tests/collector_cases/README.md).

    .venv/bin/python tests/collector_cases/record.py COLLECTOR CASE_DIR --address ADDRESS [--set KEY=VALUE]...

CASE_DIR/settings.yaml (the device's `collectors.<COLLECTOR>` settings) is written first, by hand.
The tool polls the device once through the real collector with a recording transport
(tests/_replay_<collector>.py) and writes CASE_DIR/responses.* (what the device answered) and
CASE_DIR/expected.draft.yaml (every field of what this poll yielded). Check the draft against the
device, keep the fields that matter, drop those that change by themselves (`uptime_ticks` computed
from the clock), and save it as expected.yaml. SNMP is recorded with snmpwalk (net-snmp), not
through the collector: the replay answers GET and GETBULK from the walk.

`--set port=50051` (a YAML value) overrides a setting for the recording only (a lab peer on a free port). Secrets in
settings.yaml are sent to the device; commit a case with them replaced (the replay does not check them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the replay modules

from _cases import DEVICE, Case, draft_expected  # noqa: E402

from collectors.base import PollResult  # noqa: E402
from nms.config.models import SwitchConfig  # noqa: E402

# what the SNMP collector reads: system, interfaces, ifXTable, IP-MIB's address tables, LLDP-MIB
SNMP_TREES = (".1.3.6.1.2.1.1", ".1.3.6.1.2.1.2", ".1.3.6.1.2.1.31.1.1", ".1.3.6.1.2.1.4.20", ".1.3.6.1.2.1.4.32",
              ".1.3.6.1.2.1.4.34", ".1.0.8802.1.1.2")


class _Literal(str):
    pass


yaml.SafeDumper.add_representer(_Literal, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|"))


def _yaml_text(value):
    return _Literal(value) if isinstance(value, str) and "\n" in value and value.strip() == value.rstrip() and \
        all(line == line.rstrip() for line in value.splitlines()) else value


async def record_cli(device: SwitchConfig, case: Path) -> PollResult:
    from _replay_cli import RecordingSession

    from collectors.cli.collector import CliCollector

    collector = CliCollector(max_concurrency=1)
    session = RecordingSession(device.name, device.mgmt_address, collector.required_settings(device))
    collector._sessions.make = lambda device, settings: session
    try:
        return await collector.collect(device)
    finally:
        text = {k: _yaml_text(v) for k, v in session.recording.items()}
        (case / "responses.yaml").write_text(yaml.safe_dump(text, sort_keys=False, width=4096))
        await collector.close()


async def record_gnmi(device: SwitchConfig, case: Path) -> PollResult:
    from _replay_gnmi import RecordingStub

    from collectors.gnmi.collector import GnmiCollector

    collector = GnmiCollector()
    session = await collector._session(device)
    session.stub = stub = RecordingStub(session.stub)
    try:
        return await collector.collect(device)
    finally:
        (case / "responses.json").write_text(json.dumps(stub.recording, indent=1) + "\n")
        await collector.close()


async def record_ufm(device: SwitchConfig, case: Path) -> PollResult:
    from _replay_ufm import RecordingTransport

    from collectors.ufm.collector import UfmCollector

    collector = UfmCollector()
    client = await collector._client(device)
    transport = client._http._transport = RecordingTransport(client._http._transport)
    try:
        return await collector.collect(device)
    finally:
        (case / "responses.json").write_text(json.dumps(transport.recording, indent=1) + "\n")
        await collector.close()


async def record_snmp(device: SwitchConfig, case: Path) -> PollResult:
    from _replay_snmp import replay_snmp

    s = device.collectors.get("snmp")
    if s.version == "2c":
        auth = ["-v2c", "-c", s.community.get_secret_value()]
    else:
        level = "authPriv" if s.priv_key else "authNoPriv" if s.auth_key else "noAuthNoPriv"
        auth = ["-v3", "-u", s.user, "-l", level]
        if s.auth_key:
            auth += ["-a", s.auth_protocol.upper(), "-A", s.auth_key.get_secret_value()]
        if s.priv_key:
            auth += ["-x", {"aes": "AES", "aes256": "AES-256", "des": "DES"}[s.priv_protocol], "-X",
                     s.priv_key.get_secret_value()]
    walk = []
    for tree in SNMP_TREES:
        walk.append(subprocess.run(["snmpwalk", *auth, "-On", "-Ox", f"{device.mgmt_address}:{s.port}", tree],
                                   capture_output=True, text=True, check=True, env={**os.environ, "MIBS": ""}).stdout)
    (case / "responses.snmpwalk").write_text("".join(walk))
    return await replay_snmp(device.model_copy(update={"mgmt_address": "192.0.2.1"}), case / "responses.snmpwalk")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("collector", choices=("cli", "snmp", "gnmi", "ufm"))
    ap.add_argument("case", type=Path, help="the case's directory, with its settings.yaml")
    ap.add_argument("--address", required=True, help="the device's management address")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for this recording only (e.g. port=50051; the value is YAML)")
    args = ap.parse_args(argv)
    settings = yaml.safe_load((args.case / "settings.yaml").read_text()) or {}
    for item in args.set:
        name, _, value = item.partition("=")
        settings[name] = yaml.safe_load(value)
    device = SwitchConfig(name=DEVICE, mgmt_address=args.address, collectors={args.collector: settings})
    record = {"cli": record_cli, "snmp": record_snmp, "gnmi": record_gnmi, "ufm": record_ufm}[args.collector]
    result = asyncio.run(record(device, args.case))
    assert Case(args.case).responses().exists()
    draft = yaml.safe_dump(draft_expected(result), sort_keys=False, width=120)
    (args.case / "expected.draft.yaml").write_text(draft)
    print(f"{args.case}: {len(result.records)} records, {len(result.problems)} problems; check "
          f"expected.draft.yaml and save it as expected.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
