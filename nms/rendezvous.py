"""Rendezvous (highest random weight) hashing: which member owns a key (a switch, a partition).

Every member computes the same answer from the same set of live members, with no coordinator: a key
goes to the member with the highest weight hash(member, key). Adding a member moves to it only the
keys it now wins (about 1/n of them); removing one moves only the keys it owned, each to its
runner-up. Nothing else moves (tests/test_rendezvous.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(member: str, key: str) -> int:
    """A 64-bit weight of (member, key), the same in every process and Python version."""
    digest = hashlib.blake2b(f"{member}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(key: str, members: Iterable[str]) -> str | None:
    """The member that owns `key` (ties, never seen in practice, go to the greater name); None with no
    members."""
    return max(members, key=lambda m: (weight(m, key), m), default=None)


def assign(keys: Iterable[str], members: Iterable[str]) -> dict[str, set[str]]:
    """member -> the keys it owns; every member present (an empty set when it owns nothing)."""
    live = sorted(set(members))
    shares: dict[str, set[str]] = {m: set() for m in live}
    for key in keys:
        if (m := owner(key, live)) is not None:
            shares[m].add(key)
    return shares
