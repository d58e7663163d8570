"""Lab lifecycle: up (idempotent, crash-safe), down, status with live checks."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict

from lab import builder, cleanup, inventory, services, sh
from lab.state import LabDir, now, spec_of, topology_of
from lab.topology import FABRIC_NET, Spec, Topology, format_rate, plan

Step = Callable[[str], None]


def _owner(topo: Topology) -> str | None:
    """The lab directory recorded on the management bridge (its alias), if the bridge exists."""
    out = sh.run(["ip", "-j", "link", "show", "dev", topo.bridge], check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)[0].get("ifalias")


def up(lab: LabDir, spec: Spec, step: Step = lambda _: None) -> tuple[dict, bool]:
    """Build the lab; return (state, built). built is False when an identical lab was already up."""
    sh.require_root()
    sh.require_binaries()
    try:
        topo = plan(spec)
    except ValueError as e:
        raise sh.LabError(str(e)) from None
    if lab.exists():
        with lab.locked():
            state = lab.load()
            old = topology_of(state)
            running = set(cleanup.lab_namespaces(old.spec.prefix))
            if running and all(old.netns(n) in running for n in old.nodes):
                if old.spec != spec:
                    raise sh.LabError(f"a different lab ({describe(spec_of(state))}) is up in {lab.root}; "
                                      "run `nms lab down` first")
                step("lab already up: checking services")
                _ensure_gnmi(topo, lab, state)
                _ensure_cli(topo, lab, state)
                _ensure_services(topo, lab, state)
                lab.save(state)
                inventory.write_config(topo, lab, state["snmp"], state.get("gnmi"))
                return state, False
    owner = _owner(topo)
    if owner and owner != str(lab.root) and LabDir(owner).exists():
        raise sh.LabError(f"prefix {spec.prefix!r} is used by the lab in {owner}: pass another --prefix "
                          "and --mgmt-subnet, or take that lab down")
    if cleanup.scan(spec.prefix, lab):
        step("removing leftovers of an earlier run")
        cleanup.remove(spec.prefix, lab)
    builder.check_mgmt_free(topo)
    lab.create()
    t0 = time.monotonic()
    try:
        with lab.locked():
            step(f"building {describe(spec)}")
            builder.build(topo)
            step("waiting for carrier on every port")
            builder.wait_links_up(topo)  # before snmpd starts: it caches the interface table
            sh.run(["ip", "link", "set", "dev", topo.bridge, "alias", str(lab.root)])
            t = now()
            state = {"version": 1, "lab": _lab_info(topo, lab, spec, t), "snmp": inventory.new_snmp_credentials(),
                     "nodes": {}, "links": _links_info(topo), "withdrawn": [], "faults": [], "clocks": {},
                     "traffic": []}
            step(f"starting lldpd and the switches' {' and '.join(spec.southbound)} agents")
            _ensure_gnmi(topo, lab, state)
            _ensure_cli(topo, lab, state)
            _ensure_services(topo, lab, state)
            lab.save(state)
            services.wait_ready(topo, lab, state)
            inventory.write_config(topo, lab, state["snmp"], state.get("gnmi"))
            state["lab"]["build_seconds"] = round(time.monotonic() - t0, 3)
            lab.save(state)
    except BaseException as e:
        cleanup.remove(spec.prefix, lab, keep_dir=True)  # keep logs to explain the failure
        if isinstance(e, sh.LabError):
            raise sh.LabError(f"{e}\n(the half-built lab was removed; its logs stay in {lab.root} "
                              "until `nms lab down`)") from None
        raise
    return state, True


def down(lab: LabDir, prefix: str, keep_dir: bool = False) -> cleanup.Leftovers:
    sh.require_root()
    if lab.exists():
        try:
            prefix = lab.load()["lab"]["spec"]["prefix"]
        except (sh.LabError, KeyError):
            pass  # corrupt state: fall back to the given prefix
    return cleanup.remove(prefix, lab, keep_dir=keep_dir)


def describe(spec: Spec) -> str:
    return (f"{spec.spines} spines x {spec.leaves} leaves x {spec.hosts_per_leaf} hosts/leaf, "
            f"{format_rate(spec.link_rate_bps)}bit/s links, MTU {spec.mtu}, southbound {','.join(spec.southbound)}")


def _lab_info(topo: Topology, lab: LabDir, spec: Spec, t: dict) -> dict:
    return {
        "lab_dir": str(lab.root), "spec": asdict(spec), "created_ns": t["ns"], "created_iso": t["iso"],
        "config": str(lab.config), "token_file": str(lab.token), "state": str(lab.state),
        "mgmt": {"subnet": spec.mgmt_subnet, "gateway": topo.mgmt_gateway, "bridge": topo.bridge},
        "fabric_subnet": str(FABRIC_NET), "wire_netns": topo.wire_ns,
    }


def _links_info(topo: Topology) -> list[dict]:
    return [{"name": link.name, "kind": link.kind, "a": str(link.a), "b": str(link.b),
             "a_address": link.a.address, "b_address": link.b.address,
             "rate_bps": topo.spec.link_rate_bps, "mtu": topo.spec.mtu} for link in topo.links]


def _ensure_gnmi(topo: Topology, lab: LabDir, state: dict) -> None:
    """gNMI credentials (kept in state.json, new for a lab built before gNMI), the password file
    and the TLS files; a target still running with a replaced certificate is restarted."""
    if "gnmi" not in topo.spec.southbound:
        return
    state.setdefault("gnmi", inventory.new_gnmi_credentials(lab))
    for name in inventory.write_gnmi_files(topo, lab, state["gnmi"]):
        pid = state["nodes"].get(name, {}).get("pids", {}).get("gnmi")
        if services.alive(pid, topo.netns(name)):
            services.kill([pid])


def _ensure_cli(topo: Topology, lab: LabDir, state: dict) -> None:
    """The CLI collector's key, the switches' host keys and known_hosts; an sshd still running with
    a replaced host key is restarted."""
    if "cli" not in topo.spec.southbound:
        return
    if not (shutil.which("ssh-keygen") and os.path.exists(services.SSHD)):
        raise sh.LabError(f"--southbound cli needs OpenSSH's sshd ({services.SSHD}) and ssh-keygen: "
                          "apt-get install openssh-server")
    for name in inventory.write_cli_files(topo, lab):
        pid = state["nodes"].get(name, {}).get("pids", {}).get("sshd")
        if services.alive(pid, topo.netns(name)):
            services.kill([pid])


def _ensure_services(topo: Topology, lab: LabDir, state: dict) -> None:
    """Start every service that is not running (all of them on a fresh lab)."""
    for node in topo.nodes.values():
        info = state["nodes"].setdefault(node.name, {
            "role": node.role, "netns": topo.netns(node.name), "mgmt_address": node.mgmt_address,
            "leaf": f"leaf{node.leaf}" if node.leaf else None,
            "ports": [{"name": p.name, "address": p.address,
                       "peer": str(topo.link_of_port(node.name, p.name).other(node.name))} for p in node.ports],
            "pids": {}})
        ifindex = builder.ifindexes(topo, node.name) if node.role != "host" else {}
        for p in info["ports"]:
            p["ifindex"] = ifindex.get(p["name"])
        for name, start in services.for_node(topo.spec, node.role).items():
            if not services.alive(info["pids"].get(name), topo.netns(node.name)):
                info["pids"][name] = start(topo, lab, node, state, ifindex)


def status(lab: LabDir, live: bool = True) -> dict:
    """The ground truth, plus (as root) what is running now: service liveness and link oper state."""
    state = lab.load()
    if not live:
        return state
    topo = topology_of(state)
    oper: dict[str, str] = {}
    for node in topo.nodes:
        out = sh.run(["ip", "-n", topo.netns(node), "-j", "link", "show"], check=False)
        for i in json.loads(out.stdout or "[]") if out.returncode == 0 else []:
            oper[f"{node}:{i['ifname']}"] = i.get("operstate", "UNKNOWN").lower()
    for info in state["nodes"].values():
        info["services"] = {svc: services.alive(pid, info["netns"]) for svc, pid in info["pids"].items()}
    for link in state["links"]:
        link["oper"] = {"a": oper.get(link["a"], "absent"), "b": oper.get(link["b"], "absent")}
    state["checked_ns"] = now()["ns"]
    return state
