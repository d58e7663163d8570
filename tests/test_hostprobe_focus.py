"""Focused probing (the `focus` agent command): the paths a service suspects of loss are probed at a
higher rate for a while, then at the agent's rate again; the others never change pace."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

from hostprobe.agent import Agent
from hostprobe.config import ProbeSettings
from hostprobe.prober import WINDOW_NS, LocalNic, PathState, Prober, Target


class Clock:
    epoch = 0

    def now(self) -> int:
        return 1_700_000_000 * WINDOW_NS


class Sock:
    def __init__(self, port: int):
        self.port, self.sent, self.reply_tag = port, 0, 0

    def send(self, payload: bytes, dest, token=None, ttl=None) -> bool:
        self.sent += 1
        return True


def prober_with(*path_ids: str) -> tuple[Prober, dict[str, Sock]]:
    settings = ProbeSettings(key="focus-test-key-0123456789", rate=10)
    prober = Prober("h1", [], settings, b"k" * 16, 1, Clock(), defaultdict(int), lambda kind, r: None)
    target = Target(LocalNic("eth0", "10.0.0.1", []), "h2", "eth0", "10.0.0.2", 33434)
    prober.targets[target.key] = target
    socks = {}
    for i, pid in enumerate(path_ids):
        socks[pid] = Sock(40000 + i)
        target.paths[pid] = path = PathState(target, socks[pid], pid)
        prober._schedule(path, time.monotonic())
    return prober, socks


def sent_per_second(prober: Prober, socks: dict[str, Sock], start: float, seconds: int) -> dict[str, list[int]]:
    """Drive the send loop every 10 ms of a simulated clock; exchanges sent per path in each second."""
    out: dict[str, list[int]] = {pid: [] for pid in socks}
    for s in range(seconds):
        before = {pid: sock.sent for pid, sock in socks.items()}
        for tick in range(100):
            prober.send_due(start + s + tick / 100)
        for pid, sock in socks.items():
            out[pid].append(sock.sent - before[pid])
    return out


def test_a_focused_path_is_probed_faster_for_a_while_and_the_others_never_change():
    prober, socks = prober_with("p1", "p2")
    start = time.monotonic()
    assert prober.focus({"p1", "unknown"}, rate=50.0, for_s=2.0) == 1
    assert prober.snapshot()["paths_focused"] == 1
    sent = sent_per_second(prober, socks, start, 5)
    assert all(45 <= n <= 56 for n in sent["p1"][:2]), sent  # 50 exchanges/s (25 pairs) while focused
    assert all(8 <= n <= 12 for n in sent["p1"][3:]), sent  # then the agent's 10/s again
    assert all(8 <= n <= 12 for n in sent["p2"]), sent


def test_a_focus_never_slows_a_path_down():
    prober, socks = prober_with("p1")
    prober.set_rate(60.0)
    start = time.monotonic()
    prober.focus({"p1"}, rate=20.0, for_s=5.0)
    sent = sent_per_second(prober, socks, start, 3)
    assert all(54 <= n <= 66 for n in sent["p1"]), sent


def test_the_agent_checks_focus_args_before_acting():
    prober, _ = prober_with("p1")
    agent = SimpleNamespace(stats=defaultdict(int), prober=prober)
    run = lambda command: Agent._command(agent, command)  # noqa: E731
    good = {"paths": ["p1", "p9"], "rate": 40, "for_s": 20}
    assert run({"id": 1, "kind": "focus", "args": good}) == ("done", "probing 1 of 2 paths at 40/s for 20 s")
    for bad, why in (({**good, "paths": []}, "args.paths"), ({**good, "rate": 0}, "args.rate"),
                     ({**good, "for_s": 3600}, "args.for_s"), ({**good, "paths": [7]}, "args.paths")):
        status, message = run({"id": 2, "kind": "focus", "args": bad})
        assert status == "failed" and why in message, (bad, message)
    assert agent.stats["commands_failed"] == 4
