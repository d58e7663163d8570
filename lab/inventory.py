"""Credentials and the NMS configuration file that `nms serve --config` loads with no editing."""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path

import yaml

from lab import sh, tls
from lab.state import LabDir
from lab.topology import Topology
from nms.config import load_config

API_PORT = 8080
GNMI_PORT = 9339  # IANA's gNMI port, on every switch's management address
GNMI_USER = "nmslab"
GNMI_INTERVAL = "1s"  # the counters' SAMPLE interval the generated config asks for
CLI_USER = "nmslab"  # the CLI collector's login on every switch: not root, a key only
CLI_INTERVAL, CLI_CONFIG_INTERVAL = "10s", "60s"
TOKEN_SCOPES = ["read", "ingest", "act", "admin"]
AGENT_SCOPES = ["ingest"]  # host agents (`nms lab agents start`): a token per host, bound to it, ingest only


def agent_token_file(lab: LabDir, host: str):
    """The token of the agent on `host` (api.tokens entry `agent-<host>`, bound to that host)."""
    return lab.run_dir / "agent-tokens" / host


def probe_key_file(lab: LabDir):
    """The fabric-wide probe key of the lab's agents (never given to the service)."""
    return lab.run_dir / "probe-key"


def gnmi_password_file(lab: LabDir) -> Path:
    """The gNMI password: read by every switch's target and by the config (${file:...})."""
    return lab.run_dir / "gnmi-password"


def tls_dir(lab: LabDir) -> Path:
    return lab.root / "tls"


def ca_file(lab: LabDir) -> Path:
    """The lab CA's certificate: what a gNMI client verifies the switches' certificates against."""
    return tls_dir(lab) / "ca.pem"


def switch_cert(lab: LabDir, switch: str) -> tuple[Path, Path]:
    """(certificate, key) of a switch's gNMI target: subjectAltName = its management address."""
    return tls_dir(lab) / f"{switch}.pem", tls_dir(lab) / f"{switch}.key"


def cli_dir(lab: LabDir) -> Path:
    """The CLI collector's files: its key, the switches' known_hosts, the login user's passwd/group
    entries (bind-mounted over /etc in each switch's sshd, nowhere else) and home."""
    return lab.run_dir / "cli"


def cli_client_key(lab: LabDir) -> Path:
    return cli_dir(lab) / "id_ed25519"


def cli_known_hosts(lab: LabDir) -> Path:
    return cli_dir(lab) / "known_hosts"


def switch_host_key(lab: LabDir, switch: str) -> Path:
    return lab.node(switch) / "ssh_host_ed25519_key"


def _keygen(path: Path, comment: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, Path(f"{path}.pub")):
        p.unlink(missing_ok=True)
    sh.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _free_uid(start: int = 64242) -> int:
    used = {int(line.split(":")[2]) for line in Path("/etc/passwd").read_text().splitlines() if line.count(":") >= 6}
    return next(uid for uid in range(start, 65000) if uid not in used)


def write_cli_files(topo: Topology, lab: LabDir) -> list[str]:
    """The collector's key, a host key per switch, known_hosts with them, authorized_keys, and the
    login user's passwd/group lines (in the groups that may run lldpcli). Kept when
    present. Returns the switches whose host key is new (a running sshd must be restarted)."""
    d = cli_dir(lab)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)  # sshd reads authorized_keys as the login user
    key = cli_client_key(lab)
    if not key.exists():
        _keygen(key, f"nms-lab CLI collector ({topo.spec.prefix})")
    (d / "authorized_keys").write_text(f"restrict,pty {Path(f'{key}.pub').read_text().strip()}\n")
    (d / "authorized_keys").chmod(0o644)
    home = d / "home"
    if not (d / "passwd").exists():
        uid = _free_uid()
        home.mkdir(exist_ok=True)
        os.chown(home, uid, uid)
        (d / "passwd").write_text(Path("/etc/passwd").read_text() + f"{CLI_USER}:x:{uid}:{uid}:nms lab CLI collector:"
                                  f"{home}:/bin/sh\n")
        # Debian's lldpcli is setuid _lldpd and runs for the adm group only; the socket is _lldpd's
        groups = [line + (f",{CLI_USER}" if line.split(":")[3] else CLI_USER)
                  if line.split(":")[0] in ("_lldpd", "adm") else line
                  for line in Path("/etc/group").read_text().splitlines()]
        (d / "group").write_text("\n".join(groups) + f"\n{CLI_USER}:x:{uid}:\n")
    issued = []
    for node in topo.switches:
        host_key = switch_host_key(lab, node.name)
        if not host_key.exists():
            _keygen(host_key, f"{node.name} ({topo.spec.prefix})")
            issued.append(node.name)
    lines = []
    for node in topo.switches:
        kind, value = Path(f"{switch_host_key(lab, node.name)}.pub").read_text().split()[:2]
        lines.append(f"{node.mgmt_address} {kind} {value}\n")  # port 22: no [address]:port form
    cli_known_hosts(lab).write_text("".join(lines))
    return issued


def _secret(n: int) -> str:
    alphabet = string.ascii_letters + string.digits  # safe inside snmpd.conf and command lines
    return "".join(secrets.choice(alphabet) for _ in range(n))


NET_SNMP_AUTH = {"sha": "SHA", "sha256": "SHA-256", "sha512": "SHA-512", "md5": "MD5"}
NET_SNMP_PRIV = {"aes": "AES", "aes256": "AES-256", "des": "DES"}


