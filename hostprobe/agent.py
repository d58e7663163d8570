"""`nms-agent --config FILE`: the host probe agent (`--check`: validate the file, start nothing).

One process per host. The probe loop (this module) runs on the main thread with epoll: probe
sends on schedule, replies, follow-ups, TX stamps, ICMP errors, netlink link events. Two daemon
threads do HTTP: the reporter (batches, on-disk buffer) and the control thread (registration,
peers, commands). Everything the probe loop produces is a record of nms.records handed to the
reporter; nothing in the loop blocks on the network.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import logging
import os
import queue
import random
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

from hostprobe import transport, verbs
from hostprobe.client import Control, ServiceClient
from hostprobe.clock_edges import ClockSync
from hostprobe.config import AgentConfig
from hostprobe.counters import NicCounters
from hostprobe.host_clock import Clock
from hostprobe.nccl import NcclListener
from hostprobe.netlink import LinkMonitor
from hostprobe.prober import LocalNic, Prober
from hostprobe.qp_trace import QpTracer
from hostprobe.rdma_qps import QpReporter
from hostprobe.report import Reporter
from hostprobe.responder import Responder, make_responders
from hostprobe.steer import Peer, SteerError, Steering
from hostprobe.tstamp import StampedSocket
from hostprobe.verify import CommandVerifier
from nms import __version__
from nms.agent_commands import focus_args_problem, rate_problem
from nms.records import GenericPoint

log = logging.getLogger("nms-agent")

HOUSEKEEPING = 0.05  # timeouts, traceroute steps, commands (path-down checks also run at their deadlines)
BATCH = 0.02  # the loop polls at most this often: under load each pass handles many packets. The
# stamps are the kernel's, so handling a packet a little later changes no measurement.
SLOW = 0.1  # window closing, counters, stats
SIOCGIFADDR = 0x8915
SHUTDOWN_WAIT = 1.0  # seconds of listening for late replies before the last windows close


def nic_address(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise OSError(e.errno, f"NIC {name}: no IPv4 address ({e.strerror}); set nics[].address") from None
    return socket.inet_ntoa(res[20:24])


def open_sports(address: str, count: int, base: int) -> list[StampedSocket]:
    """`count` stamped sockets on distinct source ports (kernel-chosen when base is 0)."""
    out: list[StampedSocket] = []
    port = base
    while len(out) < count:
        try:
            out.append(StampedSocket(address, port))
        except OSError as e:
            if base == 0 or e.errno != 98 or port >= 65535:  # 98: EADDRINUSE, try the next port
                for s in out:
                    s.close()
                raise OSError(e.errno, f"cannot bind a probe socket on {address}:{port}: {e.strerror}") from None
        if base:
            port += 1
    return out


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.stats: defaultdict[str, int] = defaultdict(int)
        self._last_fields: dict = {}  # the latest status's stats (close() writes them once more)
        self.session = random.getrandbits(63) or 1
        self.clock = Clock(cfg.lab_clock, cfg.host)
        key = cfg.probe.key.get_secret_value().encode()
        addresses = {nic.name: nic.address or nic_address(nic.name) for nic in cfg.nics}
        self.verbs_devices = transport.open_devices(cfg.probe.transport, list(addresses.values()), self.stats)
        self.transport = "verbs" if self.verbs_devices else "udp"
        self.nics: list[LocalNic] = []
        qpns: dict[str, int] = {}  # NIC -> its RDMA UD responder QP, registered for the peers to probe
        verbs_responders = []
        rng = random.Random()
        for name, address in addresses.items():
            socks = open_sports(address, cfg.probe.sports, cfg.probe.sport_base)
            dev = self.verbs_devices.get(address)
            if dev is None:
                self.nics.append(LocalNic(name, address, socks))
                continue
            self.nics.append(LocalNic(name, address, socks, dev.prober,
                                      verbs.open_ports(dev.prober, address, cfg.probe.sports, rng)))
            verbs_responders.append(Responder(dev.responder, key, self.session, self.clock, self.stats))
            qpns[name] = dev.responder.qpn
        self.responders = make_responders(self.nics, cfg.probe.port, key, self.session, self.clock, self.stats)
        self.responders += verbs_responders
        self.buffer_dir = Path(cfg.report.buffer_dir)
        self.buffer_dir.mkdir(parents=True, exist_ok=True)
        self.client = ServiceClient(cfg.service, cfg.host)
        self.reporter = Reporter(self.client, self.buffer_dir, cfg.report.buffer_max_bytes, cfg.report.interval,
                                 self.stats)
        self.nccl = self._nccl_listener()
        self.prober = Prober(cfg.host, self.nics, cfg.probe, key, self.session, self.clock, self.stats,
                             self.reporter.put)
        self.steering = Steering(cfg.steering, cfg.steering.path or self.buffer_dir / "steering.json", key,
                                 self.session, cfg.probe.max_hops, cfg.probe.trace_rate, self.prober.next_seq)
        if self.nccl is not None and self.nccl.qps is not None and cfg.nccl.qp_trace_every:
            self.nccl.qps.tracer = QpTracer(key, self.session, cfg.probe.max_hops, cfg.probe.trace_rate,
                                            self.prober.next_seq, self.stats, cfg.nccl.qp_trace_every,
                                            known_hops=self._routers)
        self.clock.step_threshold_ns = int(cfg.clock_sync.step_threshold_us * 1000)
        self.clock_sync = None
        if cfg.clock_sync.enabled:
            self.clock_sync = ClockSync(cfg.host, self.clock, cfg.clock_sync.window, self.reporter.put,
                                        cfg.clock_sync.max_exchanges)
            self.prober.clock_sync = self.clock_sync
        self.counters = NicCounters(cfg.host, [n.name for n in self.nics], cfg.counters.ethtool)
        self.links = LinkMonitor()
        self.link_state = {n.name: self.counters.sample(n.name, 0).oper_status for n in self.nics}
        self.inbox: queue.Queue = queue.Queue()
        info = {"session": f"{self.session:016x}", "version": __version__, "transport": self.transport,
                "probe_port": cfg.probe.port,
                "nics": [{"name": n.name, "address": n.address, **({"qpn": qpns[n.name]} if n.name in qpns else {})}
                         for n in self.nics]}
        self.verifier = CommandVerifier(cfg.host, cfg.signing, self.buffer_dir)  # signed commands only
        self.control = Control(self.client, info, cfg.peers.refresh, self.buffer_dir, self.inbox, self.verifier)
        self.running = True
        self.started = time.monotonic()

    def _nccl_listener(self) -> NcclListener | None:
        """The NCCL plugin's socket; the agent runs without it when it cannot be bound."""
        settings = self.cfg.nccl
        if not settings.enabled:
            return None
        path = settings.socket or self.buffer_dir / "nccl.sock"
        try:
            qps = QpReporter(self.cfg.host, {n.name: n.address for n in self.nics},
                             settings.qp_interval or 0.0)
            return NcclListener(path, settings.socket_mode, self.cfg.host, self.reporter.put, self.stats,
                                settings.raw_steps_per_s, qps)
        except OSError as e:
            log.warning("NCCL plugin socket not opened: %s", e)
            return None

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        ep = select.epoll()
        handlers = {}
        pollers = []  # RDMA completion queues: polled every pass (Debian 12's pyverbs has no completion channel fd)
        for r in self.responders:
            if isinstance(r.sock, verbs.Endpoint):
                pollers += [r.on_errqueue, r.on_readable]
            else:
                handlers[r.fileno()] = (r.on_readable, r.on_errqueue)
        for nic in self.nics:
            for sock in [*nic.sockets, *nic.verbs_ports]:  # RoCE source ports: their traceroute sockets
                handlers[sock.fileno()] = (lambda s=sock: self.prober.on_readable(s),
                                           lambda s=sock: self.prober.on_errqueue(s))
            if nic.verbs is not None:
                pollers += [
                    lambda q=nic.verbs: self.prober.on_errqueue(q),
                    lambda q=nic.verbs: self.prober.on_readable(q),
                ]
        max_wait = BATCH if pollers else float("inf")
        handlers[self.links.fileno()] = (self._on_links, lambda: None)
        for fd in handlers:
            ep.register(fd, select.EPOLLIN)
        self.reporter.start()
        if self.nccl is not None:
            self.nccl.start()
        self.control.start()
        if not self.control.registered.wait(3.0):
            cached = self.control.cached_peers()
            if cached is not None:
                log.warning("service not reachable yet: probing the %d cached peers", len(cached))
                self.prober.set_peers(cached)
        log.info("agent %s up: session %016x, NICs %s, probe port %d, %g exchanges/s per path",
                 self.cfg.host, self.session, ", ".join(f"{n.name}={n.address}" for n in self.nics),
                 self.cfg.probe.port, self.cfg.probe.rate)
        gc.freeze()  # the long-lived objects (modules, config, sockets) leave the GC's generations
        now = time.monotonic()
        next_hk = next_slow = now
        next_counters = now + 1.0
        next_stats = now + 2.0
        next_clock = now + 1.0
        stop_at = None
        down_after = self.cfg.probe.down_after
        last_poll = 0.0
        next_down = now
        while True:
            wake = min(self.prober.next_due() if stop_at is None else next_hk, next_hk, next_down)
            now = time.monotonic()
            if now - last_poll < BATCH:  # but a path's down deadline is never put off
                time.sleep(max(0.0, min(BATCH - (now - last_poll), next_down - now)))
            last_poll = time.monotonic()
            self.stats["loop_passes"] += 1
            for fd, ev in ep.poll(max(0.0, min(wake - last_poll, max_wait))):
                readable, errqueue = handlers[fd]
                if ev & select.EPOLLERR:
                    errqueue()
                if ev & select.EPOLLIN:
                    readable()
            for poll in pollers:
                poll()
            now = time.monotonic()
            if stop_at is None:
                self.prober.send_due(now)
            if now >= next_down or now >= next_hk:
                next_down = self.prober.check_paths(now, down_after)
            if now >= next_hk:
                next_hk = now + HOUSEKEEPING
                self.prober.expire(now)
                self.prober.tick_tracer(now)
                self._drain_inbox()
            if now >= next_slow:
                next_slow = now + SLOW
                if self.clock.check_step():
                    self.stats["clock_steps"] += 1
                for dev in self.verbs_devices.values():
                    dev.clock.tick(now)  # the NIC clock's mapping to realtime, every CALIBRATE_EVERY
                if self.prober.close_windows():
                    self.reporter.wake()  # the windows go out now, not at the next report tick
                if now >= next_clock:
                    next_clock = now + 1.0
                    if self.clock_sync is not None:
                        # a clock window is complete once every probe window in it has closed
                        self.clock_sync.run(self.prober.closed_before)
                    if not self.prober.tracer.busy:
                        due = self.prober.retrace_due(now, self.cfg.probe.trace_interval)
                        if due:
                            self.prober.trace(due)
                        else:  # the prober's paths are known: map the steering candidates' paths
                            self.steering.warm(self._steer_peers())
                if now >= next_counters:
                    next_counters = now + self.cfg.counters.interval
                    for sample in self.counters.sample_all(self.clock.now()):
                        self.reporter.put("host_nic_samples", sample)
                if now >= next_stats:
                    next_stats = now + self.cfg.report.stats_interval
                    self._report_stats()
            if not self.running and stop_at is None:
                stop_at = now + SHUTDOWN_WAIT  # stop sending; late replies may still come in
            if stop_at is not None and now >= stop_at:
                break
        self.prober.close_windows(final=True)
        if self.clock_sync is not None:
            self.clock_sync.run(self.clock.now())
        self._report_stats()
        ep.close()

    def _routers(self, local: str, addr: str) -> int | None:
        """How many routers the prober's traces found on every path from `local` to `addr` (a QP
        trace towards that peer ends there rather than waiting out two silent TTLs)."""
        for t in list(self.prober.targets.values()):
            if t.nic.address == local and t.addr == addr:
                return t.routers()
        return None

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "peers":
                self.prober.set_peers(payload)
            elif kind == "qp_targets":  # this host's QPs as the service joined them: their paths are traced
                if self.nccl is not None and self.nccl.qps is not None and self.nccl.qps.tracer is not None:
                    self.nccl.qps.tracer.set_targets(payload)
            elif kind == "registered" and payload > 1:  # registered again: a restarted service
                log.info("announced %d probe paths to the restarted service", self.prober.announce_paths())
            elif kind == "command":
                refused = self.verifier.check(payload)  # before dispatch: signature, host, expiry, replay
                if refused is not None:
                    log.warning("command %s (%s) refused: %s", payload.get("id"), payload.get("kind"), refused)
                    self.stats["commands_refused"] += 1
                    status, message = "failed", f"refused: {refused}"
                else:
                    outcome = self._command(payload)
                    if outcome is None:
                        continue  # reported later, by the command's own thread (steer)
                    status, message = outcome
                if isinstance(payload.get("id"), int):  # the control thread posts it (never blocks here)
                    self.control.result(payload["id"], status, message)

    def _command(self, command: dict) -> tuple[str, str] | None:
        """Carry out one command; returns its outcome for the service: ("done" | "failed", message),
        or None when the command reports it itself later (steer)."""
        kind, args, cid = command.get("kind"), command.get("args") or {}, command.get("id")
        self.stats["commands"] += 1
        try:
            if kind == "reprobe_paths":
                log.info("command %s: tracing every path again", cid)
                self.prober.trace()
                return "done", "tracing every path again"
            if kind == "set_rate":
                rate = args.get("rate")
                if not (problem := rate_problem(rate)):
                    log.info("command %s: probe rate %g exchanges/s per path", cid, rate)
                    self.prober.set_rate(float(rate))
                    return "done", f"probing at {rate:g} exchanges/s per path"
                reason = f"bad rate {rate!r}: want {problem}"
            elif kind == "focus":
                if not (reason := focus_args_problem(args)):
                    rate, for_s, ids = float(args["rate"]), float(args["for_s"]), args["paths"]
                    n = self.prober.focus(set(ids), rate, for_s)
                    log.info("command %s: %d of %d paths probed at %g/s for %g s", cid, n, len(ids), rate, for_s)
                    return "done", f"probing {n} of {len(ids)} paths at {rate:g}/s for {for_s:g} s"
            elif kind == "refresh_peers":
                return "done", "fetching the peer list again"  # the control thread does, having seen the command
            elif kind in ("steer", "unsteer"):
                return self._steer(kind, args, cid)
            else:
                reason = (f"unknown command {kind!r} (this agent knows reprobe_paths, set_rate, refresh_peers, "
                          "steer, unsteer, focus)")
        except SteerError as e:
            reason = f"{kind}: {e}"
        except Exception as e:  # a command must not take the probe loop down
            log.exception("command %s (%s) failed", cid, kind)
            reason = f"{kind} failed: {type(e).__name__}: {e}"
        log.warning("command %s: %s", cid, reason)
        self.stats["commands_failed"] += 1
        return "failed", reason

    def _steer_peers(self) -> dict[str, list[Peer]]:
        peers: dict[str, list[Peer]] = {}
        for t in self.prober.targets.values():
            peers.setdefault(t.host, []).append(Peer(t.nic.address, t.addr, t.routers(), frozenset(t.announced)))
        return peers

    def _steer(self, kind: str, args: dict, cid) -> tuple[str, str] | None:
        if kind == "unsteer":
            return self.steering.unsteer(args)
        peers = self._steer_peers()

        def done(status: str, message: str, details: dict | None) -> None:
            log.info("command %s: %s", cid, message)
            if isinstance(cid, int):
                self.control.result_now(cid, status, message, details)
        log.info("command %s: %s", cid, self.steering.start_steer(args, peers, done))
        return None

    def _on_links(self) -> None:
        watched = {n.name for n in self.nics}
        for name, oper in self.links.read():
            if name in watched and self.link_state.get(name) != oper:
                self.link_state[name] = oper
                log.info("NIC %s is %s", name, oper)
                self.stats["link_changes"] += 1
                sample = self.counters.sample(name, self.clock.now())
                self.reporter.put("host_nic_samples", sample.model_copy(update={"oper_status": oper}))
                self.reporter.wake()  # the correlator needs it before its peers' windows of this second
                if oper in ("down", "lowerLayerDown", "notPresent"):
                    self.prober.nic_down(name, oper)

    def _report_stats(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        fields = {**{k: int(v) for k, v in self.stats.items()}, **self.prober.snapshot(),
                  **(self.clock_sync.stats if self.clock_sync is not None else {}),
                  "cpu_user_s": usage.ru_utime, "cpu_system_s": usage.ru_stime, "max_rss_kib": usage.ru_maxrss,
                  "buffered_bytes": self.reporter.buffered_bytes, "uptime_s": time.monotonic() - self.started,
                  "clock_offset_ns": self.clock.offset_ns, "service_switches": self.client.switches,
                  "steer_map": self.steering.map_size(self._steer_peers())}
        fields = {k: v for k, v in fields.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.reporter.put("points", GenericPoint(measurement="agent_stats", tags={"host": self.cfg.host},
                                                 fields=fields, ts=self.clock.now()))
        self._write_status(fields)

    def _write_status(self, fields: dict) -> None:
        status = {"host": self.cfg.host, "session": f"{self.session:016x}", "stats": fields,
                  "service": {"url": self.client.url, "urls": self.client.urls, "switches": self.client.switches},
                  "paths": self.paths_table()}
        tmp = self.buffer_dir / "status.tmp"
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, self.buffer_dir / "status.json")
        self._last_fields = fields

    def paths_table(self) -> list[dict]:
        return [{"peer": t.host, "peer_nic": t.nic_name, "nic": t.nic.name, "path_id": p.path_id,
                 "sport": p.sock.port, "state": p.state}
                for t in self.prober.targets.values() for p in t.paths.values()]

    def stop(self, *_args) -> None:
        self.running = False

    def close(self) -> None:
        self.control.stop()
        if self.nccl is not None:
            self.nccl.stop()  # before the reporter's last flush: what it received goes out too
        self.reporter.stop()
        # the status once more, with the counts of the last flush (records delivered, buffered)
        self._write_status({**self._last_fields, **{k: int(v) for k, v in self.stats.items()},
                            "buffered_bytes": self.reporter.buffered_bytes})
        self.prober.close()
        for r in self.responders:
            r.close()
        for dev in self.verbs_devices.values():  # its endpoints too (closing twice is harmless in pyverbs)
            dev.close()
        self.links.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nms-agent",
        description="fabric-nms host probe agent: probes peers NIC-to-NIC over every ECMP path with kernel "
                    "timestamps and reports loss, one-way delays, path events and NIC counters to the service.")
    parser.add_argument("--config", help="agent configuration file (YAML; see docs/hostprobe.md)")
    parser.add_argument("--check", action="store_true",
                        help="validate --config and exit, starting nothing: 0 valid (a one-line summary), "
                             "1 invalid (every error with its field path and line)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    args = parser.parse_args(argv)
    if args.version:
        print(f"nms-agent {__version__}")
        return 0
    if args.config is None:
        if args.check:
            parser.error("--check needs --config FILE")
        parser.print_help()
        return 2
    from hostprobe.config import load, summary
    from nms.config import ConfigError

    try:
        cfg = load(args.config)
    except ConfigError as e:
        # --check: the lines of `nms config check` (FILE: N configuration error(s), then one per error)
        print(str(e) if args.check else f"nms-agent: {e}", file=sys.stderr)
        return 1 if args.check else 2
    if args.check:
        print(f"ok {args.config}: {summary(cfg)}")
        return 0
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per report batch otherwise
    try:
        agent = Agent(cfg)
    except (OSError, transport.TransportError) as e:
        print(f"nms-agent: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. the buffer directory is locked by another agent
        print(f"nms-agent: cannot start: {e}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
    try:
        agent.run()
    finally:
        agent.close()
    log.info("agent stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
