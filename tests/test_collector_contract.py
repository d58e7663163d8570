"""What collectors/base.py gives every collector: the "no settings" error, timed results, and the
problem record of a partial failure. Each collector's own problems are tested against its peer
(tests/test_snmp_collector.py, test_gnmi_qos.py, test_ufm_collector.py, test_cli_collector.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from collectors.base import CollectorBadResponse, CollectorConfigError, PollProblem, PollStart
from nms.app.plugins import load_plugin
from nms.app.polling import COLLECTOR_GROUP
from nms.config.models import SwitchConfig


@pytest.mark.parametrize("name", ["snmp", "gnmi", "ufm", "cli"])
def test_a_device_without_the_collectors_settings_is_a_config_error_naming_them(name):
    collector = load_plugin(COLLECTOR_GROUP, name)()
    device = SwitchConfig(name="sw-9", mgmt_address="192.0.2.9")

    async def run():
        try:
            await collector.collect(device)
        finally:
            await collector.close()

    with pytest.raises(CollectorConfigError) as info:
        asyncio.run(run())
    assert str(info.value) == f"sw-9: has no collectors.{name} settings" and info.value.kind == "config"


def test_a_result_is_timed_from_its_start_and_carries_the_collectors_name_and_widths():
    collector = load_plugin(COLLECTOR_GROUP, "snmp")()
    started = PollStart()
    time.sleep(0.01)
    result = collector.result("sw-1", started, [], values=3)
    assert (result.device, result.collector, result.values, result.problems) == ("sw-1", "snmp", 3, [])
    assert result.started_ns == started.ns and result.duration_s >= 0.01
    assert result.counter_bits == collector.counter_bits


def test_a_problem_reads_as_what_and_why_and_long_texts_are_cut():
    problem = PollProblem(what="lldpctl -f json", reason="exit status 127; LLDP neighbours left out")
    assert str(problem) == "lldpctl -f json: exit status 127; LLDP neighbours left out"
    assert problem.kind == "bad_response"
    long = PollProblem(what="x" * 1000, reason="y" * 5000, kind="timeout")
    assert (len(long.what), len(long.reason), long.kind) == (300, 1024, "timeout")
    with pytest.raises(ValueError, match="kind"):
        PollProblem(what="a", reason="b", kind="oops")
    # an error the poll goes on without becomes a problem of its kind, its message as the reason
    error = CollectorBadResponse("sw-1", "https://ufm: GET /x: HTTP 500")
    assert error.problem("alarms", "alarms left out") == PollProblem(
        what="alarms", reason="https://ufm: GET /x: HTTP 500; alarms left out")
