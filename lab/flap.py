"""Background link flapper: `python -m lab.flap LAB_DIR FAULT_ID` (started by faults.inject).

Runs in its own session so it outlives the CLI command; `nms lab heal` / `nms lab down` kill it
by the pid file under <lab dir>/run and restore the link themselves, so dying at any point is safe.
Each transition is appended to the fault's `events` (ground truth for flap detection).
"""

from __future__ import annotations

import sys
import time

from lab.faults import link_down
from lab.state import LabDir, now, topology_of


def _transition(lab: LabDir, fault_id: str, created_ns: int, down: bool) -> bool:
    """Apply one transition; False if the fault was healed meanwhile (or its lab is gone)."""
    with lab.update() as state:
        fault = next((f for f in state["faults"] if f["id"] == fault_id), None)
        if state["lab"]["created_ns"] != created_ns or fault is None or not fault["active"]:
            return False
        p = fault["params"]
        topo = topology_of(state)
        link_down(topo, state, topo.link(p["link"]), p["mode"], down=down)
        fault["events"].append({"state": "down" if down else "up", **now()})
    return True


def main(lab_root: str, fault_id: str) -> None:
    lab = LabDir(lab_root)
    with lab.locked():
        state = lab.load()
    p = next(f for f in state["faults"] if f["id"] == fault_id)["params"]
    created = state["lab"]["created_ns"]
    cycle = 0
    while p["count"] == 0 or cycle < p["count"]:
        if not _transition(lab, fault_id, created, down=True):
            return
        time.sleep(p["down_for"])
        if not _transition(lab, fault_id, created, down=False):
            return
        cycle += 1
        if p["count"] == 0 or cycle < p["count"]:
            time.sleep(p["period"] - p["down_for"])
    with lab.update() as state:  # finished on its own: the fault ends with the last "up"
        fault = next(f for f in state["faults"] if f["id"] == fault_id)
        last = fault["events"][-1]
        fault.update(active=False, end_ns=last["ns"], end_iso=last["iso"])
    (lab.run_dir / f"flap-{fault_id}.pid").unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
