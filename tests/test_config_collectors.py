"""`fabric.switches[].collectors.<name>`: each section validated by its collector's own settings model,
found through the `nms.collectors` entry point, built-in or a third party's (installed here as a real
distribution: a dist-info with entry_points.txt in a directory on sys.path)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from collectors.cli.settings import CliSettings
from collectors.gnmi.settings import GnmiSettings
from collectors.snmp.settings import SnmpSettings
from collectors.ufm.settings import UfmSettings
from nms.app.polling import load_collectors
from nms.config import ConfigError, parse_config
from nms.config.collectors import installed_collectors
from nms.config.models import SwitchConfig

REPO = Path(__file__).resolve().parent.parent
SECRET = "c0mmunity-that-must-not-leak"

ACME = '''\
"""A third party's collector: its own settings model, polled like a built-in one."""
from typing import Literal

from pydantic import Field, SecretStr

from collectors.base import Collector, PollStart
from nms.config.models import Seconds, Strict
from nms.records import DeviceFacts


class AcmeSettings(Strict):
    api_key: SecretStr
    region: Literal["eu", "us"] = "eu"
    interval: Seconds = 15.0
    shards: int = Field(1, ge=1, le=8)


class AcmeCollector(Collector):
    name = "acme"
    settings_model = AcmeSettings

    async def collect(self, device):
        s = self.required_settings(device)
        return self.result(device.name, PollStart(), [DeviceFacts(device=device.name, ts=1, sys_name=s.region)])
