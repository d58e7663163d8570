"""Running the tools the lab drives (ip, tc, nft, snmpd, ...): argument lists only, clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

INSTALL_HINT = "apt-get install snmpd snmp lldpd iperf3 nftables iproute2"
# Binaries `nms lab up` needs; `traffic` additionally needs iperf3 (checked there too).
REQUIRED = ("ip", "tc", "nft", "snmpd", "snmpget", "snmpbulkwalk", "lldpd", "lldpcli", "iperf3")


class LabError(Exception):
    """A lab operation failed; the message says what and, where possible, how to fix it."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the fabric lab needs root (network namespaces, veth links, tc, nftables): "
            "run it with sudo, e.g. `sudo nms lab up`"
        )


def require_binaries(names: Sequence[str] = REQUIRED) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise LabError(f"missing programs: {', '.join(missing)}; install them with `{INSTALL_HINT}`")


def run(args: Sequence[str], *, check: bool = True, input: str | None = None,
        timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command; on failure raise LabError with the command line and its stderr."""
    try:
        proc = subprocess.run(list(args), input=input, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except FileNotFoundError:
        raise LabError(f"{args[0]} not found; install it with `{INSTALL_HINT}`") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout:.0f}s: {' '.join(args)}") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LabError(f"command failed ({proc.returncode}): {' '.join(args)}\n{detail}")
    return proc


def ip_batch(ns: str | None, lines: Sequence[str], *, force: bool = False) -> None:
    """Run many `ip` commands in one process (one netlink session: far faster than one exec each).

    `force` keeps going past failing lines (used for deletions that may already be done)."""
    if not lines:
        return
    args = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
    run(args, input="\n".join(lines) + "\n", check=not force)


def tc_batch(ns: str, lines: Sequence[str]) -> None:
    if lines:
        run(["tc", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n")


def in_ns(ns: str, args: Sequence[str]) -> list[str]:
    """The argument list that runs `args` inside network namespace `ns`."""
    return ["ip", "netns", "exec", ns, *args]


def sysctl(ns: str, settings: dict[str, str | int]) -> None:
    run(in_ns(ns, ["sysctl", "-q", "-w", *(f"{k}={v}" for k, v in settings.items())]))
