"""`nms demo --keep-running` stopped by SIGTERM (a supervisor) or SIGHUP (a closed terminal) tears down
as Ctrl-C does: no orphaned `nms serve` (the lab demo, which needs root, uses the same helper)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import sigint_as_in_a_terminal

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys, time
    from nms.app.cli.interrupt import signals_as_ctrl_c
    with signals_as_ctrl_c():
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        finally:
            print("teardown", flush=True)
    import signal
    print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    raise KeyboardInterrupt
""")


def _interrupted(sig: signal.Signals) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=sigint_as_in_a_terminal)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_run_the_ctrl_c_teardown(sig):
    code, out = _interrupted(sig)
    assert out.split("\n")[:2] == ["interrupted", "teardown"], out
    assert "restored True" in out  # the previous handler is back after the block
    ctrl_c_code, ctrl_c_out = _interrupted(signal.SIGINT)
    assert ctrl_c_out == out and code == ctrl_c_code


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_demo_keep_running_stopped_by_sigterm_leaves_no_service(sig, tmp_path):
    env = dict(os.environ, COLUMNS="200", TMPDIR=str(tmp_path))
    demo = subprocess.Popen([sys.executable, "-m", "nms", "demo", "--api-only", "--minutes", "1", "--keep-running"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if "service left running" in line:
                break
        [serve] = _children(demo.pid)
        assert _alive(serve)
        demo.send_signal(sig)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 128 + signal.SIGINT, "".join(lines) + rest  # the exit status Ctrl-C gives
    assert not _alive(serve), "the demo's `nms serve` was left running"
    [workdir] = tmp_path.glob("nms-demo-*")
    assert "store flushed" in (workdir / "server.log").read_text()  # stopped cleanly, as by Ctrl-C
