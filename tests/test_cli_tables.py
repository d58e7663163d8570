"""`nms collect ... --once` and `nms devices` in an 80-column terminal: the default tables fit it with
nothing cut short; --wide shows every column; --json everything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from _snmpd import kernel_ipv4

REPO = Path(__file__).resolve().parents[1]
LONG_NAME = "dc1-pod3-leaf-017"


def run(*args: str, columns: int = 80, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in ("NMS_URL", "NMS_TOKEN")}, "COLUMNS": str(columns), **env}
    return subprocess.run([sys.executable, "-m", "nms", *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=env)


def assert_fits(out: str, columns: int = 80) -> list[str]:
    lines = out.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, "\n" + out
    assert "…" not in out, "a cell was cut short:\n" + out
    return lines


def row(lines: list[str], *cells: str) -> str:
    """The one line holding these cells in this order (so the row was not wrapped or cut)."""
    bar = "[│┃]"  # body, header
    pattern = re.compile(bar + r"\s*" + (r"\s*" + bar + r"\s*").join(map(re.escape, cells)) + r"\s*" + bar)
    found = [line for line in lines if pattern.search(line)]
    assert len(found) == 1, f"no single line with {cells}:\n" + "\n".join(lines)
    return found[0]


def unwrapped(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def collect_config(snmpd, tmp_path):
    """The root namespace's lo and eth* (only: what else is there, e.g. a lab's interfaces while one runs,
    would set the columns' widths), and a device that never answers."""
    cfg = tmp_path / "nms.yaml"
    cfg.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "snmpd-local", "mgmt_address": "127.0.0.1",
         "collectors": {"snmp": {**snmpd.settings(), "interfaces": ["lo", "eth*"]}}},
        {"name": LONG_NAME, "mgmt_address": "127.0.0.1",
         "collectors": {"snmp": {"community": "x", "port": 9, "timeout": 0.3, "retries": 0}}}]}}))
    return cfg


@pytest.mark.snmpd
def test_collect_once_default_tables_fit_80_columns(collect_config):
    proc = run("collect", "snmp", "--once", "--config", str(collect_config))
    assert proc.returncode == 1, proc.stderr  # one device failed
    lines = assert_fits(proc.stdout)
    header = row(lines, "device", "port", "oper", "speed", "in", "out", "errors", "discards")
    assert "mtu" not in proc.stdout and "in pkts" not in proc.stdout  # behind --wide
    lo = row(lines, "snmpd-local", "lo", "up")
    assert re.search(r"│\s*\d[\d.]* [kMGTPE]?B\s*│", lo), lo  # bytes, readable
    assert "65536" not in lo  # lo's MTU: a --wide column
    assert len(lines) > 4 and header
    # devices: the error's kind in the table, its whole message under it
    row(lines, LONG_NAME, "error")
    assert f"{LONG_NAME} (snmp): no SNMP response from 127.0.0.1:9" in unwrapped(proc.stdout)
    assert "1/2 devices ok" in proc.stderr


@pytest.mark.snmpd
def test_collect_once_wide_and_json_show_every_column(collect_config):
    wide = run("collect", "snmp", "--once", "--wide", "--config", str(collect_config))
    assert wide.returncode == 1, wide.stderr
    lines = wide.stdout.splitlines()
    assert "…" not in wide.stdout
    row(lines, "device", "port", "oper", "speed", "mtu", "in octets", "out octets", "in pkts", "out pkts", "in err",
        "out err", "in disc", "out disc")
    lo = row(lines, "snmpd-local", "lo", "up")
    assert "65536" in lo and re.search(r"│\s*\d{5,}\s*│", lo), lo  # MTU, raw octet counters
    row(lines, "device", "address", "state", "took", "objects", "left out", "error")
    assert max(len(line) for line in lines) > 80  # wider than the terminal rather than cut short

    js = run("collect", "snmp", "--once", "--json", "--config", str(collect_config))
    assert js.returncode == 1, js.stderr
    doc = json.loads(js.stdout)
    assert set(doc) == {"devices", "facts", "interfaces", "lldp", "addresses"}
    [lo_json] = [s for s in doc["interfaces"] if s["device"] == "snmpd-local" and s["port"] == "lo"]
    assert lo_json["mtu"] == 65536 and isinstance(lo_json["in_octets"], int) and "in_discards" in lo_json
    status = {d["device"]: d for d in doc["devices"]}
    assert status["snmpd-local"]["state"] == "ok" and status[LONG_NAME]["last_error_kind"] == "timeout"
    assert "127.0.0.1:9" in status[LONG_NAME]["last_error"]
    eth = {addr for addr, (ifname, _) in kernel_ipv4().items() if ifname.startswith("eth")}
    assert eth <= {a["address"] for a in doc["addresses"]}  # the machine's own, as the collector's test reads them
    assert all(a["device"] == "snmpd-local" and "prefix_len" in a for a in doc["addresses"])
    [facts] = doc["facts"]
    # the device's interface count, of which the `interfaces` patterns keep some
    assert facts["device"] == "snmpd-local" and facts["interfaces"] >= len(
        [s for s in doc["interfaces"] if s["device"] == "snmpd-local"]) >= 2


