"""Agent command arguments both sides check alike: the service's API before it stores a command,
the agent (hostprobe/agent.py) before it acts on one."""

from __future__ import annotations

import re
from typing import Any, TypeGuard

MAX_RATE = 10_000.0  # exchanges/s per path (set_rate, focus)
MAX_FOCUS_S = 300.0
MAX_FOCUS_PATHS = 4096  # the service's own focus commands (correlator: at most 512 paths a link)
PATH_ID = r"^[0-9A-Za-z_.:-]{1,64}$"  # the agents' are 16 hex digits (hostprobe/trace.py path_id)


def rate_problem(rate: Any) -> str | None:
    """Why `rate` is not a probe rate (exchanges/s per path; set_rate and focus), None when it is."""
    if not _number(rate) or not 0 < rate <= MAX_RATE:
        return f"exchanges/s per path, 0 < rate <= {MAX_RATE:g}"
    return None


def focus_args_problem(args: dict[str, Any], max_paths: int = MAX_FOCUS_PATHS) -> str | None:
    """Why `focus` args are unusable (None when they are fine): paths, a list of path ids; rate,
    exchanges/s per path; for_s, how long."""
    paths, rate, for_s = args.get("paths"), args.get("rate"), args.get("for_s")
    if not isinstance(paths, list) or not paths or len(paths) > max_paths \
            or not all(isinstance(p, str) and re.fullmatch(PATH_ID, p) for p in paths):
        return f"args.paths must be a list of 1 to {max_paths} path ids"
    if reason := rate_problem(rate):
        return f"args.rate must be {reason}"
    if not _number(for_s) or not 0 < for_s <= MAX_FOCUS_S:
        return f"args.for_s must be seconds, 0 < for_s <= {MAX_FOCUS_S:g}"
    return None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
