"""A real net-snmp snmpd for tests: the root namespace's IF-MIB on 127.0.0.1 and a free UDP port.

Everything (config, persistent dir with the v3 users' localized keys, log, pid file) lives in its
own temporary directory; stop() kills only the process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nms.app.local_daemons import free_port

SNMPD = shutil.which("snmpd") or "/usr/sbin/snmpd"
SKIP_REASON = "net-snmp snmpd not installed: apt-get install snmpd snmp"
COMMUNITY = "nms-test-community"
# the same agent seen through views that hide IP-MIB's address tables: ipAddrTable only (the
# collector falls back to ipAddressTable), or both (a device without interface addresses)
COMMUNITY_NO_IPADDRTABLE = "nms-test-no-ipaddrtable"
COMMUNITY_NO_ADDRESSES = "nms-test-no-addresses"
# ifXTable hidden: an old or out-of-band device with only the 32-bit ifTable
COMMUNITY_NO_IFXTABLE = "nms-test-no-ifxtable"
IF_SPEED_LO = ".1.3.6.1.2.1.2.2.1.5.1"  # ifSpeed of lo (ifIndex 1 on Linux)
# user -> (net-snmp auth, auth key, net-snmp priv, priv key, our SnmpSettings fields)
V3_USERS = {
    "nmssha": ("SHA", "auth-key-sha-1", "AES", "priv-key-aes-1", {"auth_protocol": "sha", "priv_protocol": "aes"}),
    "nmssha256": ("SHA-256", "auth-key-sha256", "AES", "priv-key-aes-2",
                  {"auth_protocol": "sha256", "priv_protocol": "aes"}),
    "nmssha512": ("SHA-512", "auth-key-sha512", "AES-256", "priv-key-aes256",
                  {"auth_protocol": "sha512", "priv_protocol": "aes256"}),
    "nmsmd5": ("MD5", "auth-key-md5-1", "DES", "priv-key-des-1", {"auth_protocol": "md5", "priv_protocol": "des"}),
    "nmsauthonly": ("SHA", "auth-key-only-1", None, None, {"auth_protocol": "sha"}),  # authNoPriv
}


def free_udp_port() -> int:
    return free_port(udp=True)


def available() -> bool:
    return Path(SNMPD).exists() and os.access(SNMPD, os.X_OK)


class Snmpd:
    def __init__(self, extra_config: list[str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nms-snmpd-"))
        self.port = free_udp_port()
        self.pid: int | None = None
        self.extra_config = extra_config or []  # more snmpd.conf lines (e.g. `override`)

    def settings(self, user: str | None = None, **overrides) -> dict:
        """SnmpSettings fields for v2c (no user) or one of V3_USERS."""
        if user is None:
            base = {"version": "2c", "community": COMMUNITY}
        else:
            _, auth, _, priv, fields = V3_USERS[user]
            base = {"version": "3", "user": user, "auth_key": auth, **({"priv_key": priv} if priv else {}), **fields}
        return {**base, "port": self.port, "timeout": 1.0, "retries": 1, **overrides}

    def _config(self) -> str:
        lines = [f"agentAddress udp:127.0.0.1:{self.port}", f"rocommunity {COMMUNITY} 127.0.0.1",
                 "master agentx", f"agentXSocket unix:{self.dir}/agentx.sock", "sysName nms-test-snmpd",
                 "view noipaddrtable included .1", "view noipaddrtable excluded .1.3.6.1.2.1.4.20",
                 f"rocommunity {COMMUNITY_NO_IPADDRTABLE} 127.0.0.1 -V noipaddrtable",
                 "view noaddresses included .1", "view noaddresses excluded .1.3.6.1.2.1.4.20",
                 "view noaddresses excluded .1.3.6.1.2.1.4.34",
                 f"rocommunity {COMMUNITY_NO_ADDRESSES} 127.0.0.1 -V noaddresses",
                 "view noifxtable included .1", "view noifxtable excluded .1.3.6.1.2.1.31.1.1",
                 f"rocommunity {COMMUNITY_NO_IFXTABLE} 127.0.0.1 -V noifxtable", *self.extra_config]
        for user, (auth, akey, priv, pkey, _) in V3_USERS.items():
            if priv:
                lines += [f"createUser {user} {auth} {akey} {priv} {pkey}", f"rouser {user} priv"]
            else:
                lines += [f"createUser {user} {auth} {akey}", f"rouser {user} auth"]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        conf, pidfile = self.dir / "snmpd.conf", self.dir / "snmpd.pid"
        conf.write_text(self._config())
        conf.chmod(0o600)
        env = {**os.environ, "MIBS": "", "SNMP_PERSISTENT_DIR": str(self.dir / "persist")}
        subprocess.run([SNMPD, "-C", "-c", str(conf), "-p", str(pidfile), "-Lf", str(self.dir / "snmpd.log")],
                       env=env, check=True, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if pidfile.exists() and pidfile.read_text().strip():
                self.pid = int(pidfile.read_text())
                if self._answers():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"snmpd did not start: {(self.dir / 'snmpd.log').read_text()[-2000:]}")

    def _answers(self) -> bool:
        proc = subprocess.run(["snmpget", "-v2c", "-c", COMMUNITY, "-t", "0.5", "-r", "0", "-Oqv",
                               f"127.0.0.1:{self.port}", "1.3.6.1.2.1.1.5.0"], capture_output=True, text=True,
                              env={**os.environ, "MIBS": ""})
        return proc.returncode == 0

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
                for _ in range(100):
                    os.kill(self.pid, 0)
                    time.sleep(0.02)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None
        shutil.rmtree(self.dir, ignore_errors=True)


def kernel_stats(ifname: str) -> dict[str, int]:
    base = Path("/sys/class/net") / ifname / "statistics"
    return {name: int((base / name).read_text()) for name in
            ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")}


def kernel_ipv4() -> dict[str, tuple[str, int]]:
    """The root namespace's IPv4 addresses: address -> (interface, prefix length), from `ip -j`."""
    links = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                                      check=True, timeout=10).stdout or "[]")
    return {a["local"]: (link["ifname"], a["prefixlen"]) for link in links for a in link.get("addr_info", [])
            if a.get("family") == "inet" and "local" in a}


@pytest.fixture(scope="module")
def snmpd():
    """A running snmpd for one test module (skips, saying why, where net-snmp is missing)."""
    if not available():
        pytest.skip(SKIP_REASON)
    server = Snmpd()
    server.start()
    yield server
    server.stop()
