"""Correlator: egress queue drops and ECN marks (QueueRates) as congestion evidence, on the synthetic
fabric of tests/_fabric_synth.py: a lossy link whose egress queue drops is congestion (not silent
corruption), with the queue's numbers in the evidence; sustained queue drops alone give congestion
in the direction the queue sends; a queue that does not drop, or dropped once, says nothing."""

from __future__ import annotations

from _fabric_synth import NS
from test_correlator_faults import Run, kinds, link_of

from correlator.evidence import SwitchView
from nms.config.models import Thresholds
from nms.records import QueueRates


def feed_queue(run: Run, end: str, dropped_pps: float, ecn_marked_pps: float | None = None) -> dict:
    """Every switch poll also reports the egress queue `root` of `end` ("dev:port"), at the rates of
    the returned dict (change them to change what the queue reports)."""
    device, port = end.split(":")
    switch_records = run.s.switch_records
    now = {"dropped_pps": dropped_pps, "ecn_marked_pps": ecn_marked_pps}

    def records(t: int, interval_s: float = 5.0) -> list:
        return switch_records(t, interval_s) + [QueueRates(device=device, port=port, queue="root", ts=t * NS,
                                                           interval_s=1.0, transmit_bps=9.6e6, **now)]

    run.s.switch_records = records
    return now


def test_loss_at_low_utilization_with_queue_drops_is_congestion_with_the_queue_numbers():
    """Without the queue, this loss at 10 % utilization is silent corruption (test_correlator_faults);
    the egress queue dropping says the link is congested (a rate-limited port: utilization vs the
    port's speed reads low)."""
    run = Run(switch_every=1)
    directed = run.s.down_link(1, 2)  # spine1 -> leaf2
    egress = directed.split("->")[0]
    feed_queue(run, egress, dropped_pps=850.0)
    run.s.loss[directed] = 0.05
    last = run.steps(5)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    f = last[0]
    assert f.direction == directed and f.evidence["rates"]["queue_drops_ps"] == 850.0
    assert f.evidence["queues"] == {egress: {"root": {"dropped_pps": 850.0, "peak_dropped_pps": 850.0,
                                                      "samples_dropping": 5, "of": 5, "transmit_bps": 9600000}}}
    assert "queue drops 850 packets/s" in f.summary


def test_the_same_loss_without_queue_drops_stays_corruption():
    run = Run(switch_every=1)
    directed = run.s.down_link(1, 2)
    feed_queue(run, directed.split("->")[0], dropped_pps=0.0)
    run.s.loss[directed] = 0.05
    last = run.steps(5)[-1]
    assert kinds(last) == {("corrupting_link", link_of(directed))}
    assert "queues" not in last[0].evidence and last[0].evidence["rates"]["queue_drops_ps"] == 0.0


def test_ecn_marks_alone_are_congestion_evidence():
    run = Run(switch_every=1)
    directed = run.s.up_link(3, 1)
    egress = directed.split("->")[0]
    feed_queue(run, egress, dropped_pps=0.0, ecn_marked_pps=120.0)
    run.s.loss[directed] = 0.03
    last = run.steps(5)[-1]
    assert kinds(last) == {("congestion", link_of(directed))}
    assert last[0].evidence["rates"]["ecn_marks_ps"] == 120.0
    assert last[0].evidence["queues"][egress]["root"]["ecn_marked_pps"] == 120.0


def test_sustained_queue_drops_alone_are_congestion_in_the_queues_direction():
    """No probe sees anything (the probes' own traffic gets through): the switch's queue drops in
    every sample of the context give congestion on that link, in the direction the queue sends."""
    run = Run(switch_every=1)
    directed = run.s.up_link(2, 2)  # leaf2 -> spine2
    egress = directed.split("->")[0]
    feed_queue(run, egress, dropped_pps=40.0)
    first, *_, last = run.steps(4)
    assert first == []  # one sample dropping is not sustained
    assert kinds(last) == {("congestion", link_of(directed))}
    f = last[0]
    assert f.direction == directed and f.evidence["queues"][egress]["root"]["dropped_pps"] == 40.0
    assert f.confidence == 0.7 and f.severity == "minor"


def test_a_queue_that_stopped_dropping_clears():
    run = Run(switch_every=1)
    directed = run.s.up_link(2, 2)
    queue = feed_queue(run, directed.split("->")[0], dropped_pps=40.0)
    assert kinds(run.steps(4)[-1]) == {("congestion", link_of(directed))}
    queue["dropped_pps"] = 0.0
    assert run.steps(1)[-1] == []  # its latest rate drops nothing: not every sample of the context drops
    entry = SwitchView(run.c.ctx, run.c.index, Thresholds()).queues(
        tuple(directed.split("->")[0].split(":")))["root"]
    assert (entry["dropped_pps"], entry["peak_dropped_pps"]) == (0.0, 40.0) and entry["samples_dropping"] == 4
