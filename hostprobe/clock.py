"""The agent's clock: CLOCK_REALTIME, optionally skewed by the fabric lab's emulated clock error.

Network namespaces share one kernel clock, so the lab records a per-host offset and drift and the
agent applies them to every timestamp it takes, kernel stamps included:

    t_host = t_real + offset_ns + drift_ppm * 1e-6 * (t_real - ref_ns)

(the same formula as nms.lab.faults.clock_error_ns, which scores clock sync against it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from hostprobe.config import LabClock

log = logging.getLogger(__name__)


class Clock:
    __slots__ = ("offset_ns", "drift_ppm", "ref_ns", "_state_file", "_host", "_mtime")

    def __init__(self, lab: LabClock | None = None, host: str = ""):
        self.offset_ns, self.drift_ppm, self.ref_ns = 0, 0.0, 0
        self._state_file = lab.state_file if lab else None
        self._host = (lab.host if lab and lab.host else host)
        self._mtime = 0.0
        if lab and lab.state_file is None:
            self.set(lab.offset_ns, lab.drift_ppm, lab.ref_ns)
        self.refresh()

    def set(self, offset_ns: int, drift_ppm: float, ref_ns: int) -> None:
        self.offset_ns, self.drift_ppm, self.ref_ns = int(offset_ns), float(drift_ppm), int(ref_ns)

    @property
    def emulated(self) -> bool:
        return bool(self.offset_ns or self.drift_ppm)

    def error_ns(self, real_ns: int) -> int:
        # the lab's own expression (nms.lab.faults.clock_error_ns), so scoring agrees to the ns
        return int(self.offset_ns + self.drift_ppm * 1e-6 * (real_ns - self.ref_ns))

    def host(self, real_ns: int) -> int:
        """A real (kernel or user) timestamp as this host's clock reads it."""
        if not (self.offset_ns or self.drift_ppm):
            return real_ns
        return real_ns + int(self.offset_ns + self.drift_ppm * 1e-6 * (real_ns - self.ref_ns))

    def now(self) -> int:
        return self.host(time.time_ns())

    def refresh(self) -> bool:
        """Follow the lab's state file (cheap when unchanged); True when the emulation changed."""
        if self._state_file is None:
            return False
        try:
            mtime = os.stat(self._state_file).st_mtime
        except OSError:
            return False
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            entry = json.loads(Path(self._state_file).read_text()).get("clocks", {}).get(self._host)
        except (OSError, ValueError) as e:
            log.warning("lab clock: cannot read %s: %s", self._state_file, e)
            return False
        before = (self.offset_ns, self.drift_ppm, self.ref_ns)
        if entry:
            self.set(entry["offset_ns"], entry["drift_ppm"], entry["ref_ns"])
        else:
            self.set(0, 0.0, 0)
        changed = before != (self.offset_ns, self.drift_ppm, self.ref_ns)
        if changed:
            log.info("lab clock emulation: offset %d ns, drift %.3f ppm", self.offset_ns, self.drift_ppm)
        return changed
