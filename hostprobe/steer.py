"""The agent's side of host_reroute: `steer` and `unsteer` commands, and the steering
table that the job's traffic follows (docs/steering.md).

`steer` {"action_id", "element", "avoid_hops": [ip...], "dsts": [peer host...], "proto": "udp",
"dport": 4791, "expires_ns", "hop_loads": {ip: utilization}, "rank", "movers",
"routes": {peer host: [[ip...]...]}}: for every NIC
address of each peer, Paris-traceroute (hostprobe.trace) each candidate source port with the
flow's own 5-tuple (our address:port -> peer:dport), or take its path from the port map, keep
`ports_per_dst` of the ports whose forward hops include none of `avoid_hops` (a trace with a
silent router in it is unknown and never kept): first, for each of the service's planned `routes`
to the peer, a port whose hops hold every address of the route (the service placed every mover's
flows at once: correlator.actions.placement); the rest with `hop_loads`, this agent's slots (its `rank`
among the `movers` behind its switch) of their one stripe over the avoiding routes, filled to one
level (correlator.actions.steering.stripe), else the lowest; and write them to the steering
table. The result:
{"dsts": {host: {"ports": [...], "candidates": n, "kept": k}}}. A dst where no port avoids the
element gets no entry (its traffic keeps hashing as before) and says so in the result.

The table is JSON, replaced atomically (write a temporary file, fsync, rename):
  {"version": n, "updated_ns": t,
   "routes": {"<dst ip>": {"ports": [...], "action_ids": [...], "expires_ns": t}}}
A later steer to the same dst replaces its ports and adds its action id; `unsteer` {"action_id"}
removes that id, and an entry left without ids goes. Expired entries are dropped on every write
(and readers ignore them anyway).

The traces run in a thread of their own, on sockets of their own (so the probe loop never waits),
and only one steer runs at a time.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from correlator.actions.steering import choose, stripe
from hostprobe.trace import Dest, TraceJob, Tracer, run_blocking
from hostprobe.tstamp import StampedSocket

log = logging.getLogger(__name__)

ROCE_V2_PORT = 4791
TRACE_DEADLINE = 15.0  # seconds: a steer gives up on traces still running after this


class SteerError(ValueError):
    pass


@dataclass(frozen=True)
class Peer:
    """One (our address, its address) pair of a peer host, as the prober knows it: `routers` on
    every path to it (None when unknown) and `paths`, the prober's path ids to it (they change when
    routing does, which makes the port map's entry for the pair stale)."""
    local: str
    addr: str
    routers: int | None = None
    paths: frozenset[str] = frozenset()


def read_table(path: Path) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {"version": 0, "updated_ns": 0, "routes": {}}
    if not isinstance(table, dict) or not isinstance(table.get("routes"), dict):
        raise SteerError(f"steering table {path} is not a steering table")
    return table