'''


def _issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return [str(i) for i in info.value.issues]


@pytest.fixture
def acme(tmp_path, monkeypatch):
    """The `acme` collector, installed as a distribution of its own (found by importlib.metadata)."""
    (tmp_path / "acme_nms.py").write_text(ACME)
    dist = tmp_path / "acme_nms-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-nms\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text('[nms.collectors]\nacme = acme_nms:AcmeCollector\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    installed_collectors.cache_clear()
    yield tmp_path
    installed_collectors.cache_clear()
    sys.modules.pop("acme_nms", None)


def test_each_built_in_section_is_its_collectors_own_model():
    cfg = parse_config("""\
fabric:
  switches:
    - name: s1
      mgmt_address: 192.0.2.1
      collectors:
        snmp: {community: public}
        gnmi: {insecure: true}
        cli: {username: nms, password: pw, known_hosts: /etc/nms/known_hosts}
    - {name: u1, mgmt_address: 192.0.2.2, collectors: {ufm: {token: t0k}}}
    - {name: s3, mgmt_address: 192.0.2.3}
""")
    s1, u1, s3 = cfg.fabric.switches
    assert [type(s1.collectors[n]) for n in ("snmp", "gnmi", "cli")] == [SnmpSettings, GnmiSettings, CliSettings]
    assert type(u1.collectors.ufm) is UfmSettings and u1.collectors.snmp is None  # attribute access too
    assert dict(s3.collectors) == {} and s3.collectors.get("snmp") is None
    assert sorted(load_collectors(cfg)) == ["cli", "gnmi", "snmp", "ufm"]


def test_errors_name_the_full_path_and_line_and_never_the_secret(monkeypatch):
    monkeypatch.setenv("SNMP_SECRET", SECRET)
    issues = _issues("""\
fabric:
  switches:
    - {name: s1, mgmt_address: 192.0.2.1, collectors: {snmp: {community: public}}}
    - {name: s2, mgmt_address: 192.0.2.2, collectors: {snmp: {community: public}}}
    - name: s3
      mgmt_address: 192.0.2.3
      collectors:
        snmp:
          community: ${SNMP_SECRET}
          comunity: typo
          retries: "${SNMP_SECRET}"
        gnmi: {username: u}
""")
    assert any(i.startswith("line 10: fabric.switches[2].collectors.snmp.comunity: Extra inputs") for i in issues)
    assert any(i.startswith("line 11: fabric.switches[2].collectors.snmp.retries: Input should be a valid integer")
               for i in issues)
    assert any(i.startswith("line 12: fabric.switches[2].collectors.gnmi: Value error, give both username and password")
               for i in issues), issues
    assert len(issues) == 3 and SECRET not in "\n".join(issues)


def test_env_secrets_expand_into_a_collectors_settings(monkeypatch):
    monkeypatch.setenv("SNMP_SECRET", SECRET)
    cfg = parse_config("fabric:\n  switches:\n    - {name: s1, mgmt_address: 192.0.2.1, "
                       "collectors: {snmp: {community: '${SNMP_SECRET}'}}}\n")
    community = cfg.fabric.switches[0].collectors.snmp.community
    assert community.get_secret_value() == SECRET
    assert SECRET not in repr(cfg) and SECRET not in cfg.model_dump_json()
    assert cfg.model_dump()["fabric"]["switches"][0]["collectors"]["snmp"]["port"] == 161


def test_an_unknown_collector_is_an_error_listing_the_installed_ones():
    issues = _issues("fabric:\n  switches:\n    - name: s1\n      mgmt_address: 192.0.2.1\n"
                     "      collectors:\n        snmpp: {community: public}\n")
    assert issues == ["line 6: fabric.switches[0].collectors.snmpp: no collector named 'snmpp' is installed "
                      "(installed: cli, gnmi, snmp, ufm)"]


def test_a_third_party_collector_is_configured_through_its_own_model(acme):
    text = """\
fabric:
  switches:
    - name: edge1
      mgmt_address: 192.0.2.7
      collectors:
        acme: {api_key: k3y-of-acme, region: us}
"""
    cfg = parse_config(text)
    settings = cfg.fabric.switches[0].collectors.acme
    assert type(settings).__name__ == "AcmeSettings" and settings.region == "us" and settings.interval == 15.0
    collector = load_collectors(cfg)["acme"]
    assert collector.schedule(cfg.fabric.switches[0]).interval_s == 15.0
    result = asyncio.run(collector.collect_with_deadline(cfg.fabric.switches[0]))
    assert (result.collector, result.facts.sys_name) == ("acme", "us")

    issues = _issues(text.replace("region: us", "region: mars, shards: 9, extra: 1"))
    assert [i.split(": ", 2)[1] for i in issues] == ["fabric.switches[0].collectors.acme.region",
                                                     "fabric.switches[0].collectors.acme.shards",
                                                     "fabric.switches[0].collectors.acme.extra"]
    assert "k3y-of-acme" not in "\n".join(issues)
    assert "installed: acme, cli, gnmi, snmp, ufm" in _issues(text.replace("acme:", "acne:"))[0]


def test_a_collector_without_a_settings_model_or_failing_to_load_is_named(acme):
    (acme / "acme_nms.py").write_text(ACME.replace("    settings_model = AcmeSettings\n", ""))
    text = "fabric:\n  switches:\n    - {name: e1, mgmt_address: 192.0.2.7, collectors: {acme: {api_key: k}}}\n"
    assert _issues(text) == ["line 3: fabric.switches[0].collectors.acme: the acme collector declares no settings "
                             "model (a pydantic model as its settings_model)"]
    sys.modules.pop("acme_nms", None)
    (acme / "acme_nms.py").write_text("import acme_missing_dependency\n")
    assert _issues(text) == ["line 3: fabric.switches[0].collectors.acme: the acme collector could not be loaded "
                             "(ModuleNotFoundError: No module named 'acme_missing_dependency')"]


def test_a_switch_built_in_code_takes_settings_objects_or_mappings():
    snmp = SnmpSettings(community="public")
    assert SwitchConfig(name="s", mgmt_address="192.0.2.1", collectors={"snmp": snmp}).collectors.snmp is snmp
    with pytest.raises(ValueError, match=r"collectors\.snmp\.port"):
        SwitchConfig(name="s", mgmt_address="192.0.2.1", collectors={"snmp": {"community": "c", "port": 0}})


def test_config_check_of_a_third_party_collector_in_a_fresh_process(acme):
    """`nms config check` as a user runs it: the plugin found on PYTHONPATH by its dist-info; the SDK loads
    only the collectors the file names."""
    good, bad = acme / "good.yaml", acme / "bad.yaml"
    good.write_text("fabric:\n  switches:\n    - {name: e1, mgmt_address: 192.0.2.7, "
                    "collectors: {acme: {api_key: '${ACME_KEY}'}}}\n")
    bad.write_text(good.read_text().replace("api_key", "region: mars, api_key"))
    env = {**os.environ, "PYTHONPATH": f"{acme}{os.pathsep}{REPO}", "ACME_KEY": "k3y-of-acme"}

    def check(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nms", "config", "check", str(path)],
                              capture_output=True, text=True, env=env, timeout=120)

    ok, failed = check(good), check(bad)
    assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr
    assert failed.returncode == 1 and "line 3: fabric.switches[0].collectors.acme.region" in failed.stderr
    assert "k3y-of-acme" not in failed.stderr + failed.stdout
    loaded = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
        import sys
        from nms.config import load_config
        before = sorted(m for m in sys.modules if m.startswith(("collectors", "acme_nms")))
        load_config(sys.argv[1])
        print(before, sorted(m for m in sys.modules if m in ("acme_nms", "collectors.snmp", "collectors.gnmi")))
        """), str(good)], capture_output=True, text=True, env=env, timeout=120)
    assert loaded.stdout.strip() == "[] ['acme_nms']", loaded.stderr


@pytest.mark.parametrize("name", ["snmp", "gnmi", "ufm", "cli"])
def test_each_collectors_readme_sample_is_a_valid_configuration(name, monkeypatch):
    readme = (REPO / "collectors" / name / "README.md").read_text()
    sample = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    for var in re.findall(r"\$\{(\w+)\}", sample):
        monkeypatch.setenv(var, "a-long-enough-secret")
    cfg = parse_config("fabric:\n  switches:\n" + textwrap.indent(sample, "    "))
    [switch] = cfg.fabric.switches
    assert list(switch.collectors) == [name]
    assert type(switch.collectors[name]) is load_collectors(cfg)[name].settings_model
