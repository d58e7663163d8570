"""The lab's real gNMI target (lab/gnmi_target.py) as a process on 127.0.0.1, for the gNMI tests
(tests/test_gnmi_collector.py, the contract suite tests/test_collector_contract.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from nms.app.local_daemons import free_port

USER, PASSWORD = "nms", "gnmi-test-password-7Qx"


class Target:
    """`python -m lab.gnmi_target` as a process on 127.0.0.1."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None):
        self.tmp, self.args, self.port = tmp, args, port or free_port()
        (tmp / "password").write_text(PASSWORD)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Target:
        self.proc = subprocess.Popen([sys.executable, "-m", "lab.gnmi_target", "--listen", f"127.0.0.1:{self.port}",
                                      "--username", USER, "--password-file", str(self.tmp / "password"), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.tmp / "target.log", "ab"))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.tmp / "target.log").read_text()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise AssertionError("the gNMI target did not listen")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