def live_routes(table: dict, now_ns: int | None = None) -> dict[str, list[int]]:
    """{dst ip: ports} of the entries not past their expiry: what traffic follows."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    out = {}
    for dst, entry in (table.get("routes") or {}).items():
        try:
            expires, ports = entry.get("expires_ns"), [int(p) for p in entry["ports"]]
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a malformed entry steers nothing
        if ports and (expires is None or expires > now_ns):
            out[dst] = ports
    return out


def write_table(path: Path, table: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".steering-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # the job's traffic (another user) reads it
        os.replace(tmp, path)
    except BaseException:
        with_suppressed_unlink(tmp)
        raise


def with_suppressed_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _int(args: dict, name: str, lo: int, hi: int) -> int:
    v = args.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise SteerError(f"bad {name} {v!r}: want an integer in [{lo}, {hi}]")
    return v


def parse_steer(args: dict) -> dict:
    """The steer arguments, checked; raises SteerError naming the bad field."""
    hops = args.get("avoid_hops")
    if not isinstance(hops, list) or not hops or not all(isinstance(h, str) for h in hops):
        raise SteerError("bad avoid_hops: want a non-empty list of addresses")
    dsts = args.get("dsts")
    if not isinstance(dsts, list) or not dsts or not all(isinstance(d, str) for d in dsts):
        raise SteerError("bad dsts: want a non-empty list of peer host names")
    if args.get("proto", "udp") != "udp":
        raise SteerError(f"bad proto {args.get('proto')!r}: only udp is steered")
    loads = args.get("hop_loads", {})
    if not isinstance(loads, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e6
            for k, v in loads.items()):
        raise SteerError("bad hop_loads: want {address: utilization >= 0}")
    routes = args.get("routes", {})
    if not isinstance(routes, dict) or not all(
            isinstance(d, str) and isinstance(rs, list) and all(
                isinstance(r, list) and r and all(isinstance(h, str) for h in r) for r in rs)
            for d, rs in routes.items()):
        raise SteerError("bad routes: want {peer host: [[address...]...]}")
    out = {"action_id": _int(args, "action_id", 0, 2**63), "avoid_hops": set(hops), "dsts": dsts,
           "routes": {d: [tuple(r) for r in rs] for d, rs in routes.items()},
           "hop_loads": {k: float(v) for k, v in loads.items()},
           "rank": _int({"rank": args.get("rank", 0)}, "rank", 0, 1 << 16),
           "dport": _int({"dport": args.get("dport", ROCE_V2_PORT)}, "dport", 1, 65535),
           "expires_ns": _int(args, "expires_ns", 0, 2**63), "element": str(args.get("element", ""))}
    out["movers"] = _int({"movers": args.get("movers", out["rank"] + 1)}, "movers", 1, 1 << 16)
    if out["rank"] >= out["movers"]:
        raise SteerError(f"bad rank {out['rank']}: want less than movers ({out['movers']})")
    if out["expires_ns"] <= time.time_ns():
        raise SteerError("expires_ns is in the past")
    return out


class Steering:
    """The agent's steering: runs `steer` in a thread, applies `unsteer` at once, owns the table."""

    def __init__(self, settings, path: Path, key: bytes, session: int, max_hops: int, trace_rate: float,
                 next_seq):
        self.settings, self.path = settings, Path(path)
        self.key, self.session, self.max_hops, self.trace_rate = key, session, max_hops, trace_rate
        self.next_seq = next_seq
        self.lock = threading.Lock()  # table writes
        self.busy = threading.Lock()  # one trace round at a time (a steer, or one pair of the warm-up)
        # the port map: (local, addr, dport) -> (monotonic time traced, the peer's path ids then,
        # [(port, hops or None)]): a steer answers from it without tracing (docs/steering.md)
        self.known: dict[tuple[str, str, int], tuple[float, frozenset[str], list]] = {}
        self._warming = False
        # action id -> the hops its steer avoids: a later steer to the same dst replaces the dst's
        # ports, so they avoid the earlier actions' hops too (else it puts flows back onto them)
        self.avoiding: dict[int, frozenset[str]] = {}

    # -- the table ---------------------------------------------------------------------------------
    def _update(self, change: Callable[[dict], None]) -> dict:
        with self.lock:
            table = read_table(self.path)
            change(table["routes"])
            now = time.time_ns()
            table["routes"] = {d: e for d, e in table["routes"].items()
                               if e.get("expires_ns") is None or e["expires_ns"] > now}
            table["version"] = int(table.get("version", 0)) + 1
            table["updated_ns"] = now
            write_table(self.path, table)
            return table

    def unsteer(self, args: dict) -> tuple[str, str]:
        action_id = _int(args, "action_id", 0, 2**63)
        removed = []

        def change(routes: dict) -> None:
            for dst, entry in list(routes.items()):
                if action_id in entry.get("action_ids", []):
                    entry["action_ids"] = [a for a in entry["action_ids"] if a != action_id]
                    removed.append(dst)
                    if not entry["action_ids"]:
                        del routes[dst]
        self._update(change)
        self.avoiding.pop(action_id, None)
        return "done", f"action {action_id}: steering removed for {len(removed)} destination(s)"

    # -- steer -------------------------------------------------------------------------------------
    # -- the port map ------------------------------------------------------------------------------
    def fresh(self, peer: Peer, dport: int) -> list | None:
        """The mapped (port, hops) of a pair, if traced within `warm_every` and routing has not
        changed since (the prober's paths to the peer are the same)."""
        entry = self.known.get((peer.local, peer.addr, dport))
        if entry is None or time.monotonic() - entry[0] > self.settings.warm_every or entry[1] != peer.paths:
            return None
        return entry[2]

    def map_size(self, peers: dict[str, list[Peer]]) -> int:
        """How many of `peers`' pairs the map answers for (the agent's `steer_map` stat)."""
        return sum(1 for ps in peers.values() for p in ps if self.fresh(p, self.settings.warm_dport) is not None)

    def warm(self, peers: dict[str, list[Peer]]) -> int:
        """Trace, in a background thread, the candidate ports of every pair the map has no fresh
        entry for, one pair at a time (a steer waits for one pair at most). Pairs whose paths the
        prober has not traced whole yet wait. Returns how many pairs are due."""
        if self.settings.warm_every <= 0 or self._warming:
            return 0
        dport = self.settings.warm_dport
        due = [(host, p) for host, ps in sorted(peers.items()) for p in ps
               if p.routers is not None and self.fresh(p, dport) is None]
        if not due:
            return 0
        self._warming = True

        def work() -> None:
            try:
                for host, peer in due:
                    with self.busy:
                        self.trace([(host, peer)], dport)
            except Exception:
                log.exception("warming the port map failed")
            finally:
                self._warming = False
        threading.Thread(target=work, name="steer-warm", daemon=True).start()
        return len(due)

    # -- steer -------------------------------------------------------------------------------------
    def start_steer(self, args: dict, peers: dict[str, list[Peer]],
                    done: Callable[[str, str, dict | None], None]) -> str:
        """Check the arguments now (SteerError), answer from the port map or trace in a thread, call
        done(status, message, details) at the end. `peers`: host -> its Peers (the probe targets)."""
        parsed = parse_steer(args)
        unknown = [d for d in parsed["dsts"] if d not in peers]
        if unknown:
            raise SteerError(f"not peers of this agent: {', '.join(unknown)}")

        def work() -> None:
            if not self.busy.acquire(timeout=TRACE_DEADLINE):
                done("failed", "another steer is still tracing", None)
                return
            try:
                details = self.steer(parsed, peers)
                kept = sum(1 for d in details["dsts"].values() if d["ports"])
                done("done", f"action {parsed['action_id']}: {kept} of {len(details['dsts'])} "
                             f"destination(s) steered off {parsed['element'] or 'the hops'}", details)
            except Exception as e:  # the thread must report, whatever happened
                log.exception("steer failed")
                done("failed", f"steer failed: {type(e).__name__}: {e}", None)
            finally:
                self.busy.release()
        threading.Thread(target=work, name="steer", daemon=True).start()
        pairs = [p for d in parsed["dsts"] for p in peers[d]]
        mapped = sum(1 for p in pairs if self.fresh(p, parsed["dport"]) is not None)
        return (f"{mapped} of {len(pairs)} pair(s) from the port map; tracing {self.settings.candidates} "
                f"source ports to the rest")

    def steer(self, parsed: dict, peers: dict[str, list[Peer]]) -> dict:
        pairs = [(host, p) for host in parsed["dsts"] for p in peers[host]]
        dport = parsed["dport"]
        traced = {(p.local, p.addr): found for _, p in pairs if (found := self.fresh(p, dport)) is not None}
        traced |= self.trace([(h, p) for h, p in pairs if (p.local, p.addr) not in traced], dport)
        result: dict[str, dict] = {}
        routes: dict[str, list[int]] = {}
        self.avoiding[parsed["action_id"]] = frozenset(parsed["avoid_hops"])
        steered = read_table(self.path)["routes"]
        # a trace with a silent router could cross anything; and what the live actions that steer a
        # dst already avoid is avoided too (this steer replaces their ports)
        avoid_of = {(p.local, p.addr): {"?"}.union(parsed["avoid_hops"], *(
            self.avoiding.get(a, ()) for a in (steered.get(p.addr) or {}).get("action_ids") or []))
            for _, p in pairs}
        n = self.settings.ports_per_dst
        # planned routes that no candidate takes: further blocks of source ports traced for those pairs
        # (a block the port map holds already from an earlier search is not traced again)
        for block in range(1, self.settings.route_search + 1):
            short = [(h, p) for h, p in pairs
                     if len(have := traced.get((p.local, p.addr), [])) < (block + 1) * self.settings.candidates
                     and len(follow(want := parsed["routes"].get(h, []), _paths(have), avoid_of[(p.local, p.addr)],
                                    n)) < min(n, len(want))]
            for key, found in self.trace(short, dport, block).items():
                known = {port for port, _ in traced.get(key, [])}
                traced[key] = traced.get(key, []) + [f for f in found if f[0] not in known]
        candidates = [(host, p.addr, found, _paths(found), avoid_of[(p.local, p.addr)]) for host, p in pairs
                      for found in [traced.get((p.local, p.addr), [])]]
        for j, (host, addr, found, paths, avoid) in enumerate(candidates):
            # the movers behind our switch place at once on the same loads: each takes its own run
            # of their one stripe (docs/steering.md), in `rank` order, this one's pairs in turn
            planned = follow(parsed["routes"].get(host, []), paths, avoid, n)
            keep = planned + [i for i in self.place(paths, avoid, parsed["hop_loads"],
                                                    (parsed["rank"] * len(candidates) + j) * n,
                                                    parsed["movers"] * len(candidates) * n)
                              if i not in planned][:n - len(planned)]
            ports = sorted(found[i][0] for i in keep)
            entry = result.setdefault(host, {"ports": [], "candidates": 0, "kept": 0, "planned": 0})
            entry["planned"] += len(planned)
            entry["ports"] += ports
            entry["candidates"] += len(found)
            entry["kept"] += sum(1 for p in paths if not avoid.intersection(p))
            if ports:
                routes[addr] = ports

        def change(table_routes: dict) -> None:
            for addr, ports in routes.items():
                old = table_routes.get(addr) or {}
                ids = [a for a in old.get("action_ids", []) if a != parsed["action_id"]] + [parsed["action_id"]]
                table_routes[addr] = {"ports": ports, "action_ids": ids,
                                      "expires_ns": max(parsed["expires_ns"], old.get("expires_ns") or 0)}
        table = self._update(change)
        log.info("steer %d off %s: %s (table version %d)", parsed["action_id"], parsed["element"],
                 {h: r["ports"] for h, r in result.items()}, table["version"])
        return {"dsts": result}

    def place(self, paths: list[tuple[str, ...]], avoid: set[str], hop_loads: dict[str, float], slot: int,
              slots: int) -> list[int]:
        """The kept candidates of one dst: with `hop_loads` (and a `port_load`), this agent's slots of
        the stripe of all `slots` of the movers' ports over the avoiding routes (`stripe`); without,
        the lowest ports that avoid (or, `port_load` 0, the least loaded: `choose`)."""
        n = self.settings.ports_per_dst
        if hop_loads and self.settings.port_load > 0:
            return stripe(paths, avoid, hop_loads, n, slot, slots, self.settings.port_load)
        return choose([frozenset(p) for p in paths], avoid, load=hop_loads, n=n)

    def trace(self, pairs: list[tuple[str, Peer]], dport: int, block: int = 0) -> dict[tuple[str, str], list]:
        """Forward hops of every candidate source port to every (local, peer) address pair; the
        port map remembers them. `block` k > 0: the k-th block of `candidates` ports past them
        (a search for planned routes), added to the pair's map entry."""
        if not pairs:
            return {}
        started = time.monotonic()
        out = self._trace(pairs, dport, self.settings.port_base + block * self.settings.candidates)
        for _host, peer in pairs:
            key, found = (peer.local, peer.addr, dport), out[(peer.local, peer.addr)]
            if any(hops is None for _, hops in found):
                continue  # a silent hop (a fault on the way) maps nothing
            if not block:
                self.known[key] = (started, peer.paths, found)
            elif key in self.known:
                entry = self.known[key]
                self.known[key] = (entry[0], entry[1], entry[2] + [f for f in found if f[0] not in
                                                                   {port for port, _ in entry[2]}])
        return out

    def _trace(self, pairs: list[tuple[str, Peer]], dport: int, base: int) -> dict[tuple[str, str], list]:
        s = self.settings
        tracer = Tracer(self.key, self.session, self.max_hops, self.trace_rate, self.next_seq)
        sockets: dict[str, list[StampedSocket]] = {}
        jobs: dict[tuple[str, str], list[TraceJob]] = {}
        try:
            for _host, peer in pairs:
                local, addr = peer.local, peer.addr
                if local not in sockets:
                    sockets[local] = _open(local, base, s.candidates)
                dest = Dest(addr, dport, known_hops=peer.routers)
                for sock in sockets[local]:
                    job = TraceJob(sock, dest)
                    jobs.setdefault((local, addr), []).append(job)
                    tracer.add(job)
            run_blocking(tracer, [sk for socks in sockets.values() for sk in socks], TRACE_DEADLINE)
        finally:
            for socks in sockets.values():
                for sk in socks:
                    sk.close()
        out = {}
        for key, js in jobs.items():
            out[key] = [(j.sport, [h for h in j.fwd] if j.finished and None not in j.fwd else None)
                        for j in js]
        return out


