"""Window closing in the prober: a window closes `timeout` after its end, except one whose last
exchanges went unanswered while its path is still up: that one waits for the path's verdict (a
reply to a later exchange, or the path reported down), so a link that died mid-window is never
reported as a lossy window before its PathEvent."""

from __future__ import annotations

import pytest

from hostprobe.config import ProbeSettings
from hostprobe.prober import WINDOW_NS, LocalNic, PathState, Prober, Target
from hostprobe.stats import Exchange

W0 = 1_700_000_000 * WINDOW_NS


class Clock:
    epoch = 0

    def __init__(self):
        self.ns = W0

    def now(self) -> int:
        return self.ns


class Sock:
    port = 40000


@pytest.fixture
def bed():
    clock, emitted = Clock(), []
    settings = ProbeSettings(key="window-test-key-0123456789", timeout="0.25s", down_after="0.9s")
    prober = Prober("h1", [], settings, b"k" * 16, 1, clock, {}, lambda kind, r: emitted.append((kind, r)))
    target = Target(LocalNic("eth0", "10.0.0.1", []), "h2", "eth0", "10.0.0.2", 33434)
    path = PathState(target, Sock(), "p1")
    target.paths["p1"] = path
    prober.targets[target.key] = target
    path.state = "up"
    return prober, path, clock, emitted


def fill(path: PathState, window: int, answered: list[bool]) -> None:
    """Ten exchanges sent 0.1 s apart in `window`; answered ones carry all four stamps."""
    bucket = path.windows.setdefault(window, [])
    for i, ok in enumerate(answered):
        sent = (window - W0) / 1e9 + 0.1 * i
        ex = Exchange(len(bucket), path, window, sent, bool(i % 2))
        if ok:
            ex.t1, ex.t2, ex.t3, ex.t4 = window + 1000, window + 21000, window + 22000, window + 42000
            path.answered_mono = max(path.answered_mono, sent)
        bucket.append(ex)


def windows(emitted) -> list:
    return [r for kind, r in emitted if kind == "probe_windows"]


def test_a_window_closes_timeout_after_its_end(bed):
    prober, path, clock, emitted = bed
    fill(path, W0, [True, False, True, True, True, True, True, True, True, True])  # random loss, tail answered
    clock.ns = W0 + WINDOW_NS + 240_000_000
    assert prober.close_windows() == 0 and not emitted
    clock.ns = W0 + prober.close_lag_ns
    assert prober.close_windows() == 1
    (w,) = windows(emitted)
    assert (w.sent, w.received) == (10, 9) and prober.closed_before == clock.ns - prober.close_lag_ns


def test_a_window_with_a_silent_tail_waits_for_a_later_reply(bed):
    prober, path, clock, emitted = bed
    fill(path, W0, [True] * 6 + [False] * 4)  # the link died at 0.55 s ... or four probes were unlucky
    clock.ns = W0 + prober.close_lag_ns + 100_000_000
    assert prober.close_windows() == 0 and not emitted
    assert prober.closed_before == W0  # clock sync must not take this window's peer yet
    fill(path, W0 + WINDOW_NS, [True])  # the path answers again: the losses were random
    assert prober.close_windows() == 1
    assert (windows(emitted)[0].sent, windows(emitted)[0].received) == (10, 6)


def test_a_window_with_a_silent_tail_closes_once_its_path_is_down(bed):
    prober, path, clock, emitted = bed
    fill(path, W0, [True] * 6 + [False] * 4)
    clock.ns = W0 + prober.close_lag_ns
    assert prober.close_windows() == 0
    path.state = "down"  # check_paths reported it (the PathEvent went out first)
    assert prober.close_windows() == 1 and windows(emitted)[0].received == 6


def test_a_held_window_closes_anyway_when_overdue(bed):
    prober, path, clock, emitted = bed
    fill(path, W0, [True] * 6 + [False] * 4)
    clock.ns = W0 + prober.close_lag_ns + 1_300_000_000  # down_after + 0.4 s past its time: still held
    assert prober.close_windows() == 0
    clock.ns = W0 + prober.close_lag_ns + 1_400_000_001  # down_after + 0.5 s: no verdict will come
    assert prober.close_windows() == 1


def test_a_retired_path_closes_without_waiting(bed):
    prober, path, clock, emitted = bed
    fill(path, W0, [True] * 6 + [False] * 4)
    del path.target.paths["p1"]
    path.target.retired.append(path)  # no longer probed: no later reply can come
    clock.ns = W0 + prober.close_lag_ns
    assert prober.close_windows() == 1 and not path.target.retired
