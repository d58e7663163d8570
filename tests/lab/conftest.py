"""A real 2x2x2 fabric lab per test module (root only), with its own prefix, management subnet
and lab directory so it cannot clash with a lab a user has up (default prefix nmsl-, 198.18.0.0/24)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_helpers import PREFIX, build_lab, new_lab_dir, skip_reason

from lab import lab as lab_mod

LAB_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """One rerun for a failed lab test: these run real daemons, kernels' routing and timers in
    network namespaces on a shared 2-core machine, where a scheduling stall can cost a trial its
    deadline. A failure that repeats fails the suite; every rerun shows as R in the summary (and
    `-rR` lists them), so a test that starts to need it is visible."""
    for item in items:
        if LAB_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=2))


@pytest.fixture(scope="module")
def lab():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    handle = build_lab(new_lab_dir())
    yield handle
    lab_mod.down(handle.dir, PREFIX)
