"""Running-configuration snapshots and their diffs (the CLI collector's; the fabric audits read them).

Each snapshot is a `device_config` point (tag `device`): `sha256` and `lines` of the whole text,
`bytes`, `text` (at most TEXT_MAX bytes, cut at a line end; `truncated` says so), and `changed`:
whether the text differs from the previous snapshot of that device. When it does, a
`device_config_change` point follows with a unified diff (at most DIFF_MAX bytes,
`diff_truncated`), the lines `added` and `removed` (over the whole diff), and both hashes.

The previous snapshot is kept in memory only: the first snapshot after a restart is compared with
nothing (changed=false, no diff). The stored `sha256` of the last point tells a reader whether a
change happened across the restart.
"""

from __future__ import annotations

import difflib
import hashlib

from nms.records import GenericPoint
from nms.store.base import declare_fields

TEXT_MAX = 48 * 1024  # bytes of text stored (InfluxDB's string fields end at 64 KiB)
DIFF_MAX = 32 * 1024  # bytes of diff stored

# the stored types of these fields never depend on a value (nms.store.base)
declare_fields("device_config", {"sha256": "string", "lines": "integer", "bytes": "integer", "text": "string",
                                 "truncated": "boolean", "changed": "boolean"})
declare_fields("device_config_change", {"sha256": "string", "previous_sha256": "string", "added": "integer",
                                        "removed": "integer", "diff": "string", "diff_truncated": "boolean"})


def clip(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to at most `limit` UTF-8 bytes at a line end; and whether it was cut."""
    data = text.encode()
    if len(data) <= limit:
        return text, False
    head = data[:limit].decode("utf-8", "ignore")
    return head[:head.rfind("\n") + 1] or head, True


def unified_diff(device: str, old: str, new: str, old_sha: str, new_sha: str) -> tuple[str, int, int]:
    """The whole unified diff of two snapshots, and its added and removed line counts."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), fromfile=f"{device} {old_sha[:12]}",
                                      tofile=f"{device} {new_sha[:12]}", lineterm=""))
    body = lines[2:]  # after the ---/+++ header
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    return "\n".join(lines) + "\n", added, removed


class ConfigTracker:
    """The previous snapshot per device, and the points of a new one."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[str, str]] = {}  # device -> (sha256, text)

    def forget(self, device: str) -> None:
        self._previous.pop(device, None)

    def snapshot(self, device: str, text: str, ts: int) -> list[GenericPoint]:
        sha = hashlib.sha256(text.encode()).hexdigest()
        previous = self._previous.get(device)
        changed = previous is not None and previous[0] != sha
        stored, truncated = clip(text, TEXT_MAX)
        points = [GenericPoint(measurement="device_config", tags={"device": device}, ts=ts, fields={
            "sha256": sha, "lines": len(text.splitlines()), "bytes": len(text.encode()), "text": stored,
            "truncated": truncated, "changed": changed})]
        if changed:
            diff, added, removed = unified_diff(device, previous[1], text, previous[0], sha)
            diff, diff_truncated = clip(diff, DIFF_MAX)
            points.append(GenericPoint(measurement="device_config_change", tags={"device": device}, ts=ts, fields={
                "sha256": sha, "previous_sha256": previous[0], "added": added, "removed": removed, "diff": diff,
                "diff_truncated": diff_truncated}))
        self._previous[device] = (sha, text)
        return points
