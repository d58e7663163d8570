"""The CLI collector: logs in over SSH and reads what a switch's command line shows.

One SSH session per device (collectors/cli/transport.py: netmiko logs in, the host key is checked
against known_hosts), kept across polls and logged into again when it broke. netmiko and paramiko
are synchronous: a poll runs in a thread of the collector's own pool (`polling.max_concurrency`
threads); a poll cut off at its deadline closes its session, which ends the thread's blocked read.

Per poll, on the `linux` platform (collectors/cli/linux.py; `arista_eos` (eos.py) and
`cisco_nxos` (nxos.py) run their `| json` equivalents, without 2 (the speed is in 1) and with
the chassis id from the facts; `cisco_ios`, and a `cisco_nxos` device that refuses `| json`, run
napalm's getters on the same session instead: collectors/cli/napalm_getters.py):

1. `ip -s -s -j link show`            -> PortSample per interface (64-bit kernel counters, oper
                                          status, MTU): the poll fails without it
2. `grep -H . /sys/class/net/*/speed` -> the samples' speed (left out where the kernel has none)
3. hostname, `uname -a`, /proc/uptime -> DeviceFacts (first record; `arista_eos`: its host name
                                          from `show hostname | json`)
4. `lldpctl -f json` and `lldpcli -f json show chassis` (`lldp`) -> LldpNeighbor, the facts'
                                          chassis id
5. `ip -4 -j address show`           -> InterfaceAddress per IPv4 address (the complete set)
5a. `tc -s -j qdisc show` (linux)    -> QueueSample per egress queue (leaf qdisc): drops, ECN marks
6. the running configuration (`config`, at most every `config_interval`): the CONFIG_SECTIONS
   commands under headers -> `device_config` and, when it changed, `device_config_change` points
   (collectors/cli/config.py)

A timeout, refused login, refused host key or lost session fails the poll whatever the command.
Any other failure of 2-6 (a command missing or failing, output that does not parse) is a problem
of the poll (PollResult.problems: the command, why, what was lost), and the poll goes on.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import paramiko
from netmiko.exceptions import ReadTimeout

from collectors.base import (
    Collector,
    CollectorBadResponse,
    CollectorTimeout,
    CollectorUnreachable,
    DeviceCache,
    PollProblem,
    PollResult,
    PollStart,
)
from collectors.cli import eos as cli_eos
from collectors.cli import linux as cli_linux
from collectors.cli import napalm_getters as cli_napalm
from collectors.cli import nxos as cli_nxos
from collectors.cli.config import ConfigTracker
from collectors.cli.settings import CliSettings
from collectors.cli.transport import Output, Session
from nms.config.models import SwitchConfig

log = logging.getLogger(__name__)
# netmiko device type -> its command set and parsers (each module has the same names as cli_linux)
PLATFORMS = {"linux": cli_linux, "arista_eos": cli_eos, "cisco_nxos": cli_nxos}
# ... and those read through napalm's getters on the same session (collectors/cli/napalm_getters.py)
PLATFORMS.update({name: cli_napalm for name in cli_napalm.DRIVERS})


class CliCollector(Collector):
    name = "cli"
    settings_model = CliSettings
    counter_bits: dict[str, int] = cli_linux.COUNTER_BITS  # stats64 is 64-bit; a qdisc's drops are not
    link_state_rank = 10  # the kernel's operstate, read as it is at each poll

    def __init__(self, max_concurrency: int = 64) -> None:
        # netmiko/paramiko block: polls run in this pool, not the loop's default one (the store's)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="cli-poll")
        # a session aborted at a poll's deadline is logged into again as a new one
        self._sessions: DeviceCache[Session] = DeviceCache(
            lambda device, settings: Session(device.name, device.mgmt_address, settings),
            release=Session.abort, usable=lambda session: not session.aborted)
        self._config_due: dict[str, float] = {}  # device -> time.monotonic() of its next config snapshot
        self.configs = ConfigTracker()

    @classmethod
    def from_config(cls, config: Any) -> CliCollector:
        return cls(max_concurrency=config.polling.max_concurrency)

    async def collect(self, device: SwitchConfig) -> PollResult:
        session = await self._sessions.get(device, self.required_settings(device))
        started = PollStart()
        try:
            poll = await asyncio.get_running_loop().run_in_executor(self._pool, self._poll, session)
        except asyncio.CancelledError:
            # the deadline passed: closing the session ends the worker thread's blocked read
            threading.Thread(target=session.abort, name=f"cli-abort-{device.name}", daemon=True).start()
            raise
        return self.result(device.name, started, poll.records, values=poll.commands,
                           addresses_walked=poll.addresses_read, problems=poll.problems)

    # -- in the worker thread ----------------------------------------------------------------------

    def _poll(self, session: Session) -> _Poll:
        with session:
            if session.connected:
                try:
                    return _Poll(session, self).run()
                except CollectorUnreachable as e:  # the kept session broke (device rebooted, idle timeout)
                    log.info("%s; logging in again", e)
            session.close()
            session.connect()
            return _Poll(session, self).run()

    async def forget(self, device_name: str) -> None:
        """Given to another member: its session logged out (in the pool), its config snapshot's schedule
        and the previous snapshot dropped (taken back later, it logs in again and its first snapshot is
        compared with nothing, as at a member new to it)."""
        session = self._sessions.pop(device_name)
        self._config_due.pop(device_name, None)
        self.configs.forget(device_name)
        if session is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, session.abort)

    async def close(self) -> None:
        sessions = self._sessions.drop_all()  # aborted in the pool: closing a socket may block
        self._config_due.clear()
        if sessions:
            await asyncio.get_running_loop().run_in_executor(self._pool, lambda: [s.abort() for s in sessions])


class _Poll:
    """One poll of one device on a logged-in session (worker thread)."""

    def __init__(self, session: Session, collector: CliCollector):
        self.session, self.collector = session, collector
        self.s: CliSettings = session.settings
        self.device = session.device
        self.p = PLATFORMS[self.s.platform]
        self.problems: list[PollProblem] = []
        self.commands = 0
        self.addresses_read = False  # this poll read the complete set of interface addresses
        self.records: list[Any] = []

    def keep(self, name: str) -> bool:
        return not self.s.interfaces or any(fnmatch.fnmatchcase(name, p) for p in self.s.interfaces)

    def run(self) -> _Poll:
        """Read the device; the records are in `records`, what was left out in `problems`."""
        if self.p is cli_napalm:
            return self._run_napalm(cli_napalm.DRIVERS[self.s.platform])
        if self.session.text_only:
            return self._run_napalm(cli_napalm.TEXT_DRIVERS[self.s.platform])
        before = time.time_ns()
        p = self.p
        links = self._run(p.LINKS)
        ts = (before + time.time_ns()) // 2  # the counters were read during the command
        if self.s.platform in cli_napalm.TEXT_DRIVERS and not links.stdout.lstrip().startswith("{") \
                and cli_linux.refusal(links.stdout + links.stderr):
            # no `| json` on this device (older NX-OS): napalm's text parsers, on this session from now on
            log.info("%s: %r refused (%s); reading through napalm's %s getters", self.device, p.LINKS,
                     cli_linux.refusal(links.stdout + links.stderr), cli_napalm.TEXT_DRIVERS[self.s.platform])
            self.session.text_only = True
            return self._run_napalm(cli_napalm.TEXT_DRIVERS[self.s.platform])
        if not links.ok:
            raise self._bad(p.LINKS, self._status(links))
        speed_bps = p.speeds(self._run(p.SPEEDS).stdout) if p.SPEEDS else {}
        notes: list[str] = []
        try:
            samples, interfaces = p.port_samples(self.device, links.stdout, ts, speed_bps, self.keep, notes)
        except p.Bad as e:
            raise self._bad(p.LINKS, str(e)) from None
        self._notes(p.LINKS, notes)
        neighbors, chassis = self._lldp() if self.s.lldp else ([], None)
        records: list[Any] = []
        facts = self._optional(p.FACTS, lambda out: p.facts(self.device, out, ts, interfaces, chassis))
        if facts is not None and facts.sys_name is None and getattr(p, "HOSTNAME", None):
            name = self._optional(p.HOSTNAME, p.hostname, "no sys_name in the facts")
            facts = facts.model_copy(update={"sys_name": name})
        if facts is not None:
            records.append(facts)  # first: the service files a poll's facts under the polled device by it
        self.records = records + samples + self._queues() + neighbors + self._addresses() + self._config()
        return self

    def _run_napalm(self, driver: str) -> _Poll:
        """The poll through napalm's `driver`'s getters (collectors/cli/napalm_getters.py); get_interfaces is
        required."""
        napalm = cli_napalm.driver(driver, self.session.connection, self.device, self.s.timeout)
        before = time.time_ns()
        interfaces = self._getter(napalm, "get_interfaces", None)
        counters = self._getter(napalm, "get_interfaces_counters", "counters left out")
        ts = (before + time.time_ns()) // 2
        notes: list[str] = []
        samples = cli_napalm.port_samples(self.device, ts, interfaces, counters, self.keep, notes)
        self._notes("get_interfaces", notes)
        records: list[Any] = []
        if (got := self._getter(napalm, "get_facts", "no facts this poll")) is not None:
            records.append(cli_napalm.facts(self.device, ts, got, driver))
        if self.s.lldp and (got := self._getter(napalm, "get_lldp_neighbors_detail", "LLDP left out")) is not None:
            records += cli_napalm.neighbors(self.device, time.time_ns(), got, self.keep, notes := [])
            self._notes("get_lldp_neighbors_detail", notes)
        if (got := self._getter(napalm, "get_interfaces_ip", "interface addresses left out")) is not None:
            records += cli_napalm.addresses(self.device, time.time_ns(), got, self.keep, notes := [])
            self._notes("get_interfaces_ip", notes)
            self.addresses_read = True
        self.records = records + samples + self._napalm_config(napalm, driver)
        return self

    def _napalm_config(self, napalm: Any, driver: str) -> list:
        if not self.s.config or time.monotonic() < self.collector._config_due.get(self.device, 0.0):
            return []
        got = self._getter(napalm, "get_config", "no configuration snapshot this poll", retrieve="running")
        if got is None:
            return []
        self.collector._config_due[self.device] = time.monotonic() + self.s.config_interval
        text = cli_linux.config_text([("running-config", "show running-config",
                                       cli_napalm.normalize(got.get("running") or "", driver))])
        return self.collector.configs.snapshot(self.device, text, time.time_ns())

    def _getter(self, napalm: Any, name: str, consequence: str | None, **kwargs: Any) -> Any:
        """A napalm getter's result; None (noted) when it fails and `consequence` says what is lost,
        the poll's failure when it is None. A timeout or a broken session fails the poll."""
        from napalm.base.exceptions import ConnectionClosedException  # napalm: only for its platforms

        self.commands += 1
        try:
            got = getattr(napalm, name)(**kwargs)
            if not isinstance(got, dict):
                raise ValueError(f"a {type(got).__name__}, not a dict")
            return got
        except ReadTimeout:
            raise CollectorTimeout(self.device, f"{self.session.where}: {name} gave no output for "
                                                f"{self.s.timeout:g} s") from None
        except (OSError, EOFError, paramiko.SSHException, ConnectionClosedException) as e:
            raise CollectorUnreachable(self.device, f"{self.session.where}: the session broke during {name} "
                                                    f"({_first_line(str(e)) or type(e).__name__})") from None
        except Exception as e:  # noqa: BLE001 -- napalm's parsers raise anything on output they do not expect
            failed = f"napalm's {name} failed ({type(e).__name__}: {_first_line(str(e))})"
            if consequence is None:
                raise self._bad(name, failed) from None
            self._left_out(name, f"{failed}; {consequence}")
            return None

    def _queues(self) -> list:
        """Egress queues, on a platform that reads them (`QDISCS`: linux)."""
        p = self.p
        if getattr(p, "QDISCS", None) is None:
            return []
        notes: list[str] = []
        before = time.time_ns()
        found = self._optional(p.QDISCS, lambda out: p.queue_samples(
            self.device, out, (before + time.time_ns()) // 2, self.keep, notes), "queue counters left out")
        self._notes(p.QDISCS, notes)
        return found or []

    def _addresses(self) -> list:
        notes: list[str] = []
        found = self._optional(self.p.ADDRESSES, lambda out: self.p.addresses(
            self.device, out, time.time_ns(), self.keep, notes), "interface addresses left out")
        self._notes(self.p.ADDRESSES, notes)
        if found is None:
            return []
        self.addresses_read = True
        return found

    def _lldp(self) -> tuple[list, str | None]:
        notes: list[str] = []
        p = self.p
        found = self._optional(p.LLDP_NEIGHBORS, lambda out: p.neighbors(
            self.device, out, time.time_ns(), self.keep, notes), "LLDP neighbours left out")
        if found is None:
            return [], None
        self._notes(p.LLDP_NEIGHBORS, notes)
        if not p.LLDP_CHASSIS:  # the facts carry it
            return found, None
        chassis = self._optional(p.LLDP_CHASSIS, p.local_chassis_id, "no chassis id in the facts")
        return found, chassis

    def _config(self) -> list:
        if not self.s.config or time.monotonic() < self.collector._config_due.get(self.device, 0.0):
            return []
        sections = []
        for name, what, command, required, state in self.p.CONFIG_SECTIONS:
            out = self._run(command)
            if out.ok:
                text = self.p.normalize(out.stdout, state)
                if required or text.strip():
                    sections.append((name, what, text))
            elif required:
                self._left_out(what, f"{self._status(out)}; no configuration snapshot this poll")
                return []
            else:
                self._left_out(what, f"{self._status(out)}; noted in the configuration snapshot")
                sections.append((name, what, f"(not readable: exit status {out.status}: {_last_line(out.stderr)})"))
        self.collector._config_due[self.device] = time.monotonic() + self.s.config_interval
        return self.collector.configs.snapshot(self.device, self.p.config_text(sections), time.time_ns())

    # -- helpers -----------------------------------------------------------------------------------

    def _run(self, command: str) -> Output:
        self.commands += 1
        return self.session.run(command, self.p.PREAMBLE)

    def _optional(self, command: str, parse, consequence: str = "left out"):
        """A command that adds to the poll: a failure is noted and None returned."""
        out = self._run(command)
        if not out.ok:
            self._left_out(command, f"{self._status(out)}; {consequence}")
            return None
        try:
            return parse(out.stdout)
        except ValueError as e:  # the platforms' Bad is a ValueError
            self._left_out(command, f"{_first_line(str(e))}; {consequence}")
            return None

    def _notes(self, command: str, notes: list[str]) -> None:
        if notes:
            more = f" (and {len(notes) - 3} more)" if len(notes) > 3 else ""
            self._left_out(command, f"{len(notes)} items left out: {'; '.join(notes[:3])}{more}")

    def _left_out(self, command: str, reason: str) -> None:
        self.problems.append(PollProblem(what=command, reason=reason))

    def _bad(self, command: str, what: str) -> CollectorBadResponse:
        return CollectorBadResponse(self.device, f"{self.session.where}: {command!r}: {what}")

    @staticmethod
    def _status(out: Output) -> str:
        """How a command failed: its exit status and the last line of its error output."""
        status = "no exit status" if out.status is None else f"exit status {out.status}"
        if out.status in (126, 127):
            status += " (not installed, or not allowed for this user)"
        if detail := _last_line(out.stderr):  # the error; earlier lines may be the login's (home directory)
            status += f": {detail}"
        return status


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
