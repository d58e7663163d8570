"""Test helpers: a service with one token per scope, built from a real config."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import yaml

from nms.config import parse_config

TOKENS = {scope: f"test-token-{scope}-0123456789" for scope in ("read", "ingest", "act", "admin")}


def make_config(data_dir: Path, **overrides):
    api = {"tokens": [{"name": f"t-{scope}", "scopes": [scope], "token": token} for scope, token in TOKENS.items()]}
    api.update(overrides.pop("api", {}))
    doc = {"data_dir": str(data_dir), "api": api, **overrides}
    return parse_config(yaml.safe_dump(doc))


@contextmanager
def api_client(config_or_service):
    """A TestClient on a started service (its lifespan runs: scheduler, correlator loop, store);
    `client.service` is the service. Give a config, or a Service set up beforehand."""
    from fastapi.testclient import TestClient

    from nms.app.api import create_app
    from nms.app.service import Service

    service = config_or_service if isinstance(config_or_service, Service) else Service(config_or_service)
    with TestClient(create_app(service)) as client:
        client.service = service
        yield client


def sigint_as_in_a_terminal() -> None:
    """`preexec_fn` of a child the test interrupts with SIGINT: SIGINT back to its default. A suite
    started in the background (`cmd &`, some CI runners) has SIGINT ignored, children inherit that,
    and Python then installs no KeyboardInterrupt handler: the child would never see the Ctrl-C."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def auth(scope: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[scope]}"}


def serve_in_thread(app, timeout: float = 15.0):
    """Run `app` under uvicorn on a free loopback port in a daemon thread, as `nms serve` does
    (`app.state.server`: streams end when it stops). Returns (url, server, thread); stop it with
    `server.should_exit = True` and `thread.join()`."""
    import threading
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    app.state.server = server
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    return f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", server, thread


def wait_until(cond, timeout: float, step: float = 0.2, what: str | None = None, why=None,
               ignore: tuple[type[BaseException], ...] = ()):
    """Poll `cond` until it returns something truthy, and return that. For what a test waits on,
    never a fixed sleep: a loaded machine is slower. On timeout: with `what`, fail saying what was
    awaited (plus `why()`, e.g. a log's tail); without, return cond's last value. Exceptions in
    `ignore` (a server still starting) count as not yet."""
    import time

    import pytest

    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except ignore:
            got = None
        if got:
            return got
        if time.monotonic() >= deadline:
            if what is not None:
                pytest.fail(f"timed out after {timeout:g} s waiting for {what}" + (f": {why()}" if why else ""))
            return got
        time.sleep(step)
