"""A synthetic leaf-spine fabric and its telemetry, independent of the correlator (tests + bench).

Naming and addressing follow the lab (lab/topology.py): spineS, leafL, hostH with eth0; a
leaf's host ports are swp1..swpH, its uplinks swp(H+s); spine s's port to leaf L is swpL; routers
answer traceroute from their ingress port. Every switch port has its own address (10.x.y.z).

Each host probes its peers (all others, or K random) on one path per spine (or `paths_per_peer`
random spines); the reply of each path hashes onto an independent random spine, as the lab's ECMP
does on the swapped ports. A window per path per second: 10 exchanges, loss from the links crossed
(fwd and rev) plus background, one-way p50 delays in local clocks (per-host offset and drift),
jitter. Faults: links down (blackhole, both directions; onset and heal land mid-window), loss and
queueing delay per directed link, switch-side utilization / errors / MTU / oper overrides, partial
blackholes per directed link (a hash of the probe's (source, source port) or of the reply's
responder against a fraction, as the lab's `blackhole` fault drops flows).

`validate=False` builds records without pydantic validation (same class, same attributes): the
bench needs a million windows a second. Tests use validated records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from nms.config.models import FabricConfig
from nms.records import HostNicSample, InterfaceAddress, PathEvent, PortRates, PortSample, ProbePath, ProbeWindow

NS = 1_000_000_000
T0 = 1_700_000_000  # seconds: where synthetic time starts


_DEFAULTS: dict = {}


def _fast(cls, values: dict):
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = _DEFAULTS[cls] = {k: f.default for k, f in cls.model_fields.items()}
    obj = cls.__new__(cls)
    d = defaults.copy()
    d.update(values)
    object.__setattr__(obj, "__dict__", d)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def _unit(text: str) -> float:
    """A stable hash of `text` in [0, 1)."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) / 2**32


def undirected(a: str, b: str) -> str:
    return "--".join(sorted((a, b)))


