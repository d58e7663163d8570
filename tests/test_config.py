"""Configuration: validation errors name the field and line; secrets come from env/files and never leak."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nms.config import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-value-that-must-not-leak"


def _issues(text: str, **kw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, **kw)
    return [str(i) for i in info.value.issues]


def test_example_configs_load(monkeypatch):
    monkeypatch.setenv("NMS_TOKEN", "a" * 32)
    monkeypatch.setenv("INFLUX_PASSWORD", "pw")
    example = load_config(REPO / "config/example.yaml")
    assert example.store.backend == "embedded"
    assert [s.name for s in example.fabric.switches] == ["spine1", "leaf1"]
    assert example.fabric.switches[0].collectors.snmp.community.get_secret_value() == "public"  # ${VAR:-default}
    assert example.data_dir == (REPO / "data").resolve()  # relative to the config file
    assert load_config(REPO / "config/influxdb.yaml").store.influxdb.password.get_secret_value() == "pw"


def test_every_error_has_path_and_line():
    text = """\
site: lab
api:
  port: 99999
  tokens:
    - name: ops
      scopes: [read, superuser]
      hash: sha256:1234
store:
  backend: cassandra
fabric:
  switches:
    - name: spine1
      mgmt_address: 10.0.0.300
      colectors: {}
"""
    issues = _issues(text)
    expected = [
        ("line 3: api.port", "less than or equal to 65535"),
        ("line 6: api.tokens[0].scopes[1]", "'read', 'ingest', 'act' or 'admin'"),
        ("line 7: api.tokens[0].hash", "sha256:<64 hex digits>"),
        ("line 9: store.backend", "'embedded' or 'influxdb'"),
        ("line 13: fabric.switches[0].mgmt_address", "does not appear to be an IPv4 or IPv6 address"),
        ("line 14: fabric.switches[0].colectors", "Extra inputs are not permitted"),
    ]
    for where, what in expected:
        assert any(i.startswith(where) and what in i for i in issues), (where, issues)
    assert len(issues) == len(expected)


def test_cross_field_errors():
    text = """\
fabric:
  switches:
    - {name: s1, mgmt_address: 192.0.2.1, collectors: {snmp: {version: "3", user: u, auth_key: short}}}
    - {name: s1, mgmt_address: 192.0.2.2}
  links:
    - {a: "s1:e1", b: "ghost:e1"}
"""
    issues = _issues(text)
    assert any("line 3: fabric.switches[0].collectors.snmp" in i and "at least 8 characters" in i for i in issues)
    # Whole-inventory checks run once every entry is valid on its own.
    issues = _issues(text.replace("auth_key: short", "auth_key: longenough"))
    assert any("line 1: fabric" in i and "duplicate device names: ['s1']" in i for i in issues)
    issues = _issues(
        text.replace("auth_key: short", "auth_key: longenough").replace(
            "name: s1, mgmt_address: 192.0.2.2", "name: s2, mgmt_address: 192.0.2.2"
        )
    )
    assert any("link end 'ghost:e1' names an unknown device" in i for i in issues)


def test_invalid_yaml_reports_line():
    issues = _issues("site: x\napi: [unclosed\n")
    assert len(issues) == 1 and "invalid YAML" in issues[0] and "line" in issues[0]


def test_env_and_file_secrets_resolved_and_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_TOKEN", SECRET)
    (tmp_path / "pw").write_text("file-password\n")
    cfg = parse_config("""\
api:
  tokens:
    - {name: agent, scopes: [ingest], token: "${MY_TOKEN}"}
store:
  influxdb: {username: u, password: "${file:pw}"}
""", base_dir=tmp_path)
    assert cfg.api.tokens[0].token.get_secret_value() == SECRET
    assert cfg.store.influxdb.password.get_secret_value() == "file-password"
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.model_dump())
    assert SECRET not in cfg.model_dump_json()


def test_secret_that_fails_validation_is_not_echoed(monkeypatch):
    monkeypatch.setenv("SHORT_TOKEN", "tiny-secret")
    monkeypatch.setenv("PORT_SECRET", "not-a-port-secret-xyz")
    issues = _issues(
        'api:\n  port: "${PORT_SECRET}"\n  tokens:\n    - {name: a, scopes: [read], token: "${SHORT_TOKEN}"}\n'
    )
    text = "\n".join(issues)
    assert "api.port" in text and "too short" in text
    assert "tiny-secret" not in text and "not-a-port-secret-xyz" not in text


def test_missing_env_and_file_references():
    issues = _issues('api:\n  tokens:\n    - {name: a, scopes: [read], token: "${NOPE_NOT_SET}"}\n'
                     'store:\n  influxdb: {username: u, password: "${file:/nonexistent/pw}"}\n')
    assert any("line 3: api.tokens[0].token: environment variable NOPE_NOT_SET is not set" in i for i in issues)
    assert any("line 5: store.influxdb.password: cannot read secret file" in i for i in issues)
    assert len(issues) == 2  # no follow-on noise from the unresolved values


def test_cli_config_check_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("site: ok\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("site: ok\napi:\n  port: -1\n")
    def run(f):
        return subprocess.run([sys.executable, "-m", "nms", "config", "check", str(f)], capture_output=True, text=True)
    ok = run(good)
    assert ok.returncode == 0 and "ok" in ok.stdout
    failed = run(bad)
    assert failed.returncode == 1
    assert "line 3: api.port" in failed.stderr
    missing = run(tmp_path / "missing.yaml")
    assert missing.returncode == 1 and "cannot read file" in missing.stderr


def test_api_tls_files_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "nms.yaml").write_text("api:\n  tls: {cert: tls/server.crt, key: /etc/nms/server.key}\n")
    tls = load_config(tmp_path / "conf" / "nms.yaml").api.tls
    assert (tls.cert, tls.key) == (tmp_path / "conf" / "tls" / "server.crt", Path("/etc/nms/server.key"))
