"""`nms serve`'s default log is quiet: APScheduler's two INFO lines per job run (every 2 s for the
clock solve) only at log_level debug; its warnings (a missed or failed run) still show."""

from __future__ import annotations

import logging
import time

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from nms.app.cli import QUIET_LOGGERS, configure_logging


@pytest.fixture
def restore_levels():
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in QUIET_LOGGERS)]
    saved = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, saved):
        lg.setLevel(level)


def _run_one_job(caplog) -> list[logging.LogRecord]:
    ran = []
    scheduler = BackgroundScheduler()
    scheduler.add_job(lambda: ran.append(1), "interval", seconds=0.05, id="solve_clock")
    caplog.clear()
    scheduler.start()
    deadline = time.monotonic() + 10
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.shutdown(wait=True)
    assert ran
    return [r for r in caplog.records if r.name.startswith("apscheduler")]


def test_default_log_level_leaves_the_scheduler_quiet(caplog, restore_levels):
    configure_logging("info")  # the default log_level
    assert logging.getLogger("apscheduler").getEffectiveLevel() >= logging.WARNING
    assert logging.getLogger("apscheduler.executors.default").getEffectiveLevel() >= logging.WARNING
    caplog.set_level(logging.INFO)  # the root at INFO, as `nms serve` has it
    assert [r.getMessage() for r in _run_one_job(caplog) if r.levelno < logging.WARNING] == []


def test_debug_log_level_shows_the_scheduler_runs(caplog, restore_levels):
    configure_logging("debug")
    caplog.set_level(logging.DEBUG)
    messages = [r.getMessage() for r in _run_one_job(caplog)]
    assert any(m.startswith("Running job") for m in messages), messages
    assert any("executed successfully" in m for m in messages), messages
