"""Real faults, injected into the running lab and recorded as ground truth in state.json.

    link-down   carrier loss on both ends (wire ends down; no end is admin-down).
                mode=blackhole: routes stay; the dead nexthop keeps its share of ECMP
                  (ignore_routes_with_linkdown=0), so flows hashed onto it are lost. What a fabric
                  does before (or without) a control plane reacting. Default.
                mode=failover: ignore_routes_with_linkdown=1 on both ends and the link is withdrawn
                  from every switch's routes, as converged BGP+BFD would; no flow is lost.
    flap        link-down/up cycles (period, count, down_for) by a background process that
                survives the CLI; `heal` or `down` stops it. Both modes as above.
    congestion  TBF rate cut on one or both ends of a link (run `nms lab traffic` for the load).
    loss        nftables netdev-ingress `numgen random` drop of N% of the frames arriving at one
                end: one direction of a corrupting link, invisible to interface error counters.
    blackhole   a partial blackhole: nftables netdev-ingress `jhash` at one end drops every packet of
                the flows whose hash falls under --fraction, the other flows pass untouched (a bad ECMP
                member, a corrupted forwarding entry). --by flow (default): UDP by (source address,
                source port), so some source ports of a host die and others live; --by dst: all IPv4
                to a hashed subset of destination addresses. The hash seed is recorded (ground truth).
    mtu         one end's MTU changed (default 1500 vs the lab's 9000): larger frames sent to it
                are dropped on receipt (counted as its rx dropped).
    nic-down    a host's fabric NIC set administratively down, and its leaf port loses carrier
                (a dark NIC; the host's own route through it is deleted, as on a real host).
    switch-down a whole switch dies: every link of it loses carrier at once (one `ip -batch` in the
                wire namespace, as link-down's blackhole mode: no port is admin-down, routes stay);
                its management plane (snmpd, gNMI, sshd) keeps answering. Claims every link's carrier.
    clock       recorded only: namespaces share the kernel clock, so the host agent applies
                offset + drift to its own timestamps (see clock_error_ns).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

from lab import builder, cleanup, netns, routing, services, sh
from lab.state import LabDir, now, topology_of
from lab.topology import Link, Topology, format_rate, parse_rate

KINDS = ("link-down", "flap", "congestion", "loss", "blackhole", "mtu", "nic-down", "switch-down", "clock")
OPTIONS = {"link-down": {"mode"}, "flap": {"mode", "period", "down_for", "count"}, "congestion": {"rate", "from_node"},
           "loss": {"percent", "from_node"}, "blackhole": {"fraction", "from_node", "by", "seed"},
           "mtu": {"mtu", "end"}, "nic-down": set(), "switch-down": set(), "clock": {"offset_us", "drift_ppm"}}
MODES = ("blackhole", "failover")
BLACKHOLE_KEYS = {"flow": "ip saddr . udp sport", "dst": "ip daddr"}  # --by -> what the hash reads
HASH_MOD = 10000


# --- mechanisms (shared with flap.py) -------------------------------------------------------

def set_carrier(topo: Topology, link: Link, up: bool) -> None:
    set_carriers(topo, [link], up)


def set_carriers(topo: Topology, links: list[Link], up: bool) -> None:
    """Carrier of every given link, both ends, in one `ip -batch` (a dead switch's links go at once)."""
    state = "up" if up else "down"
    sh.ip_batch(topo.wire_ns, [f"link set {wire} {state}" for link in links for wire in (link.wire_a, link.wire_b)])


def set_withdrawn(topo: Topology, state: dict, link: Link, withdrawn: bool) -> None:
    """Failover: local (sysctl on both ends) and fabric-wide (routes recomputed without the link)."""
    for port in (link.a, link.b):
        netns.write_sysctls(topo.netns(port.node),
                            {f"net.ipv4.conf.{port.name}.ignore_routes_with_linkdown": int(withdrawn)})
    gone = set(state["withdrawn"])
    gone = gone | {link.name} if withdrawn else gone - {link.name}
    state["withdrawn"] = sorted(gone)
    routing.apply(topo, gone, weights=state.get("ecmp_weights"))


def link_down(topo: Topology, state: dict, link: Link, mode: str, down: bool) -> None:
    """One down or up transition of a link, in blackhole or failover mode."""
    if down:
        set_carrier(topo, link, up=False)
        if mode == "failover":
            set_withdrawn(topo, state, link, True)
    else:
        if mode == "failover":
            set_withdrawn(topo, state, link, False)
        set_carrier(topo, link, up=True)


def clock_error_ns(state: dict, host: str, real_ns: int) -> int:
    """How far `host`'s emulated clock is from real time at `real_ns` (0 without a clock fault)."""
    c = state.get("clocks", {}).get(host)
    if not c:
        return 0
    return int(c["offset_ns"] + c["drift_ppm"] * 1e-6 * (real_ns - c["ref_ns"]))


# --- parameters -------------------------------------------------------------------------

def _first_node(target: str) -> str:
    return target.replace(":", "-").split("-", 1)[0]


def make_params(topo: Topology, kind: str, target: str, opts: dict) -> tuple[dict, list[str]]:
    """Validate options; return (params, claims). A claim names what the fault holds, so two
    faults cannot fight over the same thing (e.g. two congestion faults on one port)."""
    opts = {k: v for k, v in opts.items() if v is not None}
    if kind not in KINDS:
        raise sh.LabError(f"unknown fault kind {kind!r}; choose one of {', '.join(KINDS)}")
    stray = sorted(set(opts) - OPTIONS[kind])
    if stray:
        names = ", ".join("--" + ("from" if o == "from_node" else o.replace("_", "-")) for o in stray)
        raise sh.LabError(f"{kind} does not take {names}")
    if kind in ("nic-down", "clock"):
        host = target.split(":", 1)[0]
        if host not in topo.nodes or topo.nodes[host].role != "host":
            raise sh.LabError(f"{kind} needs a host (e.g. host1), got {target!r}")
        if kind == "nic-down":
            link = topo.link_of_port(host, "eth0")
            return {"host": host, "nic": "eth0", "link": link.name}, [f"nic:{host}", f"carrier:{link.name}"]
        p = {"host": host, "offset_us": float(opts.get("offset_us", 0.0)),
             "drift_ppm": float(opts.get("drift_ppm", 0.0))}
        if p["offset_us"] == 0 and p["drift_ppm"] == 0:
            raise sh.LabError("clock needs --offset-us and/or --drift-ppm")
        return p, [f"clock:{host}"]
    if kind == "switch-down":
        if target not in topo.nodes or topo.nodes[target].role not in ("spine", "leaf"):
            switches = ", ".join(n.name for n in topo.switches[:3])
            raise sh.LabError(f"switch-down needs a switch (e.g. {switches}), got {target!r}")
        links = [link.name for link in topo.links if target in (link.a.node, link.b.node)]
        return {"switch": target, "links": links}, [f"carrier:{name}" for name in links]
    try:
        link = topo.find_link(target)
    except ValueError as e:
        raise sh.LabError(str(e)) from None
    p: dict = {"link": link.name, "a": str(link.a), "b": str(link.b)}
    if kind in ("link-down", "flap"):
        mode = opts.get("mode", "blackhole")
        if mode not in MODES:
            raise sh.LabError(f"mode must be one of {MODES}")
        p["mode"] = mode
        if kind == "flap":
            period = float(opts.get("period", 4.0))
            down_for = float(opts.get("down_for", period / 2))
            count = int(opts.get("count", 5))
            if period <= 0 or not 0 < down_for < period or count < 0:
                raise sh.LabError("flap needs period > 0, 0 < down_for < period, count >= 0 (0 = until healed)")
            p.update(period=period, down_for=down_for, count=count)
        return p, [f"carrier:{link.name}"]
    first = _first_node(target)
    if kind == "congestion":
        rate = parse_rate(opts.get("rate") or max(topo.spec.link_rate_bps // 10, 1000))
        if rate >= topo.spec.link_rate_bps:
            raise sh.LabError(f"congestion --rate must be below the link rate ({format_rate(topo.spec.link_rate_bps)})")
        ends = [opts["from_node"]] if "from_node" in opts else [link.a.node, link.b.node]
        for n in ends:
            if n not in (link.a.node, link.b.node):
                _bad_end(link, n)
        p.update(rate_bps=rate, rate=format_rate(rate), egress_of=ends)
        return p, [f"rate:{link.name}:{n}" for n in ends]
    if kind == "loss":
        src = opts.get("from_node", first)
        if src not in (link.a.node, link.b.node):
            _bad_end(link, src)
        pct = float(opts.get("percent", 5.0))
        if not 0 < pct <= 100:
            raise sh.LabError("loss --percent must be within (0, 100]")
        dst = link.other(src).node
        p.update(percent=pct, direction=f"{src}->{dst}", dropped_at=str(link.end(dst)))
        return p, [f"loss:{link.name}:{dst}"]
    if kind == "blackhole":
        src = opts.get("from_node", first)
        if src not in (link.a.node, link.b.node):
            _bad_end(link, src)
        fraction = float(opts.get("fraction", 0.5))
        if not 0 < fraction < 1:
            raise sh.LabError("blackhole --fraction must be within (0, 1): all or none is not a partial blackhole")
        by = opts.get("by", "flow")
        if by not in BLACKHOLE_KEYS:
            raise sh.LabError(f"blackhole --by must be one of {', '.join(BLACKHOLE_KEYS)}")
        seed = int(opts["seed"]) if "seed" in opts else random.getrandbits(32)
        if not 0 <= seed < 2**32:
            raise sh.LabError("blackhole --seed must be within 0..2^32-1")
        dst = link.other(src).node
        p.update(fraction=fraction, by=by, hash=BLACKHOLE_KEYS[by], seed=seed, direction=f"{src}->{dst}",
                 dropped_at=str(link.end(dst)))
        return p, [f"blackhole:{link.name}:{dst}"]
    if kind == "mtu":
        end = opts.get("end", link.other(first).node if first in (link.a.node, link.b.node) else link.b.node)
        if end not in (link.a.node, link.b.node):
            _bad_end(link, end)
        mtu = int(opts.get("mtu", 1500))
        if not 576 <= mtu <= 9216 or mtu == topo.spec.mtu:
            raise sh.LabError(f"--mtu must be within 576..9216 and differ from the lab's {topo.spec.mtu}")
        p.update(port=str(link.end(end)), mtu=mtu, lab_mtu=topo.spec.mtu)
        return p, [f"mtu:{link.name}:{end}"]
    raise AssertionError(kind)


def _bad_end(link: Link, node: str) -> None:
    raise sh.LabError(f"{node} is not an end of {link.name} ({link.a.node} or {link.b.node})")


# --- inject / heal ------------------------------------------------------------------------

def _nft_table(fault_id: str) -> str:
    return f"nmslab_{fault_id}"


def blackhole_ruleset(table: str, port: str, p: dict) -> str:
    """The nftables table of a blackhole fault: drop the flows whose jhash falls under the fraction."""
    match = "meta protocol ip meta l4proto udp" if p["by"] == "flow" else "meta protocol ip"
    return (f"table netdev {table} {{\n chain ingress {{\n"
            f'  type filter hook ingress device "{port}" priority -500; policy accept;\n'
            f"  {match} jhash {p['hash']} mod {HASH_MOD} seed {p['seed']:#x} < {round(p['fraction'] * HASH_MOD)} "
            f"counter drop\n }}\n}}\n")


def _apply(topo: Topology, lab: LabDir, state: dict, f: dict) -> None:
    p, kind = f["params"], f["kind"]
    if kind == "link-down":
        link_down(topo, state, topo.link(p["link"]), p["mode"], down=True)
    elif kind == "flap":
        with open(lab.run_dir / f"flap-{f['id']}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "lab.flap", str(lab.root), f["id"]],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        (lab.run_dir / f"flap-{f['id']}.pid").write_text(f"{proc.pid}\n")
        p["pid"] = proc.pid
    elif kind == "congestion":
        link = topo.link(p["link"])
        for n in p["egress_of"]:
            port = link.end(n)
            sh.tc_batch(topo.netns(n), [_tbf(port.name, p["rate_bps"], topo)])
    elif kind == "loss":
        node, port = p["dropped_at"].split(":")
        ruleset = (f"table netdev {_nft_table(f['id'])} {{\n chain ingress {{\n"
                   f'  type filter hook ingress device "{port}" priority -500; policy accept;\n'
                   f"  numgen random mod 10000 < {round(p['percent'] * 100)} counter drop\n }}\n}}\n")
        sh.run(sh.in_ns(topo.netns(node), ["nft", "-f", "-"]), input=ruleset)
    elif kind == "blackhole":
        node, port = p["dropped_at"].split(":")
        sh.run(sh.in_ns(topo.netns(node), ["nft", "-f", "-"]), input=blackhole_ruleset(_nft_table(f["id"]), port, p))
    elif kind == "mtu":
        node, port = p["port"].split(":")
        sh.ip_batch(topo.netns(node), [f"link set {port} mtu {p['mtu']}"])
    elif kind == "nic-down":  # the NIC goes dark: admin down here, and the leaf port loses carrier
        sh.ip_batch(topo.netns(p["host"]), ["link set eth0 down"])
        set_carrier(topo, topo.link(p["link"]), up=False)
    elif kind == "switch-down":
        set_carriers(topo, [topo.link(name) for name in p["links"]], up=False)
    elif kind == "clock":
        state.setdefault("clocks", {})[p["host"]] = {
            "offset_ns": round(p["offset_us"] * 1000), "drift_ppm": p["drift_ppm"],
            "ref_ns": f["start_ns"], "fault": f["id"]}


def _heal(topo: Topology, lab: LabDir, state: dict, f: dict) -> None:
    p, kind = f["params"], f["kind"]
    if kind == "link-down":
        link_down(topo, state, topo.link(p["link"]), p["mode"], down=False)
    elif kind == "flap":
        pidfile = lab.run_dir / f"flap-{f['id']}.pid"
        services.kill([pid for pid in cleanup.helper_pids(lab) if pid == p.get("pid")])
        pidfile.unlink(missing_ok=True)
        link_down(topo, state, topo.link(p["link"]), p["mode"], down=False)
    elif kind == "congestion":
        link = topo.link(p["link"])
        for n in p["egress_of"]:
            sh.tc_batch(topo.netns(n), [_tbf(link.end(n).name, topo.spec.link_rate_bps, topo)])
    elif kind in ("loss", "blackhole"):  # its own table, and only it, goes
        node = p["dropped_at"].split(":")[0]
        table = _nft_table(f["id"])
        out = sh.run(sh.in_ns(topo.netns(node), ["nft", "-j", "list", "table", "netdev", table]), check=False)
        if out.returncode == 0:
            f["result"] = {"dropped_packets": _nft_counter(out.stdout)}
            sh.run(sh.in_ns(topo.netns(node), ["nft", "delete", "table", "netdev", table]))
    elif kind == "mtu":
        node, port = p["port"].split(":")
        sh.ip_batch(topo.netns(node), [f"link set {port} mtu {p['lab_mtu']}"])
    elif kind == "nic-down":
        set_carrier(topo, topo.link(p["link"]), up=True)
        sh.ip_batch(topo.netns(p["host"]), ["link set eth0 up"])
        routing.apply(
            topo, state["withdrawn"], nodes=[p["host"]], weights=state.get("ecmp_weights")
        )  # admin-down deleted its route
    elif kind == "switch-down":
        set_carriers(topo, [topo.link(name) for name in p["links"]], up=True)
    elif kind == "clock":
        state.get("clocks", {}).pop(p["host"], None)


def _tbf(dev: str, rate: int, topo: Topology) -> str:
    return builder.tbf(dev, rate, topo.spec.mtu)


def _nft_counter(text: str) -> int | None:
    for item in json.loads(text).get("nftables", []):
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return expr["counter"]["packets"]
    return None


def inject(lab: LabDir, kind: str, target: str, **opts) -> dict:
    with lab.update() as state:
        topo = topology_of(state)
        params, claims = make_params(topo, kind, target, opts)
        for other in state["faults"]:
            clash = set(other["claims"]) & set(claims) if other["active"] else set()
            if clash:
                raise sh.LabError(f"fault {other['id']} ({other['kind']} {other['target']}) already holds "
                                  f"{', '.join(sorted(clash))}; heal it first")
        state["next_fault"] = state.get("next_fault", 0) + 1
        t = now()
        fault = {"id": f"f{state['next_fault']}", "kind": kind, "target": target, "params": params,
                 "claims": claims, "active": True, "start_ns": t["ns"], "start_iso": t["iso"],
                 "end_ns": None, "end_iso": None, "events": []}
        _apply(topo, lab, state, fault)
        state["faults"].append(fault)
    return fault


def heal(lab: LabDir, fault_id: str | None = None) -> list[dict]:
    """Heal one fault, or every active one when fault_id is None; returns the healed faults."""
    healed = []
    with lab.update() as state:
        topo = topology_of(state)
        chosen = [f for f in state["faults"] if f["active"] and fault_id in (None, f["id"])]
        if fault_id is not None and not chosen:
            known = {f["id"]: f for f in state["faults"]}
            if fault_id in known:
                raise sh.LabError(f"fault {fault_id} already ended at {known[fault_id]['end_iso']}")
            raise sh.LabError(f"no fault {fault_id}; `nms lab status` lists them")
        for f in reversed(chosen):  # undo in reverse order of injection
            _heal(topo, lab, state, f)
            t = now()
            f.update(active=False, end_ns=t["ns"], end_iso=t["iso"])
            healed.append(f)
    return healed
