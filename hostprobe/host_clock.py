"""The agent's clock: CLOCK_REALTIME, optionally skewed by the fabric lab's emulated clock error.

Network namespaces share one kernel clock, so the lab records a per-host offset and drift and the
agent applies them to every timestamp it takes, kernel stamps included:

    t_host = t_real + offset_ns + drift_ppm * 1e-6 * (t_real - ref_ns)

(the same formula as lab.faults.clock_error_ns, which scores clock sync against it).

Clock steps: chrony/ntpd may step CLOCK_REALTIME. CLOCK_MONOTONIC is slewed with it but never
stepped, so a change in realtime - monotonic is a step. `check_step` watches that difference
(and the lab's emulation changing offset or drift, the lab's equivalent); each step bumps `epoch`,
which clock sync uses to keep the two time bases apart and which replies carry to the peers.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from hostprobe.config import LabClock

log = logging.getLogger(__name__)

STEP_THRESHOLD_NS = 50_000  # reading the two clocks back to back varies by far less


def _realtime_minus_monotonic() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, read tightly (retried when preempted between reads)."""
    best = None
    for _ in range(3):
        r1 = time.time_ns()
        m = time.monotonic_ns()
        r2 = time.time_ns()
        if best is None or r2 - r1 < best[0]:
            best = (r2 - r1, (r1 + r2) // 2 - m)
        if best[0] < 20_000:
            break
    return best[1]


class Clock:
    __slots__ = ("offset_ns", "drift_ppm", "ref_ns", "_state_file", "_host", "_mtime", "epoch", "_base",
                 "step_threshold_ns")

    def __init__(self, lab: LabClock | None = None, host: str = ""):
        self.offset_ns, self.drift_ppm, self.ref_ns = 0, 0.0, 0
        self._state_file = lab.state_file if lab else None
        self._host = (lab.host if lab and lab.host else host)
        self._mtime = 0.0
        if lab and lab.state_file is None:
            self.set(lab.offset_ns, lab.drift_ppm, lab.ref_ns)
        self.refresh()
        self.epoch = 0
        self.step_threshold_ns = STEP_THRESHOLD_NS
        self._base = _realtime_minus_monotonic()

    def check_step(self) -> int:
        """Look for a step of CLOCK_REALTIME (or of the lab emulation) since the last call; returns
        its size in ns (0: none) and bumps `epoch` when there was one."""
        base = _realtime_minus_monotonic()
        step, self._base = base - self._base, base
        before = (self.offset_ns, self.drift_ppm)
        emulation_changed = self.refresh()
        if emulation_changed:
            step += self.offset_ns - before[0]
        if abs(step) > self.step_threshold_ns or emulation_changed:
            self.epoch += 1
            log.warning("clock step of %+.3f ms detected (epoch %d): clock sync drops the exchanges around it",
                        step / 1e6, self.epoch)
            return step or 1
        return 0

    def set(self, offset_ns: int, drift_ppm: float, ref_ns: int) -> None:
        self.offset_ns, self.drift_ppm, self.ref_ns = int(offset_ns), float(drift_ppm), int(ref_ns)

    @property
    def emulated(self) -> bool:
        return bool(self.offset_ns or self.drift_ppm)

    def error_ns(self, real_ns: int) -> int:
        # the lab's own expression (lab.faults.clock_error_ns), so scoring agrees to the ns
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
