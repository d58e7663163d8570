"""The collector contract (collectors/base.py), one suite for every collector.

First what the base class gives every collector: the "no settings" error, timed results, the problem
record of a partial failure. Then the shared suite: the same tests run against each collector's real
peer here: net-snmp's snmpd (tests/_snmpd.py), the lab's gNMI target (lab/gnmi_target.py through
tests/_gnmi.py), OpenSSH's sshd in a network namespace (tests/_sshd.py, needs root), the UFM stand-in
server (tests/_ufm.py). Each collector's own behaviour is tested further in its own file
(tests/test_snmp_collector.py, test_gnmi_collector.py, test_ufm_collector.py, test_cli_collector.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from _gnmi import PASSWORD as GNMI_PASSWORD
from _gnmi import USER as GNMI_USER
from _gnmi import Target, free_port
from _snmpd import COMMUNITY, V3_USERS, Snmpd, free_udp_port
from _snmpd import SKIP_REASON as SNMPD_SKIP
from _snmpd import available as snmpd_available
from _sshd import PASSWORD as SSH_PASSWORD
from _sshd import PORT as SSH_PORT
from _sshd import USER as SSH_USER
from _sshd import SshBox, skip_reason
from _ufm import PASSWORD as UFM_PASSWORD
from _ufm import TOKEN as UFM_TOKEN
from _ufm import USERNAME as UFM_USERNAME
from _ufm import UfmStandIn

from collectors.base import (
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorError,
    CollectorTimeout,
    CollectorUnreachable,
    DeviceCache,
    PollProblem,
    PollResult,
    PollStart,
)
from nms.app.plugins import load_plugin
from nms.app.polling import COLLECTOR_GROUP
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, Record

REPO = Path(__file__).resolve().parent.parent
SSHD_SKIP = skip_reason()


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


class _Session:
    """What a collector keeps per device (DeviceCache's tests)."""

    def __init__(self, device: SwitchConfig, settings: dict):
        self.device, self.address, self.settings = device.name, device.mgmt_address, settings
        self.usable = True


@pytest.mark.parametrize("release_kind", ["plain", "async"])
def test_a_device_cache_keeps_one_object_per_device_and_releases_each_replaced_one_once(release_kind):
    released: list[_Session] = []
    forgotten: list[str] = []

    async def release_async(session: _Session) -> None:
        await asyncio.sleep(0)
        released.append(session)

    cache = DeviceCache(_Session, release=released.append if release_kind == "plain" else release_async,
                        usable=lambda session: session.usable, forget=forgotten.append)
    device = SwitchConfig(name="sw-1", mgmt_address="192.0.2.1")
    other = SwitchConfig(name="sw-2", mgmt_address="192.0.2.2")
    settings = {"port": 161}

    async def run():
        first = await cache.get(device, settings)
        assert await cache.get(device, settings) is first and cache.kept("sw-1") is first
        assert (released, forgotten) == ([], ["sw-1"])
        # a reloaded configuration gives equal settings in a new object: a new session
        second = await cache.get(device, dict(settings))
        assert second is not first and second.settings is not settings
        assert (released, forgotten) == ([first], ["sw-1", "sw-1"])
        # the device's management address changed
        moved = await cache.get(device.model_copy(update={"mgmt_address": "192.0.2.9"}), second.settings)
        assert moved.address == "192.0.2.9" and released == [first, second]
        # the collector says the kept one is no longer usable (an aborted session)
        moved.usable = False
        again = await cache.get(device.model_copy(update={"mgmt_address": "192.0.2.9"}), second.settings)
        assert again is not moved and released == [first, second, moved] and forgotten == ["sw-1"] * 4
        elsewhere = await cache.get(other, settings)
        assert cache.kept("sw-3") is None and forgotten[-1] == "sw-2"
        await cache.close_all()
        assert released == [first, second, moved, again, elsewhere]  # each once, the kept ones at close
        assert cache.kept("sw-1") is None and cache.kept("sw-2") is None
        await cache.close_all()
        assert len(released) == 5

    asyncio.run(run())


def test_a_device_cache_keeps_the_old_object_when_making_a_new_one_fails_and_hands_back_dropped_ones():
    released: list[_Session] = []

    def make(device: SwitchConfig, settings: dict) -> _Session:
        if settings.get("bad"):
            raise CollectorConfigError(device.name, "TLS file /nonexistent: No such file or directory")
        return _Session(device, settings)

    cache = DeviceCache(make, release=released.append)
    device = SwitchConfig(name="sw-1", mgmt_address="192.0.2.1")

    async def run():
        first = await cache.get(device, {})
        with pytest.raises(CollectorConfigError, match="sw-1: TLS file"):
            await cache.get(device, {"bad": True})
        assert cache.kept("sw-1") is first and released == []
        assert cache.drop_all() == [first] and cache.kept("sw-1") is None and released == []

    asyncio.run(run())


# --- the shared suite: the same tests against every collector's real peer -----------------------------
# (in the manner of napalm's BaseTestGetters: one Peer per collector says how to reach its peer, how to
# make it refuse, vanish, hang and leave something out; the tests are the same for all)

DEVICE = "sw-c"


class Peer:
    name: str
    address = "127.0.0.1"
    secrets: tuple[str, ...] = ()
    # what nothing listening looks like: SNMP runs over UDP, where an agent that is not there and one that
    # drops the request are the same silence (pysnmp reads no ICMP): "timeout"; the others connect
    unreachable_kind = "unreachable"
    problem_what = ""  # what the poll under `leaving_something_out` leaves out

    def settings(self) -> dict: ...
    def wrong_credentials(self) -> dict: ...
    def nothing_listening(self) -> dict: ...

    @contextlib.contextmanager
    def hung(self) -> Iterator[dict]:
        """The peer stops answering; yields settings whose own timeouts outlast the poll's deadline."""
        yield {}

    @contextlib.contextmanager
    def leaving_something_out(self) -> Iterator[dict]:
        yield {}

    def entry(self, name: str = DEVICE, **overrides) -> dict:
        """The device as fabric.switches[] has it in a config file."""
        settings = {k: v for k, v in {**self.settings(), **overrides}.items() if v is not None}
        return {"name": name, "mgmt_address": self.address, "collectors": {self.name: settings}}

    def device(self, name: str = DEVICE, **overrides) -> SwitchConfig:
        return SwitchConfig.model_validate(self.entry(name, **overrides))


class SnmpPeer(Peer):
    name, unreachable_kind, problem_what = "snmp", "timeout", "1.3.6.1.4.1.99999.1.0"

    def __init__(self, snmpd: Snmpd):
        self.snmpd = snmpd
        self.secrets = (COMMUNITY, *(u[1] for u in V3_USERS.values()), *(u[3] for u in V3_USERS.values() if u[3]),
                        "not-the-key-1")

    def settings(self) -> dict:
        return self.snmpd.settings(interfaces=["lo"])

    def wrong_credentials(self) -> dict:
        return self.snmpd.settings("nmssha", auth_key="not-the-key-1", interfaces=["lo"])

    def nothing_listening(self) -> dict:
        return {"port": free_udp_port(), "timeout": 0.3, "retries": 0}

    @contextlib.contextmanager
    def hung(self) -> Iterator[dict]:
        os.kill(self.snmpd.pid, signal.SIGSTOP)
        try:
            yield {"timeout": 5, "retries": 0}
        finally:
            os.kill(self.snmpd.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def leaving_something_out(self) -> Iterator[dict]:
        yield {"extra_oids": ["1.3.6.1.4.1.99999.1.0"]}  # an object the agent does not have


class GnmiPeer(Peer):
    # a target listing no models (some do): the collector asks for openconfig-qos, which it lacks
    name, secrets, problem_what = "gnmi", (GNMI_PASSWORD, "not-the-password"), "openconfig-qos"

    def __init__(self, target: Target):
        self.target = target

    def settings(self) -> dict:
        return {"port": self.target.port, "insecure": True, "username": GNMI_USER, "password": GNMI_PASSWORD,
                "timeout": 5}

    def wrong_credentials(self) -> dict:
        return {"password": "not-the-password"}

    def nothing_listening(self) -> dict:
        return {"port": free_port(), "timeout": 2}

    @contextlib.contextmanager
    def hung(self) -> Iterator[dict]:
        os.kill(self.target.proc.pid, signal.SIGSTOP)  # the kernel still accepts its connections
        try:
            yield {"timeout": 10}
        finally:
            os.kill(self.target.proc.pid, signal.SIGCONT)


class CliPeer(Peer):
    name, problem_what = "cli", "lldpctl -f json"

    def __init__(self, box: SshBox):
        self.box, self.address = box, box.address
        self.secrets = (SSH_PASSWORD, "not-the-password", box.client_key.read_text().splitlines()[1])

    def settings(self) -> dict:
        return {"username": "root", "key_file": str(self.box.client_key), "known_hosts": str(self.box.known_hosts),
                "port": SSH_PORT, "timeout": 3, "lldp": False, "config": False}

    def wrong_credentials(self) -> dict:
        return {"username": SSH_USER, "password": "not-the-password", "key_file": None}

    def nothing_listening(self) -> dict:
        return {"port": SSH_PORT + 1}

    @contextlib.contextmanager
    def hung(self) -> Iterator[dict]:
        self.box.fake_command("/usr/sbin/lldpcli", script="sleep 4")  # a command that does not come back
        try:
            yield {"lldp": True, "timeout": 20}
        finally:
            self.box.restore_command("/usr/sbin/lldpcli")

    @contextlib.contextmanager
    def leaving_something_out(self) -> Iterator[dict]:
        self.box.fake_command("/usr/sbin/lldpcli", script="echo 'unable to connect to lldpd' >&2; exit 1")
        try:
            yield {"lldp": True}
        finally:
            self.box.restore_command("/usr/sbin/lldpcli")


class UfmPeer(Peer):
    name, secrets, problem_what = "ufm", (UFM_PASSWORD, UFM_TOKEN, "not-the-password"), "GET /ufmRest/app/alarms"

    def __init__(self, ufm: UfmStandIn):
        self.ufm = ufm

    def settings(self) -> dict:
        return {"url": self.ufm.url, "username": UFM_USERNAME, "password": UFM_PASSWORD, "backoff": 0.05}

    def wrong_credentials(self) -> dict:
        return {"password": "not-the-password"}

    def nothing_listening(self) -> dict:
        return {"url": f"http://127.0.0.1:{free_port()}", "retries": 0}

    @contextlib.contextmanager
    def hung(self) -> Iterator[dict]:
        self.ufm.fault("/resources/ports", "hang")
        try:
            yield {"timeout": 20}
        finally:
            self.ufm.faults.clear()

    @contextlib.contextmanager
    def leaving_something_out(self) -> Iterator[dict]:
        self.ufm.fault("/app/alarms", "500", "500", "500")
        try:
            yield {}
        finally:
            self.ufm.faults.clear()


@pytest.fixture(scope="module", params=["snmp", "gnmi", "cli", "ufm"])
def peer(request, tmp_path_factory) -> Iterator[Peer]:
    """Each collector's real peer, started once for all the tests below (pytest runs them peer by peer)."""
    if request.param == "snmp":
        if not snmpd_available():
            pytest.skip(SNMPD_SKIP)
        server = Snmpd()
        server.start()
        yield SnmpPeer(server)
        server.stop()
    elif request.param == "gnmi":
        target = Target(tmp_path_factory.mktemp("gnmi"), "--insecure", "--interfaces", "lo", "--no-qos",
                        "--no-models").start()
        yield GnmiPeer(target)
        target.stop()
    elif request.param == "cli":
        if SSHD_SKIP is not None:
            pytest.skip(SSHD_SKIP)
        box = SshBox().start()
        yield CliPeer(box)
        box.stop()
    else:
        ufm = UfmStandIn().start()
        yield UfmPeer(ufm)
        ufm.stop()


def run(peer: Peer, dev: SwitchConfig, deadline: float = 10) -> PollResult:
    collector = load_plugin(COLLECTOR_GROUP, peer.name)()

    async def poll():
        try:
            return await collector.collect_with_deadline(dev, deadline)
        finally:
            await collector.close()

    return asyncio.run(poll())


def failure(peer: Peer, dev: SwitchConfig, deadline: float = 10) -> tuple[CollectorError, float]:
    started = time.monotonic()
    with pytest.raises(CollectorError) as info:
        run(peer, dev, deadline)
    return info.value, time.monotonic() - started


def no_secret(peer: Peer, *texts: str) -> None:
    text = "\n".join(texts)
    assert not [s for s in peer.secrets if s in text], text


def test_a_poll_is_a_poll_result_of_shared_records_with_the_facts_first(peer, caplog):
    caplog.set_level(logging.DEBUG)
    before = time.time_ns()
    started = time.perf_counter()
    result = run(peer, peer.device())
    took = time.perf_counter() - started
    assert isinstance(result, PollResult) and (result.device, result.collector) == (DEVICE, peer.name)
    assert before <= result.started_ns <= time.time_ns() and 0 < result.duration_s <= took
    assert result.records and all(isinstance(r, Record) for r in result.records)
    assert isinstance(result.records[0], DeviceFacts) and result.records[0].device == DEVICE
    assert result.samples and all(isinstance(p, PollProblem) for p in result.problems)
    no_secret(peer, caplog.text, repr(result.records))


def test_refused_credentials_are_an_auth_error_naming_no_secret(peer, caplog):
    caplog.set_level(logging.DEBUG)
    dev = peer.device(**peer.wrong_credentials())
    e, _ = failure(peer, dev)
    assert isinstance(e, CollectorAuthError) and e.kind == "auth" and e.device == DEVICE, e
    assert str(e).startswith(f"{DEVICE}: ")
    no_secret(peer, str(e), caplog.text)


def test_nothing_listening_is_unreachable(peer, caplog):
    caplog.set_level(logging.DEBUG)
    e, took = failure(peer, peer.device(**peer.nothing_listening()))
    assert e.kind == peer.unreachable_kind and e.device == DEVICE, e
    assert isinstance(e, CollectorUnreachable if peer.unreachable_kind == "unreachable" else CollectorTimeout)
    assert took < 5
    no_secret(peer, str(e), caplog.text)


def test_a_peer_that_stops_answering_is_a_timeout_at_the_deadline(peer, caplog):
    caplog.set_level(logging.DEBUG)
    with peer.hung() as settings:
        e, took = failure(peer, peer.device(**settings), deadline=1.0)
    assert isinstance(e, CollectorTimeout) and e.kind == "timeout", e
    assert f"{DEVICE}: poll did not finish within its deadline of 1 s" in str(e) and 0.9 < took < 3
    no_secret(peer, str(e), caplog.text)


def test_what_a_poll_leaves_out_is_a_problem_and_the_rest_is_kept(peer, caplog):
    caplog.set_level(logging.DEBUG)
    with peer.leaving_something_out() as settings:
        result = run(peer, peer.device(**settings))
    assert result.samples and isinstance(result.records[0], DeviceFacts)
    problems = [p for p in result.problems if peer.problem_what in f"{p.what} {p.reason}"]
    assert problems and all(isinstance(p, PollProblem) for p in result.problems), result.problems
    no_secret(peer, *map(str, result.problems), caplog.text)


def test_nms_collect_once_exits_0_when_every_device_answers_else_1(peer, tmp_path):
    def nms(*devices: dict) -> subprocess.CompletedProcess[str]:
        config = tmp_path / "nms.yaml"
        config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": list(devices)}}))
        return subprocess.run([sys.executable, "-m", "nms", "collect", peer.name, "--once", "--json", "--config",
                               str(config)], capture_output=True, text=True, timeout=60, cwd=REPO,
                              env={**os.environ, "COLUMNS": "200"})

    ok = nms(peer.entry())
    assert ok.returncode == 0 and "1/1 devices ok" in ok.stderr, ok.stderr
    refused = nms(peer.entry(), peer.entry("sw-refused", **peer.wrong_credentials()))
    assert refused.returncode == 1 and "1/2 devices ok" in refused.stderr, refused.stderr
    states = {d["device"]: (d["state"], d["last_error_kind"]) for d in json.loads(refused.stdout)["devices"]}
    assert states == {DEVICE: ("ok", None), "sw-refused": ("error", "auth")}
    no_secret(peer, ok.stdout, ok.stderr, refused.stdout, refused.stderr)