DEVICES = [
    {"device": LONG_NAME, "collector": "snmp", "address": "10.200.13.117", "state": "backoff", "interval_s": 10.0,
     "deadline_s": 8.0, "polls": 1234, "failures": 17, "consecutive_failures": 3, "last_poll_ns": None,
     "last_success_ns": None, "last_duration_s": 8.0, "last_error_kind": "timeout",
     "last_error": f"{LONG_NAME}: no SNMP response from 10.200.13.117:161 as community (v2c) after 3 tries of "
                   "2 s (a wrong community looks the same: agents drop such requests silently)",
     "next_attempt_ns": None, "records": 0},
    {"device": "spine1", "collector": "snmp", "address": "10.200.0.1", "state": "ok", "interval_s": 10.0,
     "deadline_s": 8.0, "polls": 1234, "failures": 0, "consecutive_failures": 0, "last_poll_ns": None,
     "last_success_ns": None, "last_duration_s": 0.41, "last_error_kind": "auth", "last_error": "spine1: old error",
     "next_attempt_ns": None, "records": 130, "problems": 41, "last_problem_count": 4, "last_problems": [
         {"what": f"extra object SNMPv2-MIB::sysLocation.{i}", "kind": "bad_response",
          "reason": "the agent has no such object (noSuchObject or noSuchInstance)"} for i in range(4)]},
]


@pytest.fixture
def devices_url():
    """A stand-in for the service's GET /devices (the CLI's side is what is tested)."""
    now = time.time_ns()
    items = [dict(DEVICES[0]), dict(DEVICES[1], last_success_ns=now - 7200 * 10**9)]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(items if self.path == "/devices" else {"detail": "not found"}).encode()
            self.send_response(200 if self.path == "/devices" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_devices_default_table_fits_80_columns(devices_url):
    proc = run("devices", "--url", devices_url)
    assert proc.returncode == 0, proc.stderr
    lines = assert_fits(proc.stdout)
    row(lines, "device", "via", "state", "last ok", "failures", "left out", "error")
    row(lines, LONG_NAME, "snmp", "backoff", "never", "17/1234", "", "timeout")  # an older server: no problems
    row(lines, "spine1", "snmp", "ok", "2h ago", "0/1234", "4", "")  # an old error of a device now ok: not shown
    assert "10.200.0.1" not in proc.stdout and "old error" not in proc.stdout
    assert f"{LONG_NAME} (snmp): no SNMP response from 10.200.13.117:161 as community (v2c) after 3 tries of 2 s " \
           "(a wrong community looks the same: agents drop such requests silently)" in unwrapped(proc.stdout)
    # what the last poll left out: three of them under the table, the rest counted
    notes = unwrapped(proc.stdout.split("left out of the last poll (the rest was kept):")[1])
    assert "spine1 (snmp): extra object SNMPv2-MIB::sysLocation.2: the agent has no such object" in notes
    assert "sysLocation.3" not in notes and "and 1 more (nms devices --json)" in notes


def test_devices_wide_and_json(devices_url):
    wide = run("devices", "--wide", "--url", devices_url)
    assert wide.returncode == 0, wide.stderr
    lines = wide.stdout.splitlines()
    assert "…" not in wide.stdout
    row(lines, "device", "collector", "address", "state", "last success", "took", "polls", "failures", "left out",
        "error")
    line = row(lines, LONG_NAME, "snmp", "10.200.13.117", "backoff", "never", "8.00 s", "1234", "17", "")
    assert "timeout:" in line
    [spine1] = [x for x in lines if x.startswith("│ spine1 ")]
    assert re.search(r"│\s*0\s*│\s*4 \(41 in all\)\s*│", spine1), spine1  # failures, left out (of all so far)
    assert "sysLocation.3: the agent" in unwrapped(wide.stdout)  # --wide: every problem kept
    js = run("devices", "--json", "--url", devices_url)
    assert [d["device"] for d in json.loads(js.stdout)] == [LONG_NAME, "spine1"]
