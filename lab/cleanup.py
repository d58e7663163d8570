"""Remove a lab completely, from its name prefix alone, even after a crash left no state file.

Order matters: processes hold namespaces alive (and with them their veths, whose root-namespace
ends would then linger), so kill every process inside the lab's namespaces first, plus the
background helpers recorded by pid file, then delete the namespaces, then the root-namespace
management bridge and veths, then the lab directory.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from lab import services, sh
from lab.netns import NETNS_DIR
from lab.state import LabDir


@dataclass
class Leftovers:
    namespaces: list[str] = field(default_factory=list)
    root_links: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    helper_pids: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.root_links or self.pids or self.helper_pids)


def lab_namespaces(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def root_links(prefix: str) -> list[str]:
    out = sh.run(["ip", "-j", "link", "show"]).stdout
    return sorted(i["ifname"] for i in json.loads(out or "[]") if i["ifname"].startswith(prefix))


def namespace_pids(ns: str) -> list[int]:
    proc = sh.run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in proc.stdout.split()]


def helper_pids(lab: LabDir) -> list[int]:
    """Background helpers of this lab that run in the root namespace (flappers), found by command
    line rather than pid file, so they are found even when the lab directory was wiped."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lab.flap" in argv and str(lab.root).encode() in argv:
            pids.append(int(proc.name))
    return pids


def scan(prefix: str, lab: LabDir) -> Leftovers:
    found = Leftovers(lab_namespaces(prefix), root_links(prefix), helper_pids=helper_pids(lab))
    for ns in found.namespaces:
        found.pids += namespace_pids(ns)
    return found


def remove(prefix: str, lab: LabDir, keep_dir: bool = False) -> Leftovers:
    """Tear everything down; returns what was found (empty if there was nothing)."""
    found = scan(prefix, lab)
    services.kill(found.helper_pids)
    services.kill(found.pids)
    for ns in found.namespaces:  # anything that slipped in meanwhile
        services.kill(namespace_pids(ns), grace=0.5)
    sh.ip_batch(None, [f"netns del {ns}" for ns in found.namespaces], force=True)
    # Deleting a namespace destroys its veths and so their root-side peers; delete what is left
    # (the bridge, and veths whose namespace vanished in a crash) by name.
    sh.ip_batch(None, [f"link del {name}" for name in root_links(prefix)], force=True)
    if not keep_dir and lab.root.is_dir() and not lab.foreign_entries():
        shutil.rmtree(lab.root, ignore_errors=True)
    return found
