"""Test harness of the NCCL plugin: the C driver (built with the system compiler), the built
plugin, and a Unix datagram socket standing where the agent's would be."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from nccl_plugin import library_path
from nccl_plugin.decode import Batch, decode_batch

HERE = Path(__file__).resolve().parent
PLUGIN_ENV = ("NMS_NCCL_SOCKET", "NMS_NCCL_RING_SIZE", "NMS_NCCL_SLOTS", "NMS_NCCL_EVENT_MASK", "NMS_NCCL_FLUSH_MS",
              "NMS_NCCL_SEND_WAIT_MS", "NMS_JOB_ID_VAR", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
              "TORCHELASTIC_RUN_ID")


def build_driver(out_dir: Path) -> Path:
    exe = out_dir / "nccl-driver"
    subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(exe),
                    str(HERE / "driver.c"), "-ldl"], check=True, capture_output=True, text=True)
    return exe


def short_dir() -> Path:
    """A directory for sockets: Unix socket paths are limited to 107 bytes, pytest's are long."""
    return Path(tempfile.mkdtemp(prefix="nccl-", dir="/tmp"))


def run_driver(driver: Path, version: str | int, *args: str | int, timeout: float = 120,
               **env: str) -> dict[str, str]:
    """Runs the driver against the built plugin; its key=value lines as a dict."""
    base = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV}
    proc = subprocess.run([str(driver), str(library_path()), str(version), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**base, **env})
    if proc.returncode != 0:
        raise AssertionError(f"driver exited {proc.returncode}: {proc.stderr}")
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


class Sink:
    """A bound datagram socket; `reading=False` never reads it (a stalled agent)."""

    def __init__(self, path: Path, reading: bool = True, rcvbuf: int | None = None):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        else:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(str(path))
        self.datagrams: list[bytes] = []
        self._halt = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        if reading:
            self.thread.start()

    def _read(self) -> None:
        self.sock.settimeout(0.05)
        while not self._halt.is_set():
            try:
                self.datagrams.append(self.sock.recv(1 << 17))
            except TimeoutError:
                continue

    def drain(self) -> None:
        """Reads what is queued (the thread is stopped first)."""
        self._halt.set()
        if self.thread.is_alive():
            self.thread.join()
        self.sock.settimeout(0.2)
        while True:
            try:
                self.datagrams.append(self.sock.recv(1 << 17))
            except TimeoutError:
                return

    def batches(self) -> list[Batch]:
        self.drain()
        return [decode_batch(d) for d in self.datagrams]

    def close(self) -> None:
        self._halt.set()
        if self.thread.is_alive():
            self.thread.join()
        self.sock.close()
        shutil.rmtree(self.path.parent, ignore_errors=True)
