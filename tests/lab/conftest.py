"""A real 2x2x2 fabric lab per test module (root only), with its own prefix, management subnet
and lab directory so it cannot clash with a lab a user has up (default prefix nmsl-, 198.18.0.0/24)."""

from __future__ import annotations

import pytest
from lab_helpers import PREFIX, build_lab, new_lab_dir, skip_reason

from nms.lab import lab as lab_mod


@pytest.fixture(scope="module")
def lab():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    handle = build_lab(new_lab_dir())
    yield handle
    lab_mod.down(handle.dir, PREFIX)
