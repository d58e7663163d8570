"""Talking to the service: registration, the peer list, commands (long-poll), report batches.

Every connection is opened by the agent (hosts need no inbound port). The control thread registers,
fetches the peer list every `peers.refresh`, and holds a long-poll GET for commands; what it learns
goes to the probe loop through a queue. A service that restarts answers with a new `instance`, and
the agent registers again. The last peer list is cached on disk, so an agent that starts while the
service is down still probes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from pathlib import Path

import httpx

from nms import __version__

log = logging.getLogger(__name__)


class ServiceError(Exception):
    pass


class ServiceClient:
    def __init__(self, settings, host: str):
        self.host = host
        verify = str(settings.ca_file) if settings.ca_file else settings.verify_tls
        self._args = dict(base_url=settings.url, timeout=settings.timeout, verify=verify,
                          headers={"Authorization": f"Bearer {settings.token.get_secret_value()}",
                                   "User-Agent": f"nms-agent/{__version__}"})
        self._local = threading.local()  # one httpx.Client per thread

    @property
    def http(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(**self._args)
        return client

    def _json(self, response: httpx.Response) -> dict:
        if response.status_code in (401, 403):
            raise ServiceError(f"service refused the agent token ({response.status_code}): "
                               f"{response.json().get('detail', '')}")
        if response.status_code == 404:
            raise ServiceError(f"service does not know host {self.host!r}: {response.json().get('detail', '')}")
        if response.status_code >= 400:
            raise ServiceError(f"service answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def register(self, info: dict) -> dict:
        return self._json(self.http.post(f"/agents/{self.host}/register", json=info))

    def peers(self) -> dict:
        return self._json(self.http.get(f"/agents/{self.host}/peers"))

    def commands(self, after: int, wait: float) -> dict:
        return self._json(self.http.get(f"/agents/{self.host}/commands", params={"after": after, "wait": wait},
                                        timeout=wait + 10))

    def post_batch(self, kind: str, gz_body: bytes) -> httpx.Response:
        return self.http.post(f"/ingest/{kind}", content=gz_body,
                              headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


class Control(threading.Thread):
    """Registration, peer list and commands; posts ('peers', list) and ('command', dict) to `inbox`."""

    def __init__(self, client: ServiceClient, info: dict, refresh: float, cache_dir: Path, inbox: queue.Queue):
        super().__init__(name="control", daemon=True)
        self.client, self.info, self.refresh, self.inbox = client, info, refresh, inbox
        self.cache = Path(cache_dir) / "peers.json"
        self._halt = threading.Event()
        self.instance: str | None = None
        self.registered = threading.Event()
        self.wait_max = 30.0

    def cached_peers(self) -> list[dict] | None:
        try:
            return json.loads(self.cache.read_text())["peers"]
        except (OSError, ValueError, KeyError):
            return None

    def _peers(self, answer: dict) -> None:
        peers = answer["peers"]
        self.inbox.put(("peers", peers))
        tmp = self.cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"peers": peers, "generation": answer.get("generation")}))
        os.replace(tmp, self.cache)

    def run(self) -> None:
        backoff, after, next_refresh, last_error = 1.0, 0, 0.0, 0.0
        while not self._halt.is_set():
            try:
                if self.instance is None:
                    answer = self.client.register(self.info)
                    self.instance, after = answer["instance"], 0
                    self._peers(answer)
                    next_refresh = time.monotonic() + self.refresh
                    self.registered.set()
                    log.info("registered with the service (%d peers, command long-poll up to %.0f s)",
                             len(answer["peers"]), answer.get("command_wait_max", 30))
                    self.wait_max = float(answer.get("command_wait_max", 30))
                if time.monotonic() >= next_refresh:
                    self._peers(self.client.peers())
                    next_refresh = time.monotonic() + self.refresh
                wait = max(0.5, min(self.wait_max, next_refresh - time.monotonic()))
                answer = self.client.commands(after, wait)
                if answer.get("instance") != self.instance:
                    log.info("the service restarted: registering again")
                    self.instance = None
                    continue
                for command in answer["commands"]:
                    after = max(after, command["id"])
                    if command["kind"] == "refresh_peers":
                        next_refresh = 0.0  # fetched on the next turn of this loop
                    self.inbox.put(("command", command))
                backoff = 1.0
            except (httpx.HTTPError, ServiceError, ValueError, KeyError) as e:
                if isinstance(e, ServiceError) and "does not know" in str(e):
                    self.instance = None
                now = time.monotonic()
                if now - last_error > 30:
                    log.warning("service: %s; retrying (probing goes on, reports are buffered)", e)
                    last_error = now
                self._halt.wait(backoff * (0.8 + 0.4 * random.random()))
                backoff = min(backoff * 2, 30.0)

    def stop(self) -> None:
        self._halt.set()
