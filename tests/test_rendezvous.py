"""Rendezvous hashing (nms/rendezvous.py): the same owners everywhere, balance, and minimal movement
when a member joins or leaves."""

from __future__ import annotations

from nms.rendezvous import assign, owner, weight

SWITCHES = [f"leaf-{i:04d}" for i in range(1000)]
MEMBERS = ["poll-a", "poll-b", "poll-c", "poll-d"]


def test_the_owner_does_not_depend_on_the_order_of_members_and_weights_are_fixed():
    assert owner("leaf-0001", MEMBERS) == owner("leaf-0001", list(reversed(MEMBERS)))
    # a fixed value: every process and Python version must compute the same owners
    assert weight("poll-a", "leaf-0001") == int.from_bytes(
        __import__("hashlib").blake2b(b"poll-a\x00leaf-0001", digest_size=8).digest(), "big")
    assert owner("leaf-0001", []) is None


def test_shares_are_disjoint_cover_every_switch_and_are_balanced_within_15_percent():
    shares = assign(SWITCHES, MEMBERS)
    assert set(shares) == set(MEMBERS)
    assert sum(len(s) for s in shares.values()) == len(SWITCHES)
    assert set().union(*shares.values()) == set(SWITCHES)
    fair = len(SWITCHES) / len(MEMBERS)
    # 1000 keys over 4 members: binomial sd ~13.7 (5.5 % of 250); 15 % is about 2.7 sd
    for member, share in shares.items():
        assert abs(len(share) - fair) <= 0.15 * fair, (member, len(share))


def test_a_member_leaving_moves_only_its_own_switches():
    before = assign(SWITCHES, MEMBERS)
    after = assign(SWITCHES, [m for m in MEMBERS if m != "poll-c"])
    for member in ("poll-a", "poll-b", "poll-d"):
        assert before[member] <= after[member]  # kept everything it had
    moved = {s for m in after for s in after[m] - before[m]}
    assert moved == before["poll-c"]


def test_a_member_joining_takes_about_its_share_and_only_from_the_others():
    before = assign(SWITCHES, MEMBERS)
    after = assign(SWITCHES, [*MEMBERS, "poll-e"])
    for member in MEMBERS:
        assert after[member] <= before[member]  # lost some, gained none
    assert set().union(*(before[m] - after[m] for m in MEMBERS)) == after["poll-e"]
    assert abs(len(after["poll-e"]) - 200) <= 30  # 1/5 of 1000, within 15 %


def test_balance_holds_for_member_names_that_differ_only_at_the_end():
    members = [f"poll-host-{i}" for i in range(8)]
    shares = assign(SWITCHES, members)
    assert min(len(s) for s in shares.values()) >= 0.7 * len(SWITCHES) / 8
    assert max(len(s) for s in shares.values()) <= 1.3 * len(SWITCHES) / 8
