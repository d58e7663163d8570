"""Helpers for the fabric lab tests: a handle on a running lab that talks to it the way a user
(the CLI) or the NMS (SNMP over the management network) would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from lab import cleanup, paths
from lab import lab as lab_mod
from lab.sh import INSTALL_HINT, REQUIRED
from lab.state import LabDir, topology_of
from lab.topology import Spec

PREFIX = "nmst-"
MGMT = "198.18.250.0/24"
RATE = 100_000_000
REPO = Path(__file__).resolve().parents[2]


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "fabric lab tests need root (network namespaces, veth, tc, nftables); CI runs them as root"
    missing = [b for b in REQUIRED if shutil.which(b) is None]
    if missing:
        return f"fabric lab tests need {', '.join(missing)}: {INSTALL_HINT}"
    return None


class Lab:
    """A running lab plus helpers that talk to it the way a user or the NMS would."""

    def __init__(self, lab_dir: LabDir):
        self.dir = lab_dir
        self.topo = topology_of(self.state())

    def state(self) -> dict:
        return self.dir.load()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [args[0], "--lab-dir", str(self.dir.root), *args[1:]]  # before any `--`
        proc = subprocess.run([sys.executable, "-m", "lab.cli", *argv],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"nms lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def fault(self, *args: str) -> dict:
        return json.loads(self.cli("fault", *args, "--json").stdout)

    def heal(self, fault_id: str) -> None:
        self.cli("heal", fault_id)

    def status(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def counters(self, node: str, port: str) -> dict:
        out = subprocess.run(["ip", "-n", self.topo.netns(node), "-s", "-j", "link", "show", "dev", port],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)[0]["stats64"]

    def sysfs(self, node: str, port: str, name: str) -> str:
        return subprocess.run(["ip", "netns", "exec", self.topo.netns(node), "cat", f"/sys/class/net/{port}/{name}"],
                              capture_output=True, text=True, check=True).stdout.strip()

    def snmpwalk(self, node: str, oid: str, v3: bool = False) -> dict[str, str]:
        """{oid suffix after `oid`: value} from snmpbulkwalk over the management network."""
        snmp = self.state()["snmp"]
        auth = snmp["net_snmp_v3_args"] if v3 else ["-v2c", "-c", snmp["community"]]
        proc = subprocess.run(["snmpbulkwalk", *auth, "-On", "-OQ", "-t", "2", "-r", "1",
                               self.topo.nodes[node].mgmt_address, oid], capture_output=True, text=True,
                              env={**os.environ, "MIBS": "",
                                   "SNMP_PERSISTENT_DIR": str(self.dir.run_dir / "snmp-client")})
        assert proc.returncode == 0, f"snmpbulkwalk {node} {oid}: {proc.stderr}"
        out = {}
        for line in proc.stdout.splitlines():
            if " = " in line and line.startswith(f".{oid}."):  # not "OID = No Such Object ..."
                key, _, value = line.partition(" = ")
                out[key[len(oid) + 2:]] = value.strip().strip('"')
        return out

    def sport_via(self, src: str, dst: str, spine: str, dport: int = 33434, start: int = 41000,
                  proto: str = "udp") -> int:
        return paths.sport_via(self.topo, src, dst, spine, proto, dport, start)

    def probe(self, src: str, dst: str, sports: list[int], **kw) -> dict[int, int]:
        return paths.udp_probe(self.topo, src, dst, sports, **kw)


def new_lab_dir() -> Path:
    """A fresh empty directory directly under /tmp: lldpd's own user must be able to reach its
    socket inside, which rules out pytest's tmp_path (its parent is mode 0700)."""
    return Path(tempfile.mkdtemp(prefix="nms-lab-test-"))


def build_lab(root: Path, prefix: str = PREFIX, mgmt: str = MGMT, southbound: str | None = None) -> Lab:
    d = LabDir(root)
    cleanup.remove(prefix, d)  # leftovers of a crashed earlier test run (same prefix)
    spec = Spec(link_rate_bps=RATE, mgmt_subnet=mgmt, prefix=prefix)
    lab_mod.up(d, spec if southbound is None else replace(spec, southbound=southbound))
    return Lab(d)
