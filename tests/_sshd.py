"""A real OpenSSH sshd for the CLI collector's tests, in a throwaway network namespace.

The "switch" is network namespace `nmsct-<pid>` with a private mount namespace (its own /run, and
/etc/passwd, /etc/shadow, /etc/group copies that add a password user `nmsmon`: nothing of the
host's files changes). In it run sshd (root may log in with the test's key only; `nmsmon` with
its password) and, when started, lldpd, whose neighbour is a second namespace `nmsct-<pid>-p` running lldpd on
the other end of a veth pair (`swp1` <-> `eth0`). The collector reaches sshd over a veth pair
from the root namespace, a /30 of 198.18.254.0/24 free at the time: .1 here, .2 there (RFC 2544
benchmarking range; 198.18.242-253.0/24 are the labs'). No traffic leaves these namespaces.

Everything lives in its own temporary directory; stop() kills only the processes it started and
deletes only the namespaces it made. Needs root, sshd, lldpd, unshare and nsenter.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NET, PORT = ipaddress.ip_network("198.18.254.0/24"), 2222  # a free /30 of it per box
USER, PASSWORD = "nmsmon", "nms-test-password-1"
PEER_NAME = "nmsct-peer"
PREFIX = "nmsct-"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd as root)"
    missing = [t for t in (SSHD, "ssh-keygen", "lldpd", "unshare", "nsenter", "openssl", "ip")
               if not shutil.which(t) and not Path(t).exists()]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install openssh-server lldpd util-linux openssl iproute2)"
    return None


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=30, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit status {proc.returncode}: {proc.stderr.strip()}")
    return proc


def keygen(path: Path, passphrase: str = "") -> Path:
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "nms-test", "-f", str(path))
    return path


def cleanup_stale() -> None:
    """Namespaces of an earlier run of these tests whose process is gone (a crash, a kill -9)."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        pid = name[len(PREFIX):].split("-")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            sh("ip", "netns", "del", name, check=False)


