"""The README's main job as it runs on a fresh machine: `nms demo` on the fabric lab (root)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lab_helpers import skip_reason

pytestmark = pytest.mark.root


def test_lab_demo_detects_the_link_failure_and_resolves_it():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = subprocess.run([sys.executable, "-m", "nms", "demo"], capture_output=True, text=True, timeout=420,
                         env=dict(os.environ, COLUMNS="200"))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "incident opened" in text and "link_down" in text and "leaf1:swp3--spine1:swp1" in text, text[-4000:]
    assert "incident resolved" in text and "demo done" in text, text[-4000:]
