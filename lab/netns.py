"""Enter a named network namespace from this process (Python 3.11 has no os.setns).

setns(2) switches only the calling thread; sockets opened inside keep their namespace after we
switch back, so one process can hold sockets in many namespaces (used by probe.py), and
/proc/sys/net opened inside shows that namespace's sysctls (used by builder.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / ns, os.O_RDONLY)
    except FileNotFoundError:
        os.close(own)
        raise OSError(f"network namespace {ns} does not exist") from None
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def write_sysctls(ns: str, settings: dict[str, str | int]) -> None:
    """Set net.* sysctls inside `ns` by writing /proc/sys (no process per namespace)."""
    with entered(ns):
        for key, value in settings.items():
            Path("/proc/sys", *key.split(".")).write_text(f"{value}\n")


def inode(path: str | os.PathLike) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None