@dataclass
class Synth:
    spines: int = 2
    leaves: int = 3
    hosts_per_leaf: int = 2
    peers: int | None = None  # None: every other host
    paths_per_peer: int | None = None  # None: one per spine
    seed: int = 1
    validate: bool = True
    background_loss: float = 2e-4  # per exchange
    jitter_us: float = 8.0
    clock_offset_us: float = 5000.0
    drift_ppm: float = 40.0
    # faults / overrides (directed names "dev:port->dev:port", undirected "a--b", ends "dev:port")
    down: set = field(default_factory=set)
    loss: dict = field(default_factory=dict)
    queue_us: dict = field(default_factory=dict)
    util: dict = field(default_factory=dict)
    errors_ps: dict = field(default_factory=dict)
    mtu: dict = field(default_factory=dict)
    nic_down: set = field(default_factory=set)
    blackhole: dict = field(default_factory=dict)  # directed name -> fraction of flows dropped entirely
    sent_of: dict = field(default_factory=dict)  # path index -> exchanges a second (focused probing), else 10

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        S, Lv, H = self.spines, self.leaves, self.hosts_per_leaf
        self.hosts = [f"host{i + 1}" for i in range(Lv * H)]
        self.leaf_of = {h: 1 + i // H for i, h in enumerate(self.hosts)}
        self.port_of = {h: 1 + i % H for i, h in enumerate(self.hosts)}
        links: list[tuple[str, str]] = []
        for h in self.hosts:
            links.append((f"{h}:eth0", f"leaf{self.leaf_of[h]}:swp{self.port_of[h]}"))
        for lf in range(1, Lv + 1):
            for s in range(1, S + 1):
                links.append((f"leaf{lf}:swp{H + s}", f"spine{s}:swp{lf}"))
        self.links = [undirected(a, b) for a, b in links]
        self.fabric = FabricConfig(
            switches=[{"name": f"spine{s}", "mgmt_address": "192.0.2.1", "role": "spine"} for s in range(1, S + 1)]
            + [{"name": f"leaf{lf}", "mgmt_address": "192.0.2.1", "role": "leaf"} for lf in range(1, Lv + 1)],
            hosts=[{"name": h, "nics": [{"name": "eth0", "address": "192.0.2.2", "switch": f"leaf{self.leaf_of[h]}",
                                         "switch_port": f"swp{self.port_of[h]}"}]} for h in self.hosts],
            links=[{"a": a, "b": b} for a, b in links if not a.startswith("host")])
        self.switch_ports = [end for a, b in links for end in (a, b) if not end.startswith("host")]
        self.addr = {end: f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i, end in enumerate(self.switch_ports, 1)}
        self.peer_of = {end: b if end == a else a for a, b in links for end in (a, b)}
        self.did: dict[str, int] = {}
        for a, b in links:
            for x, y in ((a, b), (b, a)):
                self.did[f"{x}->{y}"] = len(self.did)
        self._build_paths()
        n = len(self.hosts)
        self.offset_ns = self.rng.uniform(-1, 1, n) * self.clock_offset_us * 1e3
        self.drift = self.rng.uniform(-1, 1, n) * self.drift_ppm * 1e-6
        self.host_idx = {h: i for i, h in enumerate(self.hosts)}
        self.base_util = {
            end: float(u) for end, u in zip(self.switch_ports, self.rng.uniform(0.05, 0.3, len(self.switch_ports)))
        }
        self.prev_down = np.zeros(len(self.keys), bool)

    # -- topology ---------------------------------------------------------------------------
    def up_link(self, leaf: int, spine: int) -> str:
        return f"leaf{leaf}:swp{self.hosts_per_leaf + spine}->spine{spine}:swp{leaf}"

    def down_link(self, spine: int, leaf: int) -> str:
        return f"spine{spine}:swp{leaf}->leaf{leaf}:swp{self.hosts_per_leaf + spine}"

    def access(self, host: str) -> tuple[str, str]:
        """(host -> leaf, leaf -> host) directed names."""
        h, leaf = f"{host}:eth0", f"leaf{self.leaf_of[host]}:swp{self.port_of[host]}"
        return f"{h}->{leaf}", f"{leaf}->{h}"

    def _leg(self, src: str, dst: str, spine: int | None) -> tuple[list[str], list[str]]:
        """Directed links and hop addresses from src to dst via spine (None: same leaf)."""
        ls, ld = self.leaf_of[src], self.leaf_of[dst]
        first = f"leaf{ls}:swp{self.port_of[src]}"
        if spine is None:
            return [self.access(src)[0], self.access(dst)[1]], [self.addr[first]]
        hops = [
            self.addr[first],
            self.addr[f"spine{spine}:swp{ls}"],
            self.addr[f"leaf{ld}:swp{self.hosts_per_leaf + spine}"],
        ]
        return [self.access(src)[0], self.up_link(ls, spine), self.down_link(spine, ld), self.access(dst)[1]], hops

    def _build_paths(self) -> None:
        rng, n = self.rng, len(self.hosts)
        self.keys, self.fwd, self.rev, self.hops, self.spine_of = [], [], [], [], []
        self.sport: list[int] = []  # the source port probing each path
        for i, src in enumerate(self.hosts):
            first = len(self.keys)
            if self.peers is None:
                peers = [j for j in range(n) if j != i]
            else:  # K distinct others
                peers = rng.choice(n - 1, min(self.peers, n - 1), replace=False)
                peers = [int(j) + (j >= i) for j in peers]
            for j in peers:
                dst = self.hosts[j]
                same = self.leaf_of[src] == self.leaf_of[dst]
                k = self.spines if self.paths_per_peer is None else min(self.paths_per_peer, self.spines)
                spines = [None] if same else sorted(rng.choice(self.spines, k, replace=False) + 1)
                for s in spines:
                    r = None if s is None else int(rng.integers(1, self.spines + 1))
                    f_links, f_hops = self._leg(src, dst, None if s is None else int(s))
                    r_links, r_hops = self._leg(dst, src, r)
                    fh, rh = ",".join(f_hops), ",".join(r_hops)
                    pid = hashlib.sha1(f"{src}>{dst}|{fh}|{rh}".encode()).hexdigest()[:16]
                    self.keys.append((src, "eth0", dst, "eth0", pid))
                    self.sport.append(40000 + len(self.keys) - first)
                    self.fwd.append([self.did[x] for x in f_links])
                    self.rev.append([self.did[x] for x in r_links])
                    self.hops.append((fh, rh))
                    self.spine_of.append((s, r))
        D = len(self.did)
        pad = lambda rows: np.array([row + [D] * (4 - len(row)) for row in rows], np.int64)  # noqa: E731
        self.F, self.R = pad(self.fwd), pad(self.rev)
        at = {h: i for i, h in enumerate(self.hosts)}
        self.src_i = np.array([at[k[0]] for k in self.keys])
        self.dst_i = np.array([at[k[2]] for k in self.keys])

    def paths_through(self, directed: str) -> np.ndarray:
        d = self.did[directed]
        return np.flatnonzero((self.F == d).any(1) | (self.R == d).any(1))

    # -- records ----------------------------------------------------------------------------
    def _make(self, cls, values: dict):
        return cls(**values) if self.validate else _fast(cls, values)

    def inventory_records(self, t: int = T0, with_paths: bool = True) -> list:
        out = [self._make(InterfaceAddress, {"device": e.split(":")[0], "port": e.split(":")[1], "ts": t * NS,
                                             "address": a, "prefix_len": 31}) for e, a in self.addr.items()]
        if with_paths:
            for key, (fh, rh), sport in zip(self.keys, self.hops, self.sport):
                out.append(self._make(ProbePath, {
                    "src_host": key[0], "src_nic": key[1], "dst_host": key[2], "dst_nic": key[3], "path_id": key[4],
                    "ts": t * NS, "src_addr": "192.0.2.10", "dst_addr": "192.0.2.11", "dport": 7000,
                    "sports": str(sport), "probed_sport": sport, "fwd_hops": fh, "rev_hops": rh,
                    "fwd_complete": True, "rev_complete": True}))
        return out

    def _down_directed(self) -> np.ndarray:
        D = len(self.did)
        down = np.zeros(D + 1, bool)
        names = set(self.down) | {undirected(*self.access(h)[0].split("->")) for h in self.nic_down}
        for name in names:
            a, b = name.split("--")
            down[self.did[f"{a}->{b}"]] = down[self.did[f"{b}->{a}"]] = True
        return down

    def blackholed(self) -> np.ndarray:
        """Paths a partial blackhole kills: the probe crosses the link and (source, source port) hashes
        under the fraction, or the reply crosses it and its responder does (the reply's source port is
        the fixed probe port)."""
        out = np.zeros(len(self.keys), bool)
        for name, fraction in self.blackhole.items():
            d = self.did[name]
            for i, key in enumerate(self.keys):
                out[i] |= d in self.fwd[i] and _unit(f"{key[0]}/{self.sport[i]}") < fraction
                out[i] |= d in self.rev[i] and _unit(key[2]) < fraction
        return out

    def windows(self, t: int) -> list:
        """The probe windows of second t (and the path events pushed around then)."""
        D, P = len(self.did), len(self.keys)
        rng = self.rng
        p_link = np.zeros(D + 1)
        for name, p in self.loss.items():
            p_link[self.did[name]] = p
        q = np.zeros(D + 1)
        for name, us in self.queue_us.items():
            q[self.did[name]] = us
        surv = np.prod(1 - p_link[self.F], axis=1) * np.prod(1 - p_link[self.R], axis=1) * (1 - self.background_loss)
        dl = self._down_directed()
        down = dl[self.F].any(1) | dl[self.R].any(1)
        if self.blackhole:
            down |= self.blackholed()
        sent = np.full(P, 10)
        for i, n in self.sent_of.items():
            sent[i] = n
        recv = rng.binomial(sent, surv)
        onset, heal = down & ~self.prev_down, ~down & self.prev_down
        recv[down & self.prev_down] = 0
        recv[onset] = rng.binomial(5, surv[onset])  # the fault lands mid-window
        recv[heal] = rng.binomial(5, surv[heal])
        # an agent holds back the window a path died in until it reports the path down (detected in
        # the next second): the event comes with that window
        events = [(i, "down", t * NS + 1_400_000_000) for i in np.flatnonzero(onset)]
        events += [(i, "up", t * NS + 600_000_000) for i in np.flatnonzero(heal)]
        self.prev_down = down
        elapsed = (t - T0) * NS
        off = self.offset_ns + self.drift * elapsed
        hops = (self.F != D).sum(1)
        jit = self.jitter_us / 3
        fwd_us = 10 + 2 * hops + q[self.F].sum(1) + rng.exponential(jit, P)
        rev_us = 10 + 2 * (self.R != D).sum(1) + q[self.R].sum(1) + rng.exponential(jit, P)
        fwd_ns = (fwd_us * 1e3 + off[self.dst_i] - off[self.src_i]).astype(np.int64)
        rev_ns = (rev_us * 1e3 + off[self.src_i] - off[self.dst_i]).astype(np.int64)
        rtt_ns = ((fwd_us + rev_us) * 1e3 + 15_000).astype(np.int64)
        out = []
        start = t * NS
        for _i, (key, s, r, f, v, rt) in enumerate(zip(self.keys, sent.tolist(), recv.tolist(), fwd_ns.tolist(),
                                                      rev_ns.tolist(), rtt_ns.tolist())):
            has = r > 0
            out.append(self._make(ProbeWindow, {
                "src_host": key[0], "src_nic": key[1], "dst_host": key[2], "dst_nic": key[3], "path_id": key[4],
                "window_start": start, "sent": s, "received": r,
                "owd_fwd_min_ns": f - 2000 if has else None, "owd_fwd_p50_ns": f if has else None,
                "owd_rev_min_ns": v - 2000 if has else None, "owd_rev_p50_ns": v if has else None,
                "rtt_p50_ns": rt if has else None}))
        for i, state, ts in events:
            key = self.keys[i]
            out.append(self._make(PathEvent, {"src_host": key[0], "src_nic": key[1], "dst_host": key[2],
                                              "dst_nic": key[3], "path_id": key[4], "ts": ts, "state": state,
                                              "sport": self.sport[i]}))
        return out

    def switch_records(self, t: int, interval_s: float = 5.0) -> list:
        """One SNMP poll of every switch port: PortSample (oper, MTU) and PortRates."""
        dl = self._down_directed()
        out = []
        for end in self.switch_ports:
            dev, port = end.split(":")
            peer = self.peer_of[end]
            is_down = bool(dl[self.did[f"{end}->{peer}"]])
            out.append(self._make(PortSample, {"device": dev, "port": port, "ts": t * NS,
                                               "oper_status": "down" if is_down else "up",
                                               "mtu": self.mtu.get(end, 9000), "speed_bps": 100_000_000}))
            out_u = self.util.get(f"{end}->{peer}", self.base_util[end])
            in_u = self.util.get(f"{peer}->{end}", self.base_util[peer] if peer in self.base_util else 0.1)
            out.append(self._make(PortRates, {"device": dev, "port": port, "ts": t * NS, "interval_s": interval_s,
                                              "in_utilization": 0.0 if is_down else in_u,
                                              "out_utilization": 0.0 if is_down else out_u,
                                              "in_errors_ps": float(self.errors_ps.get(end, 0.0)),
                                              "out_errors_ps": 0.0, "in_discards_ps": 0.0, "out_discards_ps": 0.0}))
        for h in self.hosts:
            rx_errors = 1000 + int(self.errors_ps.get(f"{h}:eth0", 0.0) * (t - T0))  # the agent's NIC counter
            out.append(self._make(HostNicSample, {"host": h, "nic": "eth0", "ts": t * NS, "rx_errors": rx_errors,
                                                  "oper_status": "down" if h in self.nic_down else "up"}))
        return out
