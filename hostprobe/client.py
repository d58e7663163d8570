"""Talking to the service: registration, the peer list, commands (long-poll) and their results,
report batches.

Every connection is opened by the agent (hosts need no inbound port). The control thread registers,
fetches the peer list every `peers.refresh`, and holds a long-poll GET for commands; what it learns
goes to the probe loop through a queue, and the loop's outcome of each command comes back through
another (`Control.result`, which never blocks) for the control thread to post. A service that
restarts answers with a new `instance`, and the agent registers again, keeping its command cursor
(command ids are never reused). With several service URLs (`service.urls`, API workers of a
cluster) the client uses one and moves to the next when it fails (ServiceClient). The last peer list
is cached on disk, so an agent that starts while the service is down still probes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from collections import deque
from pathlib import Path

import httpx

from nms import __version__

log = logging.getLogger(__name__)

RESULTS_MAX = 256  # command results held for posting while the service is away (then the oldest are dropped)
RESULT_WAIT = 1.0  # after handing commands to the probe loop, wait this long for their results before polling on


class ServiceError(Exception):
    pass


class ServiceClient:
    """The service's API over `settings.urls`, one at a time: a connection error, a timeout or a 503
    (an API worker that is degraded or cannot reach the bus) moves every thread to the next URL,
    round-robin; the callers' own retries and backoff do the rest. The first failure of an episode
    and the URL that answers again are logged (not every retry while none answers)."""

    def __init__(self, settings, host: str):
        self.host = host
        self.urls: list[str] = list(settings.urls)
        verify = str(settings.ca_file) if settings.ca_file else settings.verify_tls
        self._args = dict(timeout=settings.timeout, verify=verify,
                          headers={"Authorization": f"Bearer {settings.token.get_secret_value()}",
                                   "User-Agent": f"nms-agent/{__version__}"})
        self._local = threading.local()  # one httpx.Client per thread and URL
        self._lock = threading.Lock()
        self._index = 0
        self._failing = False  # the current URL failed and none has answered since
        self.switches = 0

    @property
    def url(self) -> str:
        """The URL in use."""
        return self.urls[self._index]

    def _client(self, index: int) -> httpx.Client:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if index not in clients:
            clients[index] = httpx.Client(base_url=self.urls[index], **self._args)
        return clients[index]

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        index = self._index
        try:
            response = self._client(index).request(method, path, **kw)
        except httpx.TransportError as e:  # refused, reset, timed out
            self._failed(index, type(e).__name__)
            raise
        if response.status_code == 503:
            self._failed(index, f"503 {response.text[:120]}")
        else:
            self._answered(index)
        return response

    def _failed(self, index: int, reason: str) -> None:
        with self._lock:
            if index != self._index or len(self.urls) == 1:
                return  # another thread moved on already (or there is nowhere to go)
            self._index = (index + 1) % len(self.urls)
            self.switches += 1
            first = not self._failing
            self._failing = True
        (log.warning if first else log.debug)("service at %s failed (%s): switching to %s", self.urls[index],
                                              reason, self.urls[self._index])

    def _answered(self, index: int) -> None:
        if self._failing and index == self._index:
            with self._lock:
                if not self._failing:
                    return
                self._failing = False
            log.warning("service at %s answers: using it (%d switches so far)", self.urls[index], self.switches)

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
        return self._json(self.request("POST", f"/agents/{self.host}/register", json=info))

    def peers(self) -> dict:
        return self._json(self.request("GET", f"/agents/{self.host}/peers"))

    def commands(self, after: int, wait: float) -> dict:
        return self._json(self.request("GET", f"/agents/{self.host}/commands", params={"after": after, "wait": wait},
                                       timeout=wait + 10))

    def post_result(self, command_id: int, result: dict) -> httpx.Response:
        return self.request("POST", f"/agents/{self.host}/commands/{command_id}/result", json=result)

    def post_batch(self, kind: str, gz_body: bytes) -> httpx.Response:
        return self.request("POST", f"/ingest/{kind}", content=gz_body,
                            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


class Control(threading.Thread):
    """Registration, peer list and commands; posts ('peers', list), ('registered', n: the how-manyth
    registration) and ('command', dict) to `inbox`, and posts the commands' results handed to
    `result()` to the service."""

    def __init__(self, client: ServiceClient, info: dict, refresh: float, cache_dir: Path, inbox: queue.Queue,
                 verifier=None):
        super().__init__(name="control", daemon=True)
        self.client, self.info, self.refresh, self.inbox = client, info, refresh, inbox
        self.verifier = verifier  # hostprobe.verify.CommandVerifier: learns the key the service announces
        self.cache = Path(cache_dir) / "peers.json"
        self._halt = threading.Event()
        self.instance: str | None = None
        self.registered = threading.Event()
        self.registrations = 0
        self.wait_max = 30.0
        self.results: queue.Queue = queue.Queue(maxsize=RESULTS_MAX)  # (command id, body) from the probe loop
        self._unsent: deque[tuple[int, dict]] = deque()
        self.results_dropped = 0

    def result(self, command_id: int, status: str, message: str, details: dict | None = None) -> None:
        """A command's outcome ("done" or "failed"), from the probe loop: never blocks."""
        body = {"status": status, "message": message[:1024], **({"details": details} if details else {})}
        try:
            self.results.put_nowait((command_id, body))
        except queue.Full:
            self._dropped(command_id)

    def result_now(self, command_id: int, status: str, message: str, details: dict | None = None) -> None:
        """A result from a worker thread (steer) that finished while the control thread sits in its
        long-poll: posted from the calling thread at once, queued as `result` when that fails."""
        body = {"status": status, "message": message[:1024], **({"details": details} if details else {})}
        try:
            if self.client.post_result(command_id, body).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        self.result(command_id, status, message, details)

    def _dropped(self, command_id: int) -> None:
        self.results_dropped += 1
        log.warning("result of command %d dropped: %d results wait for the service already", command_id, RESULTS_MAX)

    def _collect(self, waiting: set[int], timeout: float = 0.0) -> None:
        """Move results from the queue to the unsent list, waiting up to `timeout` for those of `waiting`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                command_id, body = (self.results.get(timeout=remaining) if waiting and remaining > 0
                                    else self.results.get_nowait())
            except queue.Empty:
                return
            waiting.discard(command_id)
            self._unsent.append((command_id, body))
            if len(self._unsent) > RESULTS_MAX:
                self._dropped(self._unsent.popleft()[0])

    def _post_results(self) -> None:
        """Post the unsent results in order; stop at the first that the service cannot take now
        (no connection, 5xx, 401/403): it is tried again on the next turn."""
        while self._unsent:
            command_id, body = self._unsent[0]
            try:
                response = self.client.post_result(command_id, body)
            except httpx.HTTPError as e:
                log.debug("result of command %d not posted: %s", command_id, e)
                return
            if response.status_code >= 500 or response.status_code in (401, 403, 429):
                log.debug("result of command %d not posted: %d", command_id, response.status_code)
                return
            if response.status_code >= 400:  # unknown command (404), outcome already known (409), 422
                log.warning("service refused the result of command %d (%d): %s", command_id,
                            response.status_code, response.text[:200])
            self._unsent.popleft()

    def cached_peers(self) -> list[dict] | None:
        try:
            return json.loads(self.cache.read_text())["peers"]
        except (OSError, ValueError, KeyError):
            return None

    def _peers(self, answer: dict) -> None:
        peers = answer["peers"]
        self.inbox.put(("peers", peers))
        self.inbox.put(("qp_targets", answer.get("qps") or []))  # this host's joined QPs (hostprobe/qp_trace.py)
        tmp = self.cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"peers": peers, "generation": answer.get("generation")}))
        os.replace(tmp, self.cache)

    def run(self) -> None:
        backoff, after, next_refresh, last_error = 1.0, 0, 0.0, 0.0
        while not self._halt.is_set():
            try:
                if self.instance is None:
                    answer = self.client.register(self.info)
                    self.instance = answer["instance"]  # `after` is kept: command ids outlive the service
                    if self.verifier is not None:
                        self.verifier.offer_key(answer.get("command_key"))
                    self._peers(answer)
                    self.registrations += 1
                    self.inbox.put(("registered", self.registrations))
                    next_refresh = time.monotonic() + self.refresh
                    self.registered.set()
                    log.info("registered with the service (%d peers, command long-poll up to %.0f s)",
                             len(answer["peers"]), answer.get("command_wait_max", 30))
                    self.wait_max = float(answer.get("command_wait_max", 30))
                if time.monotonic() >= next_refresh:
                    self._peers(self.client.peers())
                    next_refresh = time.monotonic() + self.refresh
                self._collect(set())
                self._post_results()
                wait = max(0.5, min(self.wait_max, next_refresh - time.monotonic()))
                answer = self.client.commands(after, wait)
                if answer.get("instance") != self.instance:
                    log.info("the service restarted: registering again")
                    self.instance = None
                    continue
                if after > answer.get("last_id", after):
                    log.info("the service's command ids restarted (its state was reset): polling from 0")
                    after = 0
                    continue
                handed: set[int] = set()
                for command in answer["commands"]:
                    after = max(after, command["id"])
                    if command["kind"] == "refresh_peers":
                        next_refresh = 0.0  # fetched on the next turn of this loop
                    self.inbox.put(("command", command))
                    handed.add(command["id"])
                if handed:  # the probe loop answers within a few tens of ms: post before polling again
                    self._collect(handed, RESULT_WAIT)
                    self._post_results()
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
