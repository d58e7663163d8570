"""The CLI collector's replay transport: a logged-in Session whose device answers from recorded
outputs (no SSH; the login and host-key path is tests/test_cli_collector.py's, on a real sshd).

Commands on exec channels (`Session.run`: the `| json` platforms, linux) and on the shell
(`connection.send_command`: napalm's getters) are answered from the same recording. A command
not recorded fails as a device refusing it would (exit status 1 on an exec channel, `% Invalid
input` on the shell): the poll notes it as a problem, and the error text says it was not recorded.

Used by tests/test_cli_napalm_cases.py (napalm's captures, answered by file name) and by the
replayed cases (tests/collector_cases/cli/*/responses.yaml: command -> output).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from collectors.base import PollResult
from collectors.cli.collector import CliCollector
from collectors.cli.transport import Output, Session
from nms.config.models import SwitchConfig

NOT_RECORDED = "not in this recording"


def napalm_file(case: Path, command: str) -> Path:
    """The file napalm's own tests answer `command` from (every other character than [a-zA-Z0-9] made `_`)."""
    return case / (re.sub("[^a-zA-Z0-9]", "_", command)[:150] + ".txt")


class ReplayShell:
    """netmiko's side of a logged-in shell (napalm's getters send their commands here)."""

    def __init__(self, answers: dict[str, str], case: Path | None = None):
        self.answers, self.case = answers, case

    def send_command(self, command: str, **_kwargs) -> str:
        if command in self.answers:
            return self.answers[command]
        if self.case is not None and napalm_file(self.case, command).is_file():
            return napalm_file(self.case, command).read_text()
        if command in ("show interfaces", "show interface"):
            return ""  # the interface list a poll needs: none
        return f"% Invalid input detected at '^' marker. ({NOT_RECORDED})"


class ReplaySession(Session):
    """A logged-in session whose device answers from `answers` (command -> stdout, or an Output)."""

    def __init__(self, device: str, settings, answers: dict[str, str | Output], case: Path | None = None):
        super().__init__(device, "192.0.2.1", settings)
        self.answers = answers
        self.shell = ReplayShell({k: v if isinstance(v, str) else v.stdout for k, v in answers.items()}, case)

    @property
    def connected(self) -> bool:
        return True

    @property
    def connection(self):
        return self.shell

    def run(self, command: str, preamble: str = "") -> Output:
        answer = self.answers.get(command)
        if isinstance(answer, Output):
            return answer
        if answer is not None:
            return Output(command, 0, answer, "")
        return Output(command, 1, "", NOT_RECORDED)


def load(responses: Path) -> dict[str, str | Output]:
    """responses.yaml: command -> its output text, or -> {status, stdout, stderr} for a command that failed."""
    doc = yaml.safe_load(responses.read_text()) or {}
    answers: dict[str, str | Output] = {}
    for command, answer in doc.items():
        if isinstance(answer, dict):
            answers[command] = Output(command, answer.get("status"), answer.get("stdout", ""), answer.get("stderr", ""))
        else:
            answers[command] = str(answer)
    return answers


async def poll(device: SwitchConfig, answers: dict[str, str | Output], case: Path | None = None) -> PollResult:
    """One poll of `device` through CliCollector.collect() on a session answering from `answers`."""
    collector = CliCollector(max_concurrency=1)
    collector._sessions.make = lambda device, settings: ReplaySession(device.name, settings, answers, case)
    try:
        return await collector.collect(device)
    finally:
        collector._pool.shutdown()


async def replay_cli(device: SwitchConfig, responses: Path) -> PollResult:
    return await poll(device, load(responses))


class RecordingSession(Session):
    """A real SSH session that records every command's answer (tests/collector_cases/record.py)."""

    def __init__(self, device: str, address: str, settings):
        super().__init__(device, address, settings)
        self.recording: dict[str, str | dict] = {}

    def run(self, command: str, preamble: str = "") -> Output:
        out = super().run(command, preamble)
        self.recording[command] = out.stdout if out.ok and not out.stderr else {
            "status": out.status, "stdout": out.stdout, "stderr": out.stderr}
        return out

    def connect(self) -> None:
        super().connect()
        send = self.connection.send_command  # napalm's getters' commands, on the shell

        def send_command(command: str, *args, **kwargs):
            self.recording[command] = output = send(command, *args, **kwargs)
            return output

        self.connection.send_command = send_command
