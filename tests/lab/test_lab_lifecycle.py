"""Lifecycle: refusals, idempotent up, service restart, and `down` leaving nothing, even after a crash.

These tests build their own labs (prefix nmsu-, 198.18.251.0/24), one at a time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_helpers import REPO, Lab, build_lab, new_lab_dir, skip_reason

from lab import cleanup, services
from lab.netns import NETNS_DIR, inode

PREFIX = "nmsu-"
MGMT = "198.18.251.0/24"

pytestmark = [pytest.mark.root, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def nms_lab(*args: str, env: dict | None = None, user: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lab.cli", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env or os.environ, timeout=120)


def lab_footprint(lab: Lab) -> dict:
    """Everything of the lab the system can show: namespaces, root links, processes, files."""
    ns_inodes = {inode(NETNS_DIR / ns) for ns in cleanup.lab_namespaces(PREFIX)}
    procs = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            status = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (p / "cmdline").read_bytes()
            in_lab = inode(p / "ns" / "net") in ns_inodes or str(lab.dir.root).encode() in cmdline
        except OSError:
            continue
        if in_lab and status != "Z" and int(p.name) != os.getpid():  # zombies wait for init to reap them
            procs.append(int(p.name))
    return {"namespaces": cleanup.lab_namespaces(PREFIX), "root_links": cleanup.root_links(PREFIX),
            "processes": procs, "dir": lab.dir.root.exists()}


@pytest.fixture
def fresh_lab():
    handle = build_lab(new_lab_dir(), PREFIX, MGMT)
    yield handle
    cleanup.remove(PREFIX, handle.dir)


def test_refuses_without_root_and_names_missing_programs():
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run the CLI as an unprivileged user")
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", "1"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this Python cannot run as user nobody (installed under a private home)")
    out = nms_lab("up", "--lab-dir", "/tmp/nms-lab-never", user=65534)
    assert out.returncode == 1 and "needs root" in out.stderr and "Traceback" not in out.stderr
    assert not Path("/tmp/nms-lab-never").exists()
    out = nms_lab("up", "--lab-dir", "/tmp/nms-lab-never", env={**os.environ, "PATH": "/nonexistent"})
    assert out.returncode == 1 and "missing programs: ip, tc, nft, snmpd" in out.stderr
    assert "apt-get install snmpd snmp lldpd iperf3 nftables iproute2" in out.stderr.replace("\n", "")


def test_up_is_idempotent_and_restarts_dead_services(fresh_lab):
    lab = fresh_lab
    args = ["up", "--lab-dir", str(lab.dir.root), "--prefix", PREFIX, "--mgmt-subnet", MGMT]
    pids = {n: dict(i["pids"]) for n, i in lab.state()["nodes"].items()}
    again = nms_lab(*args)
    assert again.returncode == 0 and "already up" in again.stdout
    assert {n: i["pids"] for n, i in lab.state()["nodes"].items()} == pids  # nothing rebuilt or restarted
    os.kill(pids["leaf2"]["lldpd"], signal.SIGKILL)
    assert nms_lab(*args).returncode == 0
    state = lab.status()
    assert state["nodes"]["leaf2"]["pids"]["lldpd"] != pids["leaf2"]["lldpd"]
    assert all(all(n["services"].values()) for n in state["nodes"].values())
    other = nms_lab(*args, "--spines", "3")
    assert other.returncode == 1 and "a different lab" in other.stderr


def test_down_leaves_nothing(fresh_lab):
    lab = fresh_lab
    lab.fault("flap", "leaf1-spine1", "--period", "0.5", "--count", "0")  # a background helper
    lab.fault("loss", "leaf2-spine2", "--percent", "5")
    load = subprocess.Popen([sys.executable, "-m", "lab.cli", "traffic", "--lab-dir", str(lab.dir.root),
                             "all-to-all", "--duration", "30", "--rate", "1M"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # iperf3 servers and clients are running inside the hosts
    before = lab_footprint(lab)
    assert len(before["namespaces"]) == 9 and before["root_links"] and len(before["processes"]) > 20
    down = nms_lab("down", "--lab-dir", str(lab.dir.root))
    assert down.returncode == 0 and "removed 9 namespaces" in down.stdout
    load.wait(timeout=30)
    assert lab_footprint(lab) == {"namespaces": [], "root_links": [], "processes": [], "dir": False}
    again = nms_lab("down", "--lab-dir", str(lab.dir.root), "--prefix", PREFIX)
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def _wipe(root):
    # the daemons still running keep writing logs and sockets into the lab directory, so one rmtree can race
    # a new file; a crash that wipes the directory is what is simulated, so try again until it is gone
    for _ in range(20):
        shutil.rmtree(root, ignore_errors=True)
        if not root.exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"{root} could not be removed")


def test_down_and_up_recover_from_a_crash(fresh_lab):
    lab = fresh_lab
    lab.fault("flap", "leaf1-spine1", "--period", "0.5", "--count", "0")
    for n in ("spine1", "host2"):  # a crash: some daemons gone, the lab directory wiped
        services.kill(list(lab.state()["nodes"][n]["pids"].values()))
    flapper = lab.dir.run_dir / next(p.name for p in lab.dir.run_dir.glob("flap-*.pid"))
    flap_pid = int(flapper.read_text())
    _wipe(lab.dir.root)
    time.sleep(0.5)  # the flapper, its lab gone, fails on its next transition and exits
    # `up` finds the leftovers by prefix, clears them and builds a fresh lab
    up = nms_lab("up", "--lab-dir", str(lab.dir.root), "--prefix", PREFIX, "--mgmt-subnet", MGMT)
    assert up.returncode == 0 and "built in" in up.stdout, up.stderr
    assert all(all(n["services"].values()) for n in lab.status()["nodes"].values())
    # now the crash again, worse: no state at all, and `down` must work from the prefix alone
    (lab.dir.root / "state.json").unlink()
    down = nms_lab("down", "--lab-dir", str(lab.dir.root), "--prefix", PREFIX)
    assert down.returncode == 0 and "removed 9 namespaces" in down.stdout
    assert lab_footprint(lab) == {"namespaces": [], "root_links": [], "processes": [], "dir": False}
    cmdline = Path(f"/proc/{flap_pid}/cmdline")
    assert not cmdline.exists() or b"lab.flap" not in cmdline.read_bytes()  # the old flapper is gone
