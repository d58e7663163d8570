"""One SSH login to one device for the CLI collector: netmiko connects, paramiko checks the host key.

netmiko logs in (password and/or a private key, the platform's session preparation); the host key
is checked by our own paramiko policy against the configured known_hosts file (never the service
user's ~/.ssh): a host that is not in the file, or whose key differs from it, is refused with its
fingerprint. Commands run on exec channels of the logged-in transport (`run`): each gives its own
stdout, stderr and exit status, so no prompt has to be found in outputs that may contain '#' or '$'.

Everything here is synchronous (netmiko and paramiko are): the collector calls it in a worker
thread. `abort()` may be called from another thread: it closes the transport, which ends a
blocked read at once. Errors are the collector's typed errors, naming the device and
address:port and never a password or key.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import socket
import threading
from dataclasses import dataclass

import paramiko
from netmiko import ConnectHandler
from netmiko.exceptions import NetmikoAuthenticationException, ReadTimeout

from collectors.base import (
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorError,
    CollectorTimeout,
    CollectorUnreachable,
)
from collectors.cli.settings import CliSettings

log = logging.getLogger(__name__)
# paramiko logs every failed connection with a traceback at ERROR; the collector reports them itself
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)

MAX_OUTPUT = 32 << 20  # bytes of one command's stdout; a command printing more fails
UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ECONNRESET,
                      errno.ENETDOWN, errno.EADDRNOTAVAIL}


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: SHA256:<base64 of the SHA-256 of the key blob, unpadded>."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class _HostKeyUnknown(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey):
        super().__init__(f"{name}: host key {key.get_name()} {fingerprint(key)} is not known")
        self.name, self.key = name, key


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise _HostKeyUnknown(hostname, key)


class _AcceptAny(paramiko.MissingHostKeyPolicy):
    """verify_host_key: false. The key is logged (once per session), never stored."""

    def __init__(self, device: str):
        self.device = device

    def missing_host_key(self, client, hostname, key):
        log.warning("%s: host key of %s NOT verified (verify_host_key: false): %s %s", self.device, hostname,
                    key.get_name(), fingerprint(key))


@dataclass(frozen=True)
class Output:
    command: str
    status: int | None  # exit status; None when the device sent none
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0


class Session:
    """A logged-in SSH session to one device, kept across polls while it works."""

    def __init__(self, device: str, address: str, settings: CliSettings):
        self.device, self.address, self.settings = device, address, settings
        self.where = f"{address}:{settings.port}"
        self._conn = None
        self._lock = threading.Lock()  # one poll at a time on a session
        self._aborted = False
        self.text_only = False  # the device refused `| json`: polled through napalm's text getters

    # -- connecting --------------------------------------------------------------------------------

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def connection(self):
        """The logged-in netmiko connection (napalm's drivers run their getters on it)."""
        return self._conn

    @property
    def connected(self) -> bool:
        transport = self._transport()
        return transport is not None and transport.is_active()

    def connect(self) -> None:
        s = self.settings
        pkey = self._private_key()
        if s.verify_host_key and not s.known_hosts.is_file():
            raise CollectorConfigError(self.device, f"known_hosts {s.known_hosts}: no such file (host keys are "
                                                    "checked against it)")
        params = dict(
            device_type=s.platform, host=self.address, port=s.port, username=s.username,
            password=s.password.get_secret_value() if s.password else None, pkey=pkey, use_keys=False,
            allow_agent=False, ssh_strict=True, system_host_keys=False,
            alt_host_keys=s.verify_host_key, alt_key_file=str(s.known_hosts) if s.verify_host_key else "",
            conn_timeout=s.timeout, banner_timeout=s.timeout, auth_timeout=s.timeout, blocking_timeout=s.timeout,
            read_timeout_override=s.timeout, auto_connect=False, fast_cli=True)
        try:
            conn = ConnectHandler(**params)
            # our policy instead of netmiko's RejectPolicy/AutoAddPolicy: it carries the key seen
            conn.key_policy = _RefuseUnknown() if s.verify_host_key else _AcceptAny(self.device)
            self._conn = conn
            if self._aborted:
                raise CollectorTimeout(self.device, f"{self.where}: aborted at the poll's deadline")
            conn._open()  # noqa: SLF001 -- connect + session preparation, what auto_connect=True does
        except CollectorError:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise self._login_error(e) from None
        self._raise_when_closed(conn)
        sock = getattr(self._transport(), "sock", None)
        if isinstance(sock, socket.socket):  # each command is a few small packets: no Nagle delay on them
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        log.info("%s: logged in over SSH to %s as %s", self.device, self.where, s.username)

    def _raise_when_closed(self, conn) -> None:
        """netmiko polls a closed channel for output until its read timeout: a getter of napalm's,
        reading the shell when the deadline closed the session, would hold its thread that long.
        Its reads raise instead once the session is closed."""
        read = conn.read_channel

        def read_channel() -> str:
            transport = self._transport()
            if self._aborted or transport is None or not transport.is_active():
                raise EOFError("the SSH session is closed")
            return read()

        conn.read_channel = read_channel

    def _private_key(self) -> paramiko.PKey | None:
        s = self.settings
        if s.key_file is None:
            return None
        passphrase = s.key_passphrase.get_secret_value() if s.key_passphrase else None
        try:
            return paramiko.PKey.from_path(s.key_file, passphrase.encode() if passphrase else None)
        except OSError as e:
            raise CollectorConfigError(self.device, f"key_file {s.key_file}: {e.strerror or e}") from None
        except TypeError as e:  # cryptography: "Key is password-protected, but password was not provided."
            if "password" not in str(e).lower():
                raise
            raise CollectorConfigError(self.device, f"key_file {s.key_file} is encrypted: give key_passphrase") \
                from None
        except paramiko.PasswordRequiredException:
            raise CollectorConfigError(self.device, f"key_file {s.key_file} is encrypted: give key_passphrase") \
                from None
        except (paramiko.SSHException, ValueError) as e:
            why = "wrong key_passphrase?" if passphrase else type(e).__name__
            raise CollectorConfigError(self.device, f"key_file {s.key_file}: cannot load the private key "
                                                    f"({why})") from None

    def _login_error(self, error: Exception) -> CollectorError:
        """netmiko folds the causes into two exceptions; the one paramiko or the socket raised is in
        the chain. The messages are ours: netmiko's and paramiko's texts are not passed on."""
        s, where, t = self.settings, self.where, f"{self.settings.timeout:g} s"
        chain = _chain(error)
        text = " | ".join(str(e) for e in chain)
        for e in chain:
            if isinstance(e, _HostKeyUnknown):
                return CollectorAuthError(self.device, (
                    f"{where}: host key {e.key.get_name()} {fingerprint(e.key)} is not in known_hosts "
                    f"{s.known_hosts}: refused (after checking the fingerprint on the device, add it: "
                    f"ssh-keyscan -p {s.port} {self.address} >> {s.known_hosts})"))
            if isinstance(e, paramiko.BadHostKeyException):
                return CollectorAuthError(self.device, (
                    f"{where}: host key {e.key.get_name()} {fingerprint(e.key)} does not match known_hosts "
                    f"{s.known_hosts} (which has {e.expected_key.get_name()} {fingerprint(e.expected_key)}): "
                    "refused; the device was re-keyed or this is not the device"))
        if "protocol banner" in text or "No existing session" in text:
            if any(isinstance(e, (EOFError, ConnectionResetError)) for e in chain):
                return CollectorUnreachable(self.device, f"{where}: the connection closed before SSH started "
                                                         "(not an SSH server, or one refusing connections)")
            return CollectorTimeout(self.device, f"{where}: no SSH banner within {t} (not an SSH server, or "
                                                 "one that hangs)")
        for e in chain:
            if isinstance(e, (paramiko.AuthenticationException, NetmikoAuthenticationException)):
                if "timeout" in str(e).lower():
                    return CollectorTimeout(self.device, f"{where}: no answer to the login within {t}")
                how = " and ".join(m for m, given in (("password", s.password), ("key", s.key_file)) if given)
                return CollectorAuthError(self.device, f"{where}: login refused for user {s.username!r} "
                                                       f"(tried {how})")
        for e in chain:
            if isinstance(e, socket.gaierror):
                return CollectorUnreachable(self.device, f"{where}: cannot resolve the address")
            if isinstance(e, TimeoutError):
                return CollectorTimeout(self.device, f"{where}: no answer to the TCP connection within {t}")
            errors = list(e.errors.values()) if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError) \
                else [e] if isinstance(e, OSError) else []
            for x in errors:
                if x.errno in UNREACHABLE_ERRNOS:
                    return CollectorUnreachable(self.device, f"{where}: {x.strerror or errno.errorcode[x.errno]}")
        for e in chain:
            if isinstance(e, ReadTimeout):
                return CollectorTimeout(self.device, f"{where}: logged in, but no shell prompt within {t}")
            if isinstance(e, paramiko.SSHException):
                return CollectorBadResponse(self.device, f"{where}: SSH failed: {_first_line(e)}")
        return CollectorBadResponse(self.device, f"{where}: login failed ({type(error).__name__}: "
                                                 f"{_first_line(chain[-1])})")

    # -- commands ----------------------------------------------------------------------------------

    def run(self, command: str, preamble: str = "") -> Output:
        """Run one command (after `preamble`, shell set-up not worth naming in errors) on a fresh exec
        channel; its stdout/stderr as text and its exit status. Silence longer than `timeout` is a
        CollectorTimeout naming the command; a dead session a CollectorUnreachable (the caller may
        log in again)."""
        transport = self._transport()
        if transport is None or not transport.is_active():
            raise CollectorUnreachable(self.device, f"{self.where}: the SSH session is closed")
        t = self.settings.timeout
        try:
            channel = transport.open_session(timeout=t)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise CollectorUnreachable(self.device, f"{self.where}: cannot open a channel for {command!r} "
                                                    f"({_first_line(e) or type(e).__name__})") from None
        try:
            channel.settimeout(t)
            channel.exec_command(preamble + command)
            out = _read_all(channel.recv, self.device, command)
            err = _read_all(channel.recv_stderr, self.device, command)
            status = channel.recv_exit_status() if channel.status_event.wait(t) else None
        except TimeoutError:
            raise CollectorTimeout(self.device, f"{self.where}: {command!r} gave no output for {t:g} s") from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise CollectorUnreachable(self.device, f"{self.where}: the session broke during {command!r} "
                                                    f"({_first_line(e) or type(e).__name__})") from None
        finally:
            channel.close()
        return Output(command, status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    # -- closing -----------------------------------------------------------------------------------

    def _transport(self) -> paramiko.Transport | None:
        client = getattr(self._conn, "remote_conn_pre", None)
        return client.get_transport() if client is not None else None

    def abort(self) -> None:
        """From any thread: end the session now (a blocked read returns at once)."""
        self._aborted = True
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        client = getattr(conn, "remote_conn_pre", None)
        if client is not None:
            try:
                client.close()  # not netmiko's disconnect(): no 'exit' typed into a shell that may hang
            except Exception:  # noqa: BLE001 -- closing a broken session: nothing left to do
                pass

    def __enter__(self) -> Session:
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _read_all(read, device: str, command: str) -> bytes:
    data = bytearray()
    while chunk := read(65536):
        data += chunk
        if len(data) > MAX_OUTPUT:
            raise CollectorBadResponse(device, f"{command!r} printed more than {MAX_OUTPUT >> 20} MiB")
    return bytes(data)


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