def new_snmp_credentials() -> dict:
    """A v2c community and a v3 authPriv user (SHA-256 + AES-128), random per lab.

    The v3 keys use the field names of SnmpSettings (collectors/snmp/settings.py), so `SnmpSettings(version="3",
    **state["snmp"]["v3"])` works; `net_snmp_v3_args` is the same user for snmpget/snmpbulkwalk."""
    v3 = {"user": "nmslab", "auth_protocol": "sha256", "auth_key": _secret(20),
          "priv_protocol": "aes", "priv_key": _secret(20)}
    return {"community": "lab-" + _secret(12), "v3": v3, "net_snmp_v3_args": net_snmp_v3_args(v3)}


def net_snmp_v3_args(v3: dict) -> list[str]:
    return ["-v3", "-l", "authPriv", "-u", v3["user"], "-a", NET_SNMP_AUTH[v3["auth_protocol"]],
            "-A", v3["auth_key"], "-x", NET_SNMP_PRIV[v3["priv_protocol"]], "-X", v3["priv_key"]]


def new_gnmi_credentials(lab: LabDir) -> dict:
    """The switches' gNMI user, random per lab. Field names are GnmiSettings' (collectors/gnmi/settings.py), so
    `GnmiSettings(**state["gnmi"])` is a working client configuration."""
    return {"port": GNMI_PORT, "username": GNMI_USER, "password": _secret(24), "ca_file": str(ca_file(lab))}


def write_gnmi_files(topo: Topology, lab: LabDir, gnmi: dict) -> list[str]:
    """The password file (0600) and the TLS files: a lab CA and a certificate per switch, kept when
    present. Returns the switches whose certificate is new (a target running with an older one
    must be restarted)."""
    _write_secret(gnmi_password_file(lab), gnmi["password"])
    d = tls_dir(lab)
    d.mkdir(mode=0o700, exist_ok=True)
    ca_key = d / "ca.key"
    fresh_ca = not (ca_file(lab).exists() and ca_key.exists())
    if fresh_ca:
        tls.make_ca(ca_file(lab), ca_key, f"nms-lab CA ({topo.spec.prefix}, {lab.root})")
    issued = []
    for node in topo.switches:
        cert, key = switch_cert(lab, node.name)
        if fresh_ca or not (cert.exists() and key.exists()):
            tls.issue(ca_file(lab), ca_key, cert, key, node.name, [node.mgmt_address])
            issued.append(node.name)
    return issued


def _write_secret(path: Path, value: str) -> None:
    if path.exists() and path.read_text().rstrip("\n") == value:
        return
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.replace(tmp, path)


def write_token(lab: LabDir, path=None) -> None:
    """A random API token, readable by root only, referenced from the config as ${file:...}."""
    path = lab.token if path is None else path
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")


def config_dict(topo: Topology, lab: LabDir, snmp: dict, gnmi: dict | None = None) -> dict:
    """The service's config; each switch gets the collectors of the lab's southbound protocols
    (gNMI only when its credentials are given; the CLI's files come from `write_cli_files`)."""
    collectors: dict = {}
    if "snmp" in topo.spec.southbound:
        collectors["snmp"] = {"version": "2c", "community": snmp["community"]}
    if "gnmi" in topo.spec.southbound and gnmi is not None:
        collectors["gnmi"] = {"port": gnmi["port"], "username": gnmi["username"],
                              "password": f"${{file:{gnmi_password_file(lab)}}}", "ca_file": gnmi["ca_file"],
                              "interval": GNMI_INTERVAL}
    if "cli" in topo.spec.southbound:
        collectors["cli"] = {"username": CLI_USER, "key_file": str(cli_client_key(lab)),
                             "known_hosts": str(cli_known_hosts(lab)), "interval": CLI_INTERVAL,
                             "config_interval": CLI_CONFIG_INTERVAL}
    switches = [{"name": n.name, "mgmt_address": n.mgmt_address, "role": n.role,
                 "collectors": {k: dict(v) for k, v in collectors.items()}} for n in topo.switches]
    hosts, agent_tokens = [], []
    for h in topo.by_role("host"):
        link = topo.link_of_port(h.name, "eth0")
        hosts.append({"name": h.name, "nics": [{"name": "eth0", "address": link.b.ip,
                                                "switch": link.a.node, "switch_port": link.a.name}]})
        agent_tokens.append({"name": f"agent-{h.name}", "scopes": AGENT_SCOPES, "host": h.name,
                             "token": f"${{file:{agent_token_file(lab, h.name)}}}"})
    return {
        "site": "nms-lab",
        "data_dir": str(lab.data),
        "store": {"backend": "embedded"},
        "api": {
            "host": "127.0.0.1",
            "listen": [topo.mgmt_gateway],  # host agents in the namespaces reach the service there
            "port": API_PORT,
            "tokens": [{"name": "lab-admin", "scopes": TOKEN_SCOPES, "token": f"${{file:{lab.token}}}"},
                       *agent_tokens],
        },
        "fabric": {
            "switches": switches,
            "hosts": hosts,
            "links": [{"a": str(link.a), "b": str(link.b)} for link in topo.links],
        },
    }


def write_config(topo: Topology, lab: LabDir, snmp: dict, gnmi: dict | None = None) -> None:
    """Write the config and prove it loads (raises nms.config.ConfigError if it does not)."""
    write_token(lab)
    for h in topo.by_role("host"):
        path = agent_token_file(lab, h.name)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        write_token(lab, path)
    write_token(lab, probe_key_file(lab))
    text = "# generated by `nms lab up`; SNMPv3 credentials are in state.json (snmp.v3)\n"
    text += yaml.safe_dump(config_dict(topo, lab, snmp, gnmi), sort_keys=False)
    tmp = lab.config.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)  # holds the SNMP community
    os.replace(tmp, lab.config)
    load_config(lab.config)
