"""The agent's configuration, host counters and the netlink link-state parser."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hostprobe import transport
from hostprobe.config import AgentConfig, load
from hostprobe.counters import NicCounters, parse_ethtool
from hostprobe.netlink import IFLA_IFNAME, IFLA_OPERSTATE, RTM_DELLINK, RTM_NEWLINK, LinkMonitor, parse
from nms.config import ConfigError, parse_config

TOKEN = "agent-token-0123456789abcdef"
KEY = "probe-key-0123456789abcdef"
GOOD = """
host: host1
service: {url: "http://198.18.0.1:8080", token: "${AGENT_TOKEN}"}
nics: [{name: eth0, address: 198.19.1.1}]
probe: {key: "${file:key}", rate: 20, down_after: 500ms}
lab_clock: {offset_ns: 1000, drift_ppm: 5}
"""


def test_good_config_with_env_and_file_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    (tmp_path / "key").write_text(KEY + "\n")
    (tmp_path / "agent.yaml").write_text(GOOD)
    cfg = load(tmp_path / "agent.yaml")
    assert isinstance(cfg, AgentConfig)
    assert cfg.service.token.get_secret_value() == TOKEN and cfg.probe.key.get_secret_value() == KEY
    assert cfg.probe.rate == 20 and cfg.probe.down_after == 0.5 and cfg.probe.port == 33434
    assert cfg.peers.refresh == 60 and cfg.probe.sports == 32 and cfg.lab_clock.drift_ppm == 5
    assert TOKEN not in repr(cfg) and KEY not in repr(cfg)
    assert cfg.service.urls == ["http://198.18.0.1:8080"]  # one URL: a one-element list


def test_a_list_of_service_urls_is_kept_in_order():
    cfg = parse_config("host: h\nservice: {urls: ['http://198.18.0.1:8080/', 'https://198.18.0.2:8443'], token: "
                       + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: " + KEY + "}\n", model=AgentConfig)
    assert cfg.service.urls == ["http://198.18.0.1:8080", "https://198.18.0.2:8443"] and cfg.service.url is None
    from hostprobe.config import summary
    assert "service http://198.18.0.1:8080, https://198.18.0.2:8443," in summary(cfg)


@pytest.mark.parametrize("text, where, what", [
    ("host: h\nservice: {url: ftp://x, token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: " + KEY + "}\n",
     "line 2: service.url", "http"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: []\nprobe: {key: " + KEY + "}\n",
     "line 3: nics", "at least 1"),
    ("host: h\nservice: {urls: ['http://a', ftp://b], token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: "
     + KEY + "}\n", "line 2: service.urls[1]", "http"),
    ("host: h\nservice: {urls: ['http://a', 'http://a/'], token: " + TOKEN + "}\nnics: [{name: eth0}]\n"
     "probe: {key: " + KEY + "}\n", "line 2: service.urls", "duplicate URLs: ['http://a']"),
    ("host: h\nservice: {url: 'http://a', urls: ['http://b'], token: " + TOKEN + "}\nnics: [{name: eth0}]\n"
     "probe: {key: " + KEY + "}\n", "line 2: service", "service.url or service.urls, not both"),
    ("host: h\nservice: {urls: [], token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: " + KEY + "}\n",
     "line 2: service", "service.urls (or service.url) is required"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: short}\n",
     "line 4: probe.key", "too short"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: [{name: eth0}]\n"
     "probe: {key: " + KEY + ", rate: 0}\n", "line 4: probe.rate", "greater than 0"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: [{name: eth0, address: '::1'}]\n"
     "probe: {key: " + KEY + "}\n", "line 3: nics[0].address", "IPv4"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: " + KEY +
     "}\nlab_clock: {state_file: /x, offset_ns: 5}\n", "line 5: lab_clock", "not both"),
    ("host: h\nservice: {url: 'http://x', token: " + TOKEN + "}\nnics: [{name: eth0}]\nprobe: {key: " + KEY +
     ", sportz: 3}\n", "line 4: probe.sportz", "Extra inputs"),
])
def test_errors_name_the_field_and_line_never_the_secret(text, where, what):
    with pytest.raises(ConfigError) as e:
        parse_config(text, model=AgentConfig)
    message = str(e.value)
    assert where in message and what in message, message
    assert TOKEN not in message and KEY not in message


def test_agent_refuses_a_bad_config_with_exit_status_2(tmp_path):
    (tmp_path / "a.yaml").write_text("host: h\n")
    proc = subprocess.run([sys.executable, "-m", "hostprobe.agent", "--config", str(tmp_path / "a.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "service" in proc.stderr and "Field required" in proc.stderr


def test_transport_falls_back_to_udp_and_verbs_is_refused(monkeypatch):
    monkeypatch.delenv("NMS_FAKE_VERBS", raising=False)  # the real pyverbs, if any: no RDMA device here
    devices, why = transport.detect_verbs()
    assert devices == [] and why
    stats: dict = {}
    assert transport.open_devices("auto", ["127.0.0.1"], stats) == {}
    assert transport.open_devices("udp", ["127.0.0.1"], stats) == {}
    with pytest.raises(transport.TransportError, match="verbs but"):
        transport.open_devices("verbs", ["127.0.0.1"], stats)


def test_sysfs_counters_of_loopback():
    sample = NicCounters("h1", ["lo"], ethtool="off").sample("lo", 1_800_000_000_000_000_000)
    assert sample.host == "h1" and sample.nic == "lo" and sample.rx_bytes is not None and sample.tx_packets is not None
    assert sample.oper_status == "unknown"  # what the kernel says for lo
    assert sample.pause_rx is None and sample.ecn_marked is None  # nothing guessed without ethtool or RDMA
    assert sample.mtu == int(open("/sys/class/net/lo/mtu").read()) and sample.speed_bps is None  # lo has no speed
    gone = NicCounters("h1", ["nope0"], ethtool="off").sample("nope0", 1)
    assert gone.oper_status == "notPresent" and gone.rx_bytes is None and gone.mtu is None


def test_ethtool_pause_and_ecn_parsing():
    mlx5 = "NIC statistics:\n     rx_packets: 10\n     rx_pause_ctrl_phy: 7\n     tx_pause_ctrl_phy: 3\n" \
           "     rx_ecn_mark: 11\n"
    assert parse_ethtool(mlx5) == {"pause_rx": 7, "pause_tx": 3, "ecn_marked": 11}
    pfc = "NIC statistics:\n  rx_prio0_pause: 1\n  rx_prio3_pause: 5\n  tx_prio3_pause: 2\n"
    assert parse_ethtool(pfc) == {"pause_rx": 6, "pause_tx": 2}
    assert parse_ethtool("no stats available\n") == {}


def _rtattr(type_: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, type_) + payload + b"\0" * ((-length) % 4)


def _link_msg(type_: int, name: str, oper: int) -> bytes:
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 1, 5, 0, 0)
    body += _rtattr(IFLA_IFNAME, name.encode() + b"\0") + _rtattr(IFLA_OPERSTATE, bytes([oper]))
    return struct.pack("=IHHII", 16 + len(body), type_, 0, 0, 0) + body


def test_netlink_link_messages():
    data = _link_msg(RTM_NEWLINK, "eth0", 6) + _link_msg(RTM_NEWLINK, "eth1", 2) + _link_msg(RTM_DELLINK, "eth2", 6)
    assert parse(data) == [("eth0", "up"), ("eth1", "down"), ("eth2", "notPresent")]
    assert parse(data[:10]) == []  # truncated: ignored, not an exception
    monitor = LinkMonitor()  # subscribing to RTMGRP_LINK needs no privileges
    try:
        assert monitor.read() == []
    finally:
        monitor.close()


def test_example_config_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("NMS_AGENT_TOKEN", TOKEN)
    text = (Path(__file__).resolve().parents[1] / "config" / "agent.yaml").read_text()
    (tmp_path / "probe-key").write_text(KEY)
    cfg = parse_config(text.replace("/etc/nms-agent/probe-key", str(tmp_path / "probe-key")), model=AgentConfig)
    assert cfg.host == "gpu001" and cfg.nics[0].address is None and cfg.probe.sports == 32


# --- validating a file without starting anything: `nms-agent --check`, `nms config check` ---------

BAD = ("host: h1\n"
       "service: {url: ftp://nms, token: " + TOKEN + "}\n"
       "nics: [{name: eth0, address: '::1'}]\n"
       "probe:\n"
       "  key: short-secret\n"
       "  rate: 0\n"
       "  sportz: 3\n")
BAD_WHERE = ["line 2: service.url", "line 3: nics[0].address", "line 5: probe.key", "line 6: probe.rate",
             "line 7: probe.sportz"]


def _good_file(tmp_path) -> Path:
    (tmp_path / "key").write_text(KEY + "\n")
    path = tmp_path / "agent.yaml"
    # a NIC and buffer that the agent, were it started, would bind and create at once
    path.write_text(f"{GOOD}report: {{buffer_dir: {tmp_path / 'buffer'}}}\n"
                    .replace("{name: eth0, address: 198.19.1.1}", "{name: lo, address: 127.0.0.1}"))
    return path


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENT_TOKEN": TOKEN, "COLUMNS": "200", **env})


def test_agent_check_validates_without_starting(tmp_path):
    path = _good_file(tmp_path)
    proc = _run("hostprobe.agent", "--check", "--config", str(path))
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()  # one line
    assert line.startswith(f"ok {path}: host 'host1'") and "1 NIC(s) (lo 127.0.0.1)" in line, line
    assert proc.stderr == "" and TOKEN not in proc.stdout and KEY not in proc.stdout
    assert not (tmp_path / "buffer").exists()  # the agent's first act on start: nothing was started


def test_agent_check_lists_every_error_with_field_and_line(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD)
    proc = _run("hostprobe.agent", "--check", "--config", str(tmp_path / "bad.yaml"))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == f"{tmp_path / 'bad.yaml'}: 5 configuration error(s)", proc.stderr
    assert [line.split(":")[0] + ":" + line.split(":")[1] for line in lines[1:]] == [f"  {w}" for w in BAD_WHERE]
    assert proc.stdout == "" and TOKEN not in proc.stderr and "short-secret" not in proc.stderr
    assert "--check needs --config" in _run("hostprobe.agent", "--check").stderr


def test_nms_config_check_recognises_an_agent_file(tmp_path):
    path = _good_file(tmp_path)
    ok = _run("nms", "config", "check", str(path))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok {path} (nms-agent): host 'host1'") and len(ok.stdout.splitlines()) == 1
    # the same lines as nms-agent --check, and the kind it was checked as
    (tmp_path / "bad.yaml").write_text(BAD)
    bad = _run("nms", "config", "check", str(tmp_path / "bad.yaml"))
    agent = _run("hostprobe.agent", "--check", "--config", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 1
    assert "5 configuration error(s) (checked as an nms-agent configuration" in bad.stderr
    assert bad.stderr.splitlines()[1:] == agent.stderr.splitlines()[1:]
    assert all(w in bad.stderr for w in BAD_WHERE)
    # --kind service: checked as the service's file, which has none of these keys
    forced = _run("nms", "config", "check", "--kind", "service", str(path))
    assert forced.returncode == 1 and "line 2: host: Extra inputs are not permitted" in forced.stderr
    # a service file with one stray agent key is still a service file
    (tmp_path / "nms.yaml").write_text("site: lab\napi: {port: 8080}\nprobe: {rate: 5}\n")
    svc = _run("nms", "config", "check", str(tmp_path / "nms.yaml"))
    assert svc.returncode == 1 and "line 3: probe: Extra inputs" in svc.stderr and "nms-agent" not in svc.stderr


@pytest.mark.parametrize("text, expected", [
    (GOOD, "agent"),
    ("host: h\nserivce: {}\nnics: []\nlog_level: info\n", "agent"),  # a typo does not make it a service file
    ("site: x\nfabric: {}\nprobe: {}\n", "service"),
    ("log_level: info\n", "service"),  # a key both have: the service's, as before
    ("", "service"),
    ("- a list\n", "service"),  # not a mapping: parse_config says so
    ("host: [unclosed\n", "service"),  # not YAML: idem
])
def test_detect_model_by_top_level_keys(text, expected):
    from nms.config import NmsConfig, detect_model

    model = detect_model(text, [NmsConfig, AgentConfig])
    assert model is {"agent": AgentConfig, "service": NmsConfig}[expected]
