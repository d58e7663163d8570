"""The lab directory and its state.json: what was built, which processes run, the faults (ground truth).

state.json is plain JSON so tests, benchmarks and the host agent read it without this package.
Every change happens under an exclusive flock on <lab dir>/lock (the CLI and background flappers
both write), and is written to a temporary file then renamed, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from lab.sh import LabError
from lab.topology import Spec, Topology, plan

DEFAULT_LAB_DIR = "/run/nms-lab"
MARKER = ".nms-lab"  # present in every directory the lab created; `down` removes only such dirs
# What a lab directory may hold. A directory holding only these is adopted by `up` even without
# the marker (daemons of a crashed lab re-create nodes/*/ when they save state on SIGTERM).
LAB_ENTRIES = {MARKER, "state.json", "state.tmp", "lock", "nms.yaml", "nms.tmp", "api-token", "nodes", "run", "data",
               "tls"}


def now() -> dict:
    """A timestamp in both forms the ground truth carries."""
    ns = time.time_ns()
    return {"ns": ns, "iso": iso(ns)}


def iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat(timespec="microseconds")


class LabDir:
    def __init__(self, path: str | os.PathLike):
        self.root = Path(path).resolve()

    state = property(lambda self: self.root / "state.json")
    lock_file = property(lambda self: self.root / "lock")
    marker = property(lambda self: self.root / MARKER)
    config = property(lambda self: self.root / "nms.yaml")
    token = property(lambda self: self.root / "api-token")
    data = property(lambda self: self.root / "data")
    run_dir = property(lambda self: self.root / "run")

    def node(self, name: str) -> Path:
        return self.root / "nodes" / name

    def exists(self) -> bool:
        return self.state.exists()

    def foreign_entries(self) -> list[str]:
        """Entries a lab never creates: a directory with any of them is not ours to adopt or delete."""
        if not self.root.is_dir() or self.marker.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.name not in LAB_ENTRIES)

    def create(self) -> None:
        """Make the directory (or adopt an empty/previous-lab one); refuse a foreign non-empty one."""
        foreign = self.foreign_entries()
        if foreign:
            raise LabError(f"{self.root} exists and is not a lab directory (it holds {', '.join(foreign[:3])}); "
                           "choose another --lab-dir")
        for parent in self.root.parents:
            if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
                # lldpd drops to its own user (_lldpd), which must reach its socket in the lab dir
                raise LabError(f"{parent} is not searchable by other users, so lldpd could not reach its "
                               f"socket under {self.root}: choose a lab dir such as {DEFAULT_LAB_DIR}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.marker.write_text("created by `nms lab up`; removed by `nms lab down`\n")
        for sub in (self.run_dir, self.root / "nodes", self.data):
            sub.mkdir(exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        try:
            fh = open(self.lock_file, "a")
        except FileNotFoundError:  # never create the directory here: only `up` (create) does
            raise LabError(f"no lab at {self.root} (run `nms lab up`, or pass --lab-dir / NMS_LAB_DIR)") from None
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self) -> dict:
        try:
            return json.loads(self.state.read_text())
        except FileNotFoundError:
            raise LabError(f"no lab at {self.root} (run `nms lab up`, or pass --lab-dir / NMS_LAB_DIR)") from None
        except PermissionError:
            raise LabError(f"{self.state} is readable by root only (it holds SNMP credentials)") from None
        except json.JSONDecodeError as e:
            raise LabError(f"{self.state} is corrupt ({e}); `nms lab down` still cleans up") from None

    def save(self, state: dict) -> None:
        tmp = self.state.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds SNMP credentials
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state)

    @contextlib.contextmanager
    def update(self) -> Iterator[dict]:
        """Load, let the caller change, save: all under the lock."""
        with self.locked():
            state = self.load()
            yield state
            self.save(state)


def spec_of(state: dict) -> Spec:
    return Spec(**state["lab"]["spec"])


def topology_of(state: dict) -> Topology:
    return plan(spec_of(state))


def spec_dict(spec: Spec) -> dict:
    return asdict(spec)