class SshBox:
    def __init__(self) -> None:
        tag = os.getpid()
        self.ns, self.peer_ns, self.host_if = f"{PREFIX}{tag}", f"{PREFIX}{tag}-p", f"nmsct{tag % 10**8}h"
        self.dir = Path(tempfile.mkdtemp(prefix="nms-sshd-"))
        self.dir.chmod(0o755)  # the password user's home is in it
        self.host_key = self.dir / "host_key"
        self.client_key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.procs: dict[str, subprocess.Popen] = {}
        self.address = self.host_address = ""  # chosen in _network

    # -- the namespaces ----------------------------------------------------------------------------

    def start(self) -> SshBox:
        cleanup_stale()
        try:
            self._network()
            self._files()
            self._holder()
            self.start_sshd()
            self.procs["peer-lldpd"] = self._spawn("peer-lldpd", ["ip", "netns", "exec", self.peer_ns, "lldpd", "-d",
                                                                  "-u", str(self.dir / "peer.sock"), "-I", "eth0",
                                                                  "-O", str(self.dir / "peer-lldpd.conf")])
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        # a /30 no other box (another test run at the same time) uses: here .1, in the switch .2
        used = sh("ip", "-4", "-o", "addr", "show").stdout
        for subnet in random.sample(list(NET.subnets(new_prefix=30)), 64):
            if not any(f" {host}/" in used for host in subnet):
                self.host_address, self.address = str(subnet[1]), str(subnet[2])
                break
        else:
            raise RuntimeError(f"no free /30 left in {NET}")
        for ns in (self.ns, self.peer_ns):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "mgmt0", "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.address}/30", "dev", "mgmt0")
        sh("ip", "-n", self.ns, "link", "set", "mgmt0", "up")
        sh("ip", "-n", self.ns, "link", "add", "swp1", "type", "veth", "peer", "name", "eth0", "netns", self.peer_ns)
        sh("ip", "-n", self.ns, "link", "set", "swp1", "up")
        sh("ip", "-n", self.peer_ns, "link", "set", "eth0", "up")
        # administratively down (a veth pair: the kernel here may lack the dummy driver)
        sh("ip", "-n", self.ns, "link", "add", "down0", "type", "veth", "peer", "name", "down1")

    def _files(self) -> None:
        d = self.dir
        keygen(self.host_key)
        keygen(self.client_key)
        (d / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        self.trust_host_key()
        home = d / "home"
        home.mkdir()
        os.chown(home, 4242, 4242)
        crypted = sh("openssl", "passwd", "-6", "-stdin", input=PASSWORD).stdout.strip()
        root_home = d / "root"  # not the host's /root: its shell start-up files are not the switch's
        root_home.mkdir(mode=0o700)
        passwd = "".join(f"root:x:0:0:root:{root_home}:/bin/bash\n" if line.startswith("root:") else line
                         for line in Path("/etc/passwd").read_text().splitlines(keepends=True))
        (d / "passwd").write_text(passwd + f"{USER}:x:4242:4242::{home}:/bin/sh\n")
        (d / "shadow").write_text(Path("/etc/shadow").read_text() + f"{USER}:{crypted}:19000:0:99999:7:::\n")
        (d / "group").write_text(Path("/etc/group").read_text() + f"{USER}:x:4242:\n")
        (d / "shadow").chmod(0o600)
        (d / "sshd_config").write_text("\n".join([
            f"Port {PORT}", f"ListenAddress {self.address}", f"HostKey {self.host_key}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication yes", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PrintMotd no", "PrintLastLog no", "UseDNS no", "LogLevel VERBOSE", ""]))
        (d / "lldpd.conf").write_text("configure system hostname nmsct-sw\nconfigure lldp portidsubtype ifname\n")
        (d / "peer-lldpd.conf").write_text(f"configure system hostname {PEER_NAME}\n"
                                           "configure lldp portidsubtype ifname\nconfigure lldp tx-interval 1\n")

    def _holder(self) -> None:
        """The switch's mount namespace, held by its lldpd: a private /run (lldpd's default socket,
        sshd's privilege separation directory) and the passwd/shadow/group copies."""
        d = self.dir
        script = " && ".join([
            "mount -t tmpfs nmsct /run", "mkdir -p /run/sshd /run/lldpd /run/nmsct-ready",
            *(f"mount --bind {d / name} /etc/{name}" for name in ("passwd", "shadow", "group")),
            "exec sleep infinity"])
        self.procs["holder"] = self._spawn("holder", ["ip", "netns", "exec", self.ns, "unshare", "--mount",
                                                      "--propagation", "private", "sh", "-c", script])
        for _ in range(100):  # the holder has its own mount namespace once /run is mounted
            if self._in_box("test", "-d", "/run/nmsct-ready").returncode == 0:
                return
            if self.procs["holder"].poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the switch namespace did not come up: {self.log('holder')}")

    def _enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.procs["holder"].pid), "-m", "-n"]

    def _in_box(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return sh(*self._enter(), *args, check=False, **kw)

    def start_lldpd(self) -> None:
        """lldpd on the switch (default socket, in its private /run), so that plain `lldpctl` works."""
        self.procs["lldpd"] = self._spawn("lldpd", [*self._enter(), "lldpd", "-d", "-I", "swp1",
                                                    "-O", str(self.dir / "lldpd.conf")])

    def stop_lldpd(self) -> None:
        _end(self.procs.pop("lldpd", None))

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "ab")
        try:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    # -- sshd --------------------------------------------------------------------------------------

    def start_sshd(self) -> None:
        check = self._in_box(SSHD, "-t", "-f", str(self.dir / "sshd_config"))
        if check.returncode != 0:
            raise RuntimeError(f"sshd -t: {check.stderr.strip()}")
        self.procs["sshd"] = self._spawn("sshd", [*self._enter(), SSHD, "-D", "-e",
                                                  "-f", str(self.dir / "sshd_config")])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, PORT), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return
            except OSError:
                pass
            if self.procs["sshd"].poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {self.log('sshd')}")

    def stop_sshd(self) -> None:
        """sshd and its per-connection processes (they run in sessions of their own)."""
        proc = self.procs.pop("sshd", None)
        if proc is not None:
            for pid in _descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        _end(proc)

    def rekey(self) -> None:
        """A new host key, sshd restarted: what a re-installed (or impersonated) device looks like."""
        self.stop_sshd()
        keygen(self.host_key)
        self.start_sshd()

    def trust_host_key(self) -> None:
        """known_hosts holds sshd's current host key, under "[address]:port" (not port 22)."""
        kind, key = Path(f"{self.host_key}.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[{self.address}]:{PORT} {kind} {key}\n")

    def host_fingerprint(self) -> str:
        return sh("ssh-keygen", "-l", "-f", f"{self.host_key}.pub").stdout.split()[1]

    # -- the switch's state ------------------------------------------------------------------------

    def run(self, *args: str) -> str:
        """A command in the switch's namespaces (its /sys, its interfaces)."""
        proc = self._in_box(*args)
        if proc.returncode != 0:
            raise RuntimeError(f"{args}: {proc.stderr}")
        return proc.stdout

    def lo_counters(self) -> dict[str, int]:
        stats = "/sys/class/net/lo/statistics"
        names = ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets"]
        values = self.run("sh", "-c", " ".join(f"cat {stats}/{n};" for n in names)).split()
        return dict(zip(names, map(int, values)))

    def udp_on_lo(self, packets: int, size: int) -> None:
        """`packets` UDP datagrams of `size` payload bytes to 127.0.0.1 in the switch, received there."""
        code = ("import socket; r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(('127.0.0.1', 0)); "
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                f"for _ in range({packets}): s.sendto(b'x' * {size}, r.getsockname()); r.recv(65536)")
        self.run(sys.executable, "-c", code)

    def fake_command(self, path: str, output: str = "", script: str | None = None) -> None:
        """Replace the command at `path` on the switch (its mount namespace only) by a shell script:
        `script`, or one that prints `output` and succeeds."""
        fake = self.dir / f"fake-{Path(path).name}"
        fake.write_text("#!/bin/sh\n" + (script if script is not None else f"cat <<'EOF'\n{output}\nEOF") + "\n")
        fake.chmod(0o755)
        self.run("mount", "--bind", str(fake), path)

    def restore_command(self, path: str) -> None:
        self.run("umount", "--lazy", path)  # a command still running from it keeps it busy

    # -- teardown ----------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stop_sshd()
        for name in ("peer-lldpd", "lldpd", "holder"):
            _end(self.procs.pop(name, None))
        for ns in (self.ns, self.peer_ns):
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.host_if, check=False)  # gone with its peer's namespace already
        shutil.rmtree(self.dir, ignore_errors=True)


def _end(proc: subprocess.Popen | None) -> None:
    """SIGTERM to the process group this test started (its session), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