def _paths(found: list) -> list[tuple[str, ...]]:
    """The traced candidates' hops; ECMP paths are equal-cost, so a full trace has as many hops as
    the longest one: a shorter one lost a hop (it may be the avoided one), as unknown ("?") as a
    silent router."""
    full = max((len(h) for _, h in found if h is not None), default=0)
    return [tuple(h) if h is not None and len(h) == full else ("?",) for _, h in found]


def follow(routes: list[tuple[str, ...]], paths: list[tuple[str, ...]], avoid: set[str], n: int) -> list[int]:
    """For each planned route in turn (up to `n`), an unused candidate whose traced hops hold every
    address of the route and none of `avoid`; a route no candidate takes is skipped (its flow is
    placed as the agent would)."""
    out: list[int] = []
    for route in routes:
        if len(out) == n:
            break
        want = set(route)
        i = next((i for i, p in enumerate(paths) if i not in out and want.issubset(p) and not avoid.intersection(p)),
                 None)
        if i is not None:
            out.append(i)
    return out


def _open(address: str, base: int, count: int) -> list[StampedSocket]:
    """`count` sockets on free ports from `base` up (ports the job or the prober hold are skipped)."""
    out: list[StampedSocket] = []
    port = base
    while len(out) < count and port <= 65535:
        try:
            out.append(StampedSocket(address, port))
        except OSError as e:
            if e.errno != 98:  # EADDRINUSE: try the next one
                for sk in out:
                    sk.close()
                raise
        port += 1
    return out

