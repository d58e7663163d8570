"""A gNMI target serving openconfig-interfaces state of the network namespace it runs in.

    python -m lab.gnmi_target --listen ADDR:PORT (--tls-cert F --tls-key F | --insecure)
        [--username U --password-file F] [--interfaces GLOB]... [--port-speed-bps N] [--hostname NAME]
        [--no-qos] [--no-models] [--poll-waits] [--log FILE]

`nms lab up` runs one in every switch namespace (lab/services.py); tests run it on loopback.
The values are the kernel's (lab/gnmi_tree.py). What a client gets (collectors/gnmi/collector.py parses it):

* Capabilities: openconfig-interfaces 3.0.0, openconfig-if-ethernet, openconfig-system, and (unless
  --no-qos) openconfig-qos (no models at all with --no-models, as some targets answer); JSON_IETF,
  JSON, PROTO; 0.8.0.
* openconfig-qos: the output queues' counters of the namespace's qdiscs (lab/gnmi_qos.py) under
  /qos/interfaces/interface[interface-id=X]/output/queues/queue[name=Q]/state, one notification per
  queue (prefix = the queue), typed scalars whatever the encoding (Get too); counters only, so every
  subscription mode samples them. With --no-qos such paths are NOT_FOUND, like on a target without
  the model.
* Every notification of Subscribe (and of Get with PROTO) is one interface: prefix
  /interfaces/interface[name=X], timestamp = when its values were read, updates relative to the
  prefix with typed scalars (leaves are scalars, so whatever the requested encoding); an interface
  that disappears is a notification deleting its prefix.
* Get: per requested path one notification; JSON/JSON_IETF: one update at /interfaces whose value
  is {"openconfig-interfaces:interface": [...]} pruned to the path; PROTO: as Subscribe. Get of
  /system/state (or one of its leaves): hostname, software-version, boot-time, up-time,
  current-datetime (lab/gnmi_system.py).
* Subscribe: ONCE, POLL (the current values at once, or with --poll-waits only on the first Poll
  request), STREAM with SAMPLE (sample_interval, default 10 s), ON_CHANGE (rtnetlink
  link events, plus a rescan every second) and TARGET_DEFINED (counters SAMPLE, the rest ON_CHANGE);
  sync_response after the first complete set (also with updates_only, which skips that set).
* Set (and Get) of /interfaces/interface[name=X]/config/enabled and, with --lab-dir/--node, the lab's
  ECMP weights /ecmp/uplinks/uplink[name=X]/config/weight (lab/gnmi_set.py); nothing else is settable.
* With --username, every RPC must carry gRPC metadata username/password, else UNAUTHENTICATED.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

from lab import gnmi_qos, gnmi_set, gnmi_system
from lab.gnmi_tree import (
    COUNTERS,
    INTERFACES,
    STATUS,
    Kernel,
    PathError,
    Selection,
    json_doc,
    names_of,
    path_text,
    responses,
    select,
    wanted_of,
)
from lab.gnmi_watch import LinkWatch, OnChange

log = logging.getLogger("lab.gnmi_target")

GNMI_VERSION = "0.8.0"
OC = "OpenConfig working group"
MODELS = [gnmi_pb2.ModelData(name="openconfig-interfaces", organization=OC, version="3.0.0"),
          gnmi_pb2.ModelData(name="openconfig-if-ethernet", organization=OC, version="2.13.0"),
          gnmi_pb2.ModelData(name="openconfig-system", organization=OC, version="2.1.0")]
QOS_MODEL = gnmi_pb2.ModelData(name=gnmi_qos.MODEL, organization=OC, version="0.11.0")
ENCODINGS = (gnmi_pb2.JSON_IETF, gnmi_pb2.JSON, gnmi_pb2.PROTO)
DEFAULT_SAMPLE_NS = 10 * 10**9
MIN_SAMPLE_NS = 100 * 10**6
SYNC = gnmi_pb2.SubscribeResponse(sync_response=True)
Code = grpc.StatusCode


async def _guarded(coro, queue: asyncio.Queue) -> None:
    try:
        await coro
    except Exception as e:  # hand it to the stream, which ends with INTERNAL
        log.exception("subscription task failed")
        await queue.put(e)


class Target(gnmi_pb2_grpc.gNMIServicer):
    def __init__(self, kernel: Kernel, username: str | None = None, password: str | None = None,
                 hostname: str = "nms-lab-switch", qos: bool = True, poll_waits: bool = False,
                 lab_dir: str | None = None, node: str | None = None, list_models: bool = True):
        self.kernel, self.watch, self.hostname = kernel, LinkWatch(kernel), hostname
        self.list_models = list_models  # False: Capabilities lists no models (some targets do)
        self.queues = gnmi_qos.Queues(kernel.wanted) if qos else None
        self.poll_waits = poll_waits  # POLL: nothing until the first Poll request (some targets do that)
        self._user = username.encode() if username is not None else None
        self._password = (password or "").encode()
        self.setter = gnmi_set.LabSet(kernel, lab_dir, node)  # Set of config/enabled and (in a lab) ECMP weights

    async def _check(self, context, rpc: str) -> None:
        if self._user is None:
            return
        md = {k: v if isinstance(v, bytes) else v.encode() for k, v in context.invocation_metadata() or ()}
        user, password = md.get("username", b""), md.get("password", b"")
        if not hmac.compare_digest(user, self._user) & hmac.compare_digest(password, self._password):
            why = ("no username/password metadata" if not user else "wrong password" if user == self._user
                   else f"unknown user {user.decode(errors='replace')!r}")
            log.warning("%s: %s refused: %s", context.peer(), rpc, why)
            await context.abort(Code.UNAUTHENTICATED, "bad or missing username/password (gRPC metadata)")

    def _select(self, prefix, path) -> Selection | gnmi_qos.QosSelection:
        if gnmi_qos.is_qos(prefix, path):
            if self.queues is None:
                raise PathError("NOT_FOUND", f"no such path {path_text(prefix, path)}: this target serves no "
                                             "openconfig-qos")
            return gnmi_qos.select(prefix, path)
        return select(prefix, path)

    async def _selections(self, context, prefix, paths) -> list[Selection | gnmi_qos.QosSelection]:
        try:
            return [self._select(prefix, p) for p in paths]
        except PathError as e:
            await context.abort(getattr(Code, e.code), str(e))

    async def _encoding(self, context, encoding: int) -> None:
        if encoding not in ENCODINGS:
            name = gnmi_pb2.Encoding.Name(encoding) if encoding in gnmi_pb2.Encoding.values() else str(encoding)
            await context.abort(Code.UNIMPLEMENTED if name != str(encoding) else Code.INVALID_ARGUMENT,
                                f"encoding {name} is not supported: use JSON_IETF, JSON or PROTO")

    async def _values(self, selections: list) -> list[gnmi_pb2.SubscribeResponse]:
        queues = [s for s in selections if isinstance(s, gnmi_qos.QosSelection)]
        selections = [s for s in selections if not isinstance(s, gnmi_qos.QosSelection)]
        leaves = frozenset().union(*(s.leaves for s in selections))

        def work():
            out = []
            if selections:
                snapshot = self.kernel.read(bool(leaves & COUNTERS.keys()), bool(leaves - COUNTERS.keys()),
                                            names_of(selections))
                out = responses(snapshot, wanted_of(selections, snapshot))
            if queues:
                out += gnmi_qos.responses(self.queues.read(), queues)
            return out
        return await asyncio.to_thread(work)

    async def Capabilities(self, request, context):
        await self._check(context, "Capabilities")
        models = MODELS + ([QOS_MODEL] if self.queues is not None else []) if self.list_models else []
        return gnmi_pb2.CapabilityResponse(supported_models=models, supported_encodings=ENCODINGS,
                                           gNMI_version=GNMI_VERSION)

    async def Get(self, request, context):
        await self._check(context, "Get")
        await self._encoding(context, request.encoding)
        if request.type == gnmi_pb2.GetRequest.CONFIG:
            await context.abort(Code.UNIMPLEMENTED, "this target serves state only (no config data)")
        prefix = request.prefix if request.HasField("prefix") else None
        paths = list(request.path) or [gnmi_pb2.Path()]
        if any(gnmi_set.handles(prefix, p) for p in paths):
            return await self._guard_set(context, self.setter.get, prefix, paths)
        if any(gnmi_system.is_system(prefix, p) for p in paths):
            return await self._get_system(request, context, prefix, paths)
        selections = await self._selections(context, prefix, paths)
        if any(isinstance(sel, gnmi_qos.QosSelection) for sel in selections):
            if not all(isinstance(sel, gnmi_qos.QosSelection) for sel in selections):
                await context.abort(Code.INVALID_ARGUMENT, "ask for /qos and /interfaces in separate Gets")
            return gnmi_pb2.GetResponse(notification=[r.update for r in await self._values(selections)])
        snapshot = await asyncio.to_thread(self.kernel.read, True, True, names_of(selections))
        for sel in selections:
            if sel.name is not None and sel.name not in snapshot:
                await context.abort(Code.NOT_FOUND, f"no interface {sel.name!r} here")
        out = []
        for sel in selections:
            wanted = wanted_of([sel], snapshot)
            if request.encoding == gnmi_pb2.PROTO:
                out += [r.update for r in responses(snapshot, wanted)]
                continue
            n = gnmi_pb2.Notification(timestamp=max((snapshot[name][0] for name in wanted), default=0))
            u = n.update.add()
            u.path.CopyFrom(INTERFACES)
            doc = json_doc(snapshot, wanted, ietf=request.encoding == gnmi_pb2.JSON_IETF)
            if request.encoding == gnmi_pb2.JSON_IETF:
                u.val.json_ietf_val = doc
            else:
                u.val.json_val = doc
            out.append(n)
        return gnmi_pb2.GetResponse(notification=out)

    async def _get_system(self, request, context, prefix, paths) -> gnmi_pb2.GetResponse:
        """/system/state (openconfig-system), alone in its request."""
        wanted = [gnmi_system.selected(prefix, p) if gnmi_system.is_system(prefix, p) else None for p in paths]
        for p, leaves in zip(paths, wanted):
            if leaves is None:
                await context.abort(Code.NOT_FOUND, f"no such path {path_text(prefix, p)}: this target serves "
                                                    "/system/state and /interfaces/interface (not both in one Get)")
        values = await asyncio.to_thread(gnmi_system.state, self.hostname)
        return gnmi_pb2.GetResponse(notification=[gnmi_system.notification(values, leaves, request.encoding)
                                                  for leaves in wanted])

    async def Set(self, request, context):
        await self._check(context, "Set")
        return await self._guard_set(context, self.setter.set, request)

    async def _guard_set(self, context, call, *args):
        try:
            return await asyncio.to_thread(call, *args)
        except PathError as e:
            await context.abort(getattr(Code, e.code), str(e))
        except (OSError, subprocess.SubprocessError) as e:
            await context.abort(Code.INTERNAL, f"the change failed: {e}")

    async def Subscribe(self, request_iterator, context):
        requests = request_iterator.__aiter__()
        try:  # the first request before the credentials: a client whose write races our abort sees INTERNAL
            first = await requests.__anext__()
        except StopAsyncIteration:
            first = None
        await self._check(context, "Subscribe")
        if first is None or not first.HasField("subscribe"):
            await context.abort(Code.INVALID_ARGUMENT, "the first SubscribeRequest must carry a SubscriptionList")
        sl = first.subscribe
        await self._encoding(context, sl.encoding)
        if sl.use_aliases:
            await context.abort(Code.UNIMPLEMENTED, "aliases are not supported")
        if not sl.subscription:
            await context.abort(Code.INVALID_ARGUMENT, "the SubscriptionList has no subscription")
        prefix = sl.prefix if sl.HasField("prefix") else None
        subs = list(zip(await self._selections(context, prefix, [s.path for s in sl.subscription]), sl.subscription))
        mode = gnmi_pb2.SubscriptionList.Mode.Name(sl.mode) if sl.mode in (0, 1, 2) else str(sl.mode)
        log.info("%s: Subscribe %s %s", context.peer(), mode,
                 " ".join(path_text(prefix, s.path) for s in sl.subscription))
        if sl.mode == gnmi_pb2.SubscriptionList.ONCE:
            for r in await self._values([sel for sel, _ in subs]):
                yield r
            yield SYNC
        elif sl.mode == gnmi_pb2.SubscriptionList.POLL:
            if not self.poll_waits:
                for r in await self._values([sel for sel, _ in subs]):
                    yield r
                yield SYNC
            async for request in requests:
                if not request.HasField("poll"):
                    await context.abort(Code.INVALID_ARGUMENT, "a POLL subscription takes only poll requests after "
                                                               "its SubscriptionList")
                for r in await self._values([sel for sel, _ in subs]):
                    yield r
                yield SYNC
        elif sl.mode == gnmi_pb2.SubscriptionList.STREAM:
            for sub in sl.subscription:
                if sub.mode == gnmi_pb2.SAMPLE and 0 < sub.sample_interval < MIN_SAMPLE_NS:
                    await context.abort(Code.INVALID_ARGUMENT, f"sample_interval {sub.sample_interval} ns is below "
                                                               f"this target's minimum, {MIN_SAMPLE_NS} ns")
                if sub.mode not in (gnmi_pb2.TARGET_DEFINED, gnmi_pb2.ON_CHANGE, gnmi_pb2.SAMPLE):
                    await context.abort(Code.INVALID_ARGUMENT, f"unknown subscription mode {sub.mode}")
            async with contextlib.aclosing(self._stream(subs, sl.updates_only)) as stream:  # its tasks end with us
                async for item in stream:
                    if isinstance(item, Exception):
                        await context.abort(Code.INTERNAL, f"target error: {item}")
                    yield item
        else:
            await context.abort(Code.INVALID_ARGUMENT, f"unknown SubscriptionList mode {sl.mode}")

    async def _stream(self, subs, updates_only: bool):
        """STREAM: the initial values, sync_response, then what the samplers and the ON_CHANGE
        watcher produce (through a small queue: a slow client makes samplers skip ticks)."""
        samples: dict[int, list[Selection]] = {}
        changes: list[Selection] = []
        for sel, sub in subs:
            interval = sub.sample_interval or DEFAULT_SAMPLE_NS
            if sub.mode == gnmi_pb2.SAMPLE or isinstance(sel, gnmi_qos.QosSelection):  # queues: counters only
                samples.setdefault(interval, []).append(sel)
            elif sub.mode == gnmi_pb2.ON_CHANGE:
                changes.append(sel)
            else:  # TARGET_DEFINED
                if sel.only(COUNTERS).leaves:
                    samples.setdefault(interval, []).append(sel.only(COUNTERS))
                if sel.only(STATUS).leaves:
                    changes.append(sel.only(STATUS))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue(maxsize=8)
        tasks: list[asyncio.Task] = []
        on_change = OnChange(self.kernel, self.watch, changes) if changes else None
        watching = False
        try:
            if on_change:
                await self.watch.acquire()
                watching = True
            start = loop.time()
            initial = []
            if samples and not updates_only:
                initial = await self._values([s for v in samples.values() for s in v])
            if on_change:
                version = self.watch.version
                held = on_change.diff(await on_change.current())
                initial += [] if updates_only else held
                tasks.append(asyncio.create_task(_guarded(on_change.run(version, queue), queue)))
            for r in initial:
                yield r
            yield SYNC
            for interval, selections in samples.items():
                tasks.append(asyncio.create_task(_guarded(self._sampler(interval, selections, queue, start), queue)))
            while True:
                batch = await queue.get()
                if isinstance(batch, Exception):
                    yield batch
                    return
                for r in batch:
                    yield r
        finally:
            for t in tasks:
                t.cancel()
            if watching:
                self.watch.release()

    async def _sampler(self, interval_ns: int, selections: list[Selection], queue: asyncio.Queue,
                       start: float) -> None:
        loop, period = asyncio.get_running_loop(), interval_ns / 1e9
        due = start + period
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            await queue.put(await self._values(selections))
            due += period
            while due < loop.time():  # behind (a slow client or CPU): skip ticks rather than burst
                due += period


def _address(text: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%\w]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if not m or int(m[2] or m[4]) > 65535:
        raise ValueError(f"--listen {text!r}: use ADDR:PORT, e.g. 198.18.0.10:9339 or [::1]:9339")
    return (m[1] or m[3]), int(m[2] or m[4])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m lab.gnmi_target", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, metavar="ADDR:PORT", help="address to serve on ([v6]:port for IPv6)")
    ap.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM)")
    ap.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    ap.add_argument("--insecure", action="store_true", help="serve plaintext gRPC (only when asked for)")
    ap.add_argument("--username", help="required gRPC metadata username (with --password-file)")
    ap.add_argument("--password-file", metavar="FILE", help="file holding the required password")
    ap.add_argument("--interfaces", action="append", metavar="GLOB", help="interfaces to serve (fnmatch, "
                    "repeatable; default all but lo)")
    ap.add_argument("--port-speed-bps", type=int, default=0, help="port speed reported for every interface")
    ap.add_argument("--hostname", default="nms-lab-switch", help="/system/state/hostname (namespaces share the "
                    "machine's own)")
    ap.add_argument("--no-qos", action="store_true", help="serve no openconfig-qos (a target without the model)")
    ap.add_argument("--no-models", action="store_true", help="Capabilities lists no models (some targets "
                    "do: a client then asks for what it wants and learns from the refusals)")
    ap.add_argument("--poll-waits", action="store_true", help="a POLL subscription answers only Poll requests "
                    "(nothing before the first)")
    ap.add_argument("--log", metavar="FILE", help="log here instead of stderr")
    ap.add_argument("--lab-dir", help="the lab directory: serve Set of ECMP weights (lab/gnmi_set.py)")
    ap.add_argument("--node", help="this switch's node name in the lab (with --lab-dir)")
    args = ap.parse_args(argv)
    try:
        args.host, args.port = _address(args.listen)
    except ValueError as e:
        ap.error(str(e))
    if (args.tls_cert is None) != (args.tls_key is None):
        ap.error("give both --tls-cert and --tls-key")
    if args.tls_cert and args.insecure:
        ap.error("--insecure (plaintext) and --tls-cert/--tls-key exclude each other")
    if not args.tls_cert and not args.insecure:
        ap.error("no TLS certificate: give --tls-cert and --tls-key, or --insecure to serve plaintext on purpose")
    if (args.username is None) != (args.password_file is None):
        ap.error("give both --username and --password-file, or neither")
    if args.port_speed_bps < 0:
        ap.error("--port-speed-bps must be >= 0")
    return args


async def serve(args, password: str | None, credentials) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # never share the port with another target
    gnmi_pb2_grpc.add_gNMIServicer_to_server(Target(Kernel(args.interfaces, args.port_speed_bps),
                                                    args.username, password, args.hostname, not args.no_qos,
                                                    args.poll_waits, args.lab_dir, args.node,
                                                    not args.no_models), server)
    address = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if not port:
        raise OSError(f"cannot listen on {args.listen} (in use, or not an address of this namespace)")
    await server.start()
    bound = f"[{args.host}]:{port}" if ":" in args.host else f"{args.host}:{port}"
    log.info("listening on %s (%s, %s; interfaces %s)", bound, "TLS" if credentials else "plaintext",
             f"user {args.username}" if args.username else "no authentication", args.interfaces or "all but lo")
    print(f"listening on {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    await server.stop(grace=1.0)


def _tls_files(key_path: str, cert_path: str) -> tuple[bytes, bytes]:
    """The key and certificate, checked here: gRPC would only say that it cannot listen."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key, cert = Path(key_path).read_bytes(), Path(cert_path).read_bytes()
    try:
        x509.load_pem_x509_certificates(cert)
    except ValueError:
        raise OSError(f"--tls-cert {cert_path}: not a PEM certificate") from None
    try:
        load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise OSError(f"--tls-key {key_path}: not an unencrypted PEM private key") from None
    return key, cert


def main(argv=None) -> int:
    args = parse_args(argv)
    handler = logging.FileHandler(args.log) if args.log else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        password = Path(args.password_file).read_text().rstrip("\r\n") if args.password_file else None
        if password == "":
            raise OSError(f"--password-file {args.password_file} is empty")
        credentials = None
        if args.tls_cert:
            key, cert = _tls_files(args.tls_key, args.tls_cert)
            credentials = grpc.ssl_server_credentials([(key, cert)])
        asyncio.run(serve(args, password, credentials))
    except OSError as e:
        message = f"{e.filename}: {e.strerror}" if e.filename else str(e)
        log.error("%s", message)
        if args.log:
            print(f"gnmi_target: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
