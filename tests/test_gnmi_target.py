"""The lab's gNMI target (lab/gnmi_target.py) as a real process on 127.0.0.1, serving the kernel's
`lo` of this test's own namespace, driven over gRPC with pygnmi's gnmi.proto stubs: Capabilities,
Get against /sys, Subscribe STREAM/ONCE/POLL, authentication, TLS, and the errors of bad requests.
No root needed, except by the rtnetlink test (it makes a veth pair; skipped without root)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from pygnmi.spec.v080 import gnmi_pb2 as g
from pygnmi.spec.v080 import gnmi_pb2_grpc

from lab import tls
from lab.gnmi_tree import LEAVES, PathError, Selection, select

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "labuser", "pw-4Fz9q"
AUTH = (("username", USER), ("password", PASSWORD))
NO_PROXY = [("grpc.enable_http_proxy", 0)]  # never send the test's gRPC to a proxy from the environment
SAMPLE_MS = 200
STATS = {"in-octets": "rx_bytes", "out-octets": "tx_bytes", "in-pkts": "rx_packets", "out-pkts": "tx_packets",
         "in-errors": "rx_errors", "out-errors": "tx_errors", "in-discards": "rx_dropped",
         "out-discards": "tx_dropped", "in-multicast-pkts": "multicast"}


class Target:
    """`python -m lab.gnmi_target` on 127.0.0.1, on the port it picked (--listen :0)."""

    def __init__(self, tmp: Path, *args: str):
        (tmp / "password").write_text(PASSWORD + "\n")
        self.log = tmp / "target.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "lab.gnmi_target", "--listen", "127.0.0.1:0", *args],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=open(self.log, "ab"), text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), f"{line!r}\n{self.log.read_text()}"
        self.port = int(line.rsplit(":", 1)[1])
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)


def auth_args(tmp: Path) -> list[str]:
    return ["--username", USER, "--password-file", str(tmp / "password")]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gnmi-target")
    t = Target(tmp, "--insecure", "--interfaces", "lo", "--port-speed-bps", "100000000", "--hostname", "leaf7",
               *auth_args(tmp))
    yield t
    assert t.stop() == 0, t.log.read_text()
    assert PASSWORD not in t.log.read_text()  # never logged, even after failed logins


def stub(address: str, credentials=None) -> tuple[grpc.aio.Channel, gnmi_pb2_grpc.gNMIStub]:
    channel = (grpc.aio.secure_channel(address, credentials, options=NO_PROXY) if credentials
               else grpc.aio.insecure_channel(address, options=NO_PROXY))
    return channel, gnmi_pb2_grpc.gNMIStub(channel)


def path(text: str) -> g.Path:
    elems = []
    for part in text.strip("/").split("/") if text.strip("/") else []:
        name, _, key = part.partition("[")
        elems.append(g.PathElem(name=name, key=dict([key.rstrip("]").split("=", 1)]) if key else {}))
    return g.Path(elem=elems)


def kernel(counter: str) -> int:
    return int(Path(f"/sys/class/net/lo/statistics/{counter}").read_text())


def blast(n: int = 200, size: int = 1000) -> int:
    """UDP to a closed port on loopback; returns the octets lo carried (IPv4 + UDP + 14 of Ethernet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(b"x" * size, ("127.0.0.1", 9))
    return n * (size + 42)


def leaves(n: g.Notification) -> dict[str, object]:
    out = {}
    for u in n.update:
        kind = u.val.WhichOneof("value")
        out["/".join(e.name for e in u.path.elem)] = getattr(u.val, kind)
    return out


def subscribe_list(*subs: g.Subscription, mode=g.SubscriptionList.STREAM, **kw) -> g.SubscribeRequest:
    return g.SubscribeRequest(subscribe=g.SubscriptionList(subscription=list(subs), mode=mode,
                                                            encoding=g.PROTO, **kw))


async def requests(first: g.SubscribeRequest, more: asyncio.Queue | None = None):
    yield first
    while more is not None:
        item = await more.get()
        if item is None:
            return
        yield item
    await asyncio.sleep(3600)  # keep the request side open (a STREAM client does)


async def get_json(st, text: str, encoding=g.JSON_IETF) -> tuple[g.Notification, dict]:
    answer = await st.Get(g.GetRequest(path=[path(text)], encoding=encoding), metadata=AUTH, timeout=5)
    assert len(answer.notification) == 1 and len(answer.notification[0].update) == 1
    n = answer.notification[0]
    assert [e.name for e in n.update[0].path.elem] == ["interfaces"]
    val = n.update[0].val
    return n, json.loads(val.json_ietf_val if encoding == g.JSON_IETF else val.json_val)


async def test_capabilities(target):
    channel, st = stub(target.address)
    async with channel:
        caps = await st.Capabilities(g.CapabilityRequest(), metadata=AUTH, timeout=5)
    models = {m.name: m for m in caps.supported_models}
    assert models["openconfig-interfaces"].version == "3.0.0"
    assert models["openconfig-interfaces"].organization == "OpenConfig working group"
    assert "openconfig-if-ethernet" in models and "openconfig-system" in models
    assert set(caps.supported_encodings) == {g.JSON, g.JSON_IETF, g.PROTO} and caps.gNMI_version == "0.8.0"


async def test_get_json_ietf_is_the_kernels_and_counts_traffic(target):
    channel, st = stub(target.address)
    async with channel:
        before = {leaf: kernel(f) for leaf, f in STATS.items()}
        n1, doc = await get_json(st, "/interfaces")
        after = {leaf: kernel(f) for leaf, f in STATS.items()}
        [lo] = doc["openconfig-interfaces:interface"]
        counters = lo["state"]["counters"]
        for leaf in STATS:  # the target read between our two reads: the values lie between them
            assert isinstance(counters[leaf], str)  # RFC 7951: 64-bit integers as strings
            assert before[leaf] <= int(counters[leaf]) <= after[leaf], leaf
        assert lo["name"] == "lo" and lo["state"]["name"] == "lo"
        assert lo["state"]["oper-status"] == "UNKNOWN"  # loopback's operstate is "unknown"
        assert lo["state"]["admin-status"] == "UP"
        assert lo["state"]["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
        assert lo["state"]["ifindex"] == int(Path("/sys/class/net/lo/ifindex").read_text())
        assert lo["openconfig-if-ethernet:ethernet"]["state"]["port-speed"] == "openconfig-if-ethernet:SPEED_100MB"
        sent = blast()
        n2, doc = await get_json(st, "/interfaces/interface[name=lo]/state/counters")
        [lo2] = doc["openconfig-interfaces:interface"]
        assert set(lo2) == {"name", "state"} and set(lo2["state"]) == {"counters"}  # pruned to the path
        assert int(lo2["state"]["counters"]["in-octets"]) - int(counters["in-octets"]) >= sent
        assert int(lo2["state"]["counters"]["in-pkts"]) - int(counters["in-pkts"]) >= 200
        assert n2.timestamp > n1.timestamp
        # JSON (not IETF): plain numbers
        _, doc = await get_json(st, "/interfaces/interface[name=*]/state/counters/in-octets", g.JSON)
        assert isinstance(doc["openconfig-interfaces:interface"][0]["state"]["counters"]["in-octets"], int)


async def test_get_proto_gives_typed_leaves_under_the_interface_prefix(target):
    channel, st = stub(target.address)
    async with channel:
        answer = await st.Get(g.GetRequest(path=[path("/interfaces/interface[name=lo]/state")], encoding=g.PROTO),
                              metadata=AUTH, timeout=5)
    [n] = answer.notification
    assert [(e.name, dict(e.key)) for e in n.prefix.elem] == [("interfaces", {}), ("interface", {"name": "lo"})]
    got = leaves(n)
    assert set(got) == {leaf for leaf in LEAVES if leaf.startswith("state/")}
    assert got["state/oper-status"] == "UNKNOWN" and got["state/admin-status"] == "UP"
    assert {u.val.WhichOneof("value") for u in n.update if "counters" in u.path.elem[1].name} == {"uint_val"}
    assert abs(n.timestamp - time.time_ns()) < 5e9


async def test_stream_sample_ticks_every_interval_after_a_sync(target):
    channel, st = stub(target.address)
    sub = g.Subscription(path=path("/interfaces/interface/state/counters"), mode=g.SAMPLE,
                         sample_interval=SAMPLE_MS * 10**6)
    got: list[tuple[str, g.SubscribeResponse]] = []
    async with channel:
        call = st.Subscribe(requests(subscribe_list(sub)), metadata=AUTH)
        async for r in call:
            got.append((r.WhichOneof("response"), r))
            if len(got) == 8:
                break
        call.cancel()
    assert [k for k, _ in got] == ["update", "sync_response"] + ["update"] * 6
    notes = [r.update for k, r in got if k == "update"]
    stamps = [n.timestamp for n in notes]
    gaps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
    assert all(SAMPLE_MS * 0.5 < gap < SAMPLE_MS * 2 for gap in gaps), gaps
    assert abs(sum(gaps) / len(gaps) - SAMPLE_MS) < SAMPLE_MS * 0.25, gaps
    octets = [leaves(n)["state/counters/in-octets"] for n in notes]
    assert octets == sorted(octets) and octets[-1] > octets[0]  # the stream's own packets cross lo
    assert all(set(leaves(n)) == {leaf for leaf in LEAVES if "/counters/" in leaf} for n in notes)


async def test_updates_only_skips_the_first_set_and_parallel_streams_keep_their_own_pace(target):
    async def stream(interval_ms: int, seconds: float, **kw) -> list[tuple[str, int]]:
        channel, st = stub(target.address)
        sub = g.Subscription(path=path("/interfaces"), mode=g.SAMPLE, sample_interval=interval_ms * 10**6)
        got = []
        async with channel:
            call = st.Subscribe(requests(subscribe_list(sub, **kw)), metadata=AUTH)
            try:
                async with asyncio.timeout(seconds):
                    async for r in call:
                        got.append((r.WhichOneof("response"), r.update.timestamp))
            except TimeoutError:
                call.cancel()
        return got

    def gaps_ms(got) -> list[float]:
        stamps = [ts for kind, ts in got if kind == "update"]
        return [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]

    fast, slow = await asyncio.gather(stream(200, 1.4, updates_only=True), stream(500, 1.4))
    assert fast[0][0] == "sync_response" and [k for k, _ in fast[1:]] == ["update"] * (len(fast) - 1)
    assert len(fast) >= 5  # ticks at 0.2, 0.4, ... s; nothing at 0
    assert [k for k, _ in slow[:2]] == ["update", "sync_response"] and len(slow) >= 4  # 0, 0.5, 1.0 s
    assert all(140 < gap < 300 for gap in gaps_ms(fast)), gaps_ms(fast)
    assert all(400 < gap < 650 for gap in gaps_ms(slow)), gaps_ms(slow)


async def test_on_change_sends_the_current_values_then_only_changes(target):
    channel, st = stub(target.address)
    status = g.Subscription(path=path("/interfaces/interface[name=lo]/state/oper-status"), mode=g.ON_CHANGE)
    octets = g.Subscription(path=path("/interfaces/interface[name=lo]/state/counters/in-octets"), mode=g.ON_CHANGE)
    got = []
    async with channel:
        call = st.Subscribe(requests(subscribe_list(status, octets)), metadata=AUTH)
        try:
            async with asyncio.timeout(2.6):
                async for r in call:
                    got.append(r)
                    if r.sync_response:
                        blast(10)
        except TimeoutError:
            call.cancel()
    sync = next(i for i, r in enumerate(got) if r.sync_response)
    first = {k: v for r in got[:sync] for k, v in leaves(r.update).items()}
    assert first["state/oper-status"] == "UNKNOWN" and "state/counters/in-octets" in first
    later = [leaves(r.update) for r in got[sync + 1:]]
    # lo's status does not change; its octets do (our traffic), seen by the once-a-second rescan
    assert later and all(set(x) == {"state/counters/in-octets"} for x in later), later
    assert later[-1]["state/counters/in-octets"] > first["state/counters/in-octets"]


async def test_once_ends_the_stream_after_its_sync(target):
    channel, st = stub(target.address)
    async with channel:
        call = st.Subscribe(requests(subscribe_list(g.Subscription(path=path("/interfaces")),
                                                    mode=g.SubscriptionList.ONCE)), metadata=AUTH, timeout=5)
        kinds = [r.WhichOneof("response") async for r in call]
        assert await call.code() == grpc.StatusCode.OK
    assert kinds == ["update", "sync_response"]


async def test_poll_answers_every_poll(target):
    channel, st = stub(target.address)
    more: asyncio.Queue = asyncio.Queue()
    async with channel:
        call = st.Subscribe(requests(subscribe_list(g.Subscription(path=path("/interfaces/interface/state/counters")),
                                                    mode=g.SubscriptionList.POLL), more), metadata=AUTH, timeout=10)
        rounds, current = [], []
        async for r in call:
            if r.sync_response:
                rounds.append(current)
                current = []
                if len(rounds) == 4:
                    await more.put(None)  # done: the target ends the stream when we stop sending
                else:
                    await asyncio.sleep(0.05)
                    await more.put(g.SubscribeRequest(poll=g.Poll()))
            else:
                current.append(r.update)
        assert await call.code() == grpc.StatusCode.OK
    assert len(rounds) == 4 and all(len(r) == 1 for r in rounds)
    stamps = [r[0].timestamp for r in rounds]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4


@pytest.mark.parametrize("metadata", [(("username", USER), ("password", "wrong")), (("username", "root"),), ()])
async def test_bad_credentials_are_unauthenticated(target, metadata):
    channel, st = stub(target.address)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.Capabilities(g.CapabilityRequest(), metadata=metadata, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        call = st.Subscribe(requests(subscribe_list(g.Subscription(path=path("/interfaces")))), metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in call:
                pass
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("request_, code, words", [
    (g.SubscribeRequest(poll=g.Poll()), grpc.StatusCode.INVALID_ARGUMENT, "must carry a SubscriptionList"),
    (subscribe_list(g.Subscription(path=path("/system/state"))), grpc.StatusCode.NOT_FOUND, "no such path /system"),
    (subscribe_list(g.Subscription(path=path("/interfaces/interface[name=lo]/state/nope"))),
     grpc.StatusCode.NOT_FOUND, "no such path"),
    (subscribe_list(g.Subscription(path=path("/interfaces"), mode=g.SAMPLE, sample_interval=1000)),
     grpc.StatusCode.INVALID_ARGUMENT, "below this target's minimum"),
    (g.SubscribeRequest(subscribe=g.SubscriptionList(subscription=[g.Subscription(path=path("/interfaces"))],
                                                      encoding=g.ASCII)),
     grpc.StatusCode.UNIMPLEMENTED, "encoding ASCII is not supported"),
    (g.SubscribeRequest(subscribe=g.SubscriptionList()), grpc.StatusCode.INVALID_ARGUMENT, "no subscription"),
])
async def test_malformed_subscriptions_are_refused(target, request_, code, words):
    channel, st = stub(target.address)
    async with channel:
        call = st.Subscribe(requests(request_), metadata=AUTH, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in call:
                pass
    assert e.value.code() == code and words in e.value.details()


async def test_get_errors_name_the_problem(target):
    channel, st = stub(target.address)
    async with channel:
        for text, code, words in [
                ("/interfaces/interface[name=eth99]", grpc.StatusCode.NOT_FOUND, "no interface 'eth99'"),
                ("/components", grpc.StatusCode.NOT_FOUND, "no such path /components")]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await st.Get(g.GetRequest(path=[path(text)], encoding=g.JSON_IETF), metadata=AUTH, timeout=5)
            assert e.value.code() == code and words in e.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.Get(g.GetRequest(path=[path("/interfaces")], encoding=g.BYTES), metadata=AUTH, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_get_system_state_in_every_encoding(target):
    """openconfig-system /system/state: the hostname given, the machine's boot time and uptime."""
    boot_ns = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                   if line.startswith("btime ")) * 10**9
    uptime_ns = float(Path("/proc/uptime").read_text().split()[0]) * 1e9
    channel, st = stub(target.address)
    async with channel:
        proto = await st.Get(g.GetRequest(path=[path("/system/state")], encoding=g.PROTO), metadata=AUTH, timeout=5)
        ietf = await st.Get(g.GetRequest(path=[path("/system")], encoding=g.JSON_IETF), metadata=AUTH, timeout=5)
        plain = await st.Get(g.GetRequest(path=[path("/openconfig-system:system/state/hostname")], encoding=g.JSON),
                             metadata=AUTH, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await st.Get(g.GetRequest(path=[path("/system/clock")], encoding=g.JSON), metadata=AUTH, timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "/system/state" in e.value.details()
    [n] = proto.notification
    assert [x.name for x in n.prefix.elem] == ["system", "state"]
    values = leaves(n)
    assert values["hostname"] == "leaf7" and values["software-version"].startswith("nms-lab gNMI target")
    assert values["boot-time"] == boot_ns and abs(values["up-time"] - uptime_ns) < 5e9
    [n] = ietf.notification
    doc = json.loads(n.update[0].val.json_ietf_val)
    assert doc["openconfig-system:hostname"] == "leaf7" and doc["openconfig-system:boot-time"] == str(boot_ns)
    assert json.loads(plain.notification[0].update[0].val.json_val) == {"hostname": "leaf7"}


def test_path_selection():
    every = frozenset(LEAVES)
    assert select(None, path("/interfaces")) == Selection(None, every)
    assert select(None, path("/")) == Selection(None, every)
    assert select(None, path("/interfaces/interface[name=*]/state/counters")).name is None
    sel = select(path("/openconfig-interfaces:interfaces/interface[name=swp1]"), path("/state/oper-status"))
    assert sel == Selection("swp1", frozenset({"state/oper-status"}))
    assert select(None, path("/interfaces/interface/ethernet")).leaves == {"ethernet/state/port-speed"}
    for bad in ["/interfaces/interface[name=x]/state/mtu/deeper", "/interfaces/subinterface",
                "/interfaces/interface[ifindex=3]", "/lldp"]:
        with pytest.raises(PathError) as e:
            select(None, path(bad))
        assert e.value.code == "NOT_FOUND" and bad.split("[")[0].split("/")[1] in str(e.value)


def test_default_interfaces_leave_out_lo_and_sigterm_stops_a_busy_target(tmp_path):
    async def run(t: Target) -> tuple[list[str], float]:
        channel, st = stub(t.address)
        async with channel:
            answer = await st.Get(g.GetRequest(path=[path("/interfaces")], encoding=g.JSON), timeout=5)
            names = [i["name"] for i in json.loads(answer.notification[0].update[0].val.json_val)
                     ["openconfig-interfaces:interface"]]
            call = st.Subscribe(requests(subscribe_list(g.Subscription(path=path("/interfaces"), mode=g.SAMPLE,
                                                                       sample_interval=SAMPLE_MS * 10**6))))
            async for r in call:
                if r.sync_response:
                    break
            t0 = time.monotonic()
            t.proc.send_signal(signal.SIGTERM)  # with a stream open
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
            return names, time.monotonic() - t0

    t = Target(tmp_path, "--insecure")
    before = {p.name for p in Path("/sys/class/net").iterdir()}
    try:
        names, ended = asyncio.run(run(t))
        assert t.proc.wait(10) == 0
    finally:
        t.stop()
    # every interface but lo (some may come and go meanwhile: other tests make veths)
    assert "lo" not in names and set(names) <= before | {p.name for p in Path("/sys/class/net").iterdir()}
    assert ended < 3


def test_plaintext_must_be_asked_for_and_bad_files_are_named(tmp_path):
    base = [sys.executable, "-m", "lab.gnmi_target", "--listen", "127.0.0.1:0"]
    out = subprocess.run(base, capture_output=True, text=True, cwd=REPO, timeout=30)
    assert out.returncode == 2 and "--insecure to serve plaintext on purpose" in out.stderr
    (tmp_path / "c.pem").write_text("x")
    pem = str(tmp_path / "c.pem")
    out = subprocess.run([*base, "--insecure", "--tls-cert", pem, "--tls-key", pem],
                         capture_output=True, text=True, cwd=REPO, timeout=30)
    assert out.returncode == 2 and "exclude each other" in out.stderr
    out = subprocess.run([*base, "--insecure", "--username", "u", "--password-file", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=REPO, timeout=30)
    assert out.returncode == 1 and "none: No such file" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([*base, "--tls-cert", pem, "--tls-key", pem], capture_output=True, text=True, cwd=REPO,
                         timeout=30)
    assert out.returncode == 1 and "c.pem: not a PEM certificate" in out.stderr and "Traceback" not in out.stderr


def test_tls_with_a_lab_certificate(tmp_path):
    tls.make_ca(tmp_path / "ca.pem", tmp_path / "ca.key")
    tls.issue(tmp_path / "ca.pem", tmp_path / "ca.key", tmp_path / "t.pem", tmp_path / "t.key", "t1", ["127.0.0.1"])
    tls.make_ca(tmp_path / "other.pem", tmp_path / "other.key", "another CA")
    assert (tmp_path / "t.key").stat().st_mode & 0o077 == 0
    t = Target(tmp_path, "--tls-cert", str(tmp_path / "t.pem"), "--tls-key", str(tmp_path / "t.key"),
               "--interfaces", "lo", *auth_args(tmp_path))

    async def capabilities(credentials) -> grpc.StatusCode:
        channel, st = stub(t.address, credentials)
        async with channel:
            try:
                await st.Capabilities(g.CapabilityRequest(), metadata=AUTH, timeout=3)
            except grpc.aio.AioRpcError as e:
                return e.code()
        return grpc.StatusCode.OK

    try:
        ok = asyncio.run(capabilities(grpc.ssl_channel_credentials((tmp_path / "ca.pem").read_bytes())))
        stranger = asyncio.run(capabilities(grpc.ssl_channel_credentials((tmp_path / "other.pem").read_bytes())))
        plain = asyncio.run(capabilities(None))
    finally:
        assert t.stop() == 0
    assert ok == grpc.StatusCode.OK  # verified against the CA, SAN 127.0.0.1
    assert stranger == grpc.StatusCode.UNAVAILABLE and plain == grpc.StatusCode.UNAVAILABLE


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a veth pair to change (needs root)")
def test_on_change_follows_links_appearing_changing_and_vanishing(tmp_path):
    """rtnetlink wakes the target: a new pair, carrier, admin state, MTU and removal reach an ON_CHANGE
    subscriber in well under a second (the rescan fallback would take up to one)."""
    tag = f"nmsgt{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    t = Target(tmp_path, "--insecure", "--interfaces", f"{tag}*")

    async def ip(*args: str) -> int:
        started = time.time_ns()
        proc = await asyncio.create_subprocess_exec("ip", *args)
        assert await proc.wait() == 0
        return started

    async def run():
        channel, st = stub(t.address)
        subs = [g.Subscription(path=path(f"/interfaces/interface/state/{leaf}"), mode=g.ON_CHANGE)
                for leaf in ("oper-status", "admin-status", "mtu")]
        events: list[tuple[int, str, dict | None]] = []  # (received ns, interface, leaves or None: deleted)
        async with channel:
            call = st.Subscribe(requests(subscribe_list(*subs)), metadata=(), timeout=30)
            assert (await call.read()).sync_response  # no such interface yet: nothing before the sync

            async def reader():
                while (r := await call.read()) is not grpc.aio.EOF:
                    n = r.update
                    events.append((time.time_ns(), n.prefix.elem[1].key["name"], None if n.delete else leaves(n)))

            task = asyncio.create_task(reader())

            async def step(*args: str, until) -> float:
                """Run `ip args`; seconds until an event satisfies `until`."""
                seen = len(events)
                started = await ip(*args)
                for _ in range(200):
                    hit = [rx for rx, name, v in events[seen:] if until(name, v)]
                    if hit:
                        return (hit[0] - started) / 1e9
                    await asyncio.sleep(0.01)
                raise AssertionError(f"ip {' '.join(args)}: no matching event in {events[seen:]}")

            lat = {"appear": await step("link", "add", a, "type", "veth", "peer", "name", b,
                                        until=lambda n, v: n == b and v and v["state/admin-status"] == "DOWN")}
            lat["up"] = await step("link", "set", a, "up",
                                   until=lambda n, v: n == a and v and v.get("state/admin-status") == "UP")
            lat["carrier up"] = await step("link", "set", b, "up",
                                           until=lambda n, v: n == a and v and v.get("state/oper-status") == "UP")
            # a veth whose peer (here in the same namespace) is down is LOWER_LAYER_DOWN
            lat["carrier down"] = await step("link", "set", b, "down", until=lambda n, v: n == a and v and v.get(
                "state/oper-status") == "LOWER_LAYER_DOWN")
            lat["mtu"] = await step("link", "set", a, "mtu", "1400",
                                    until=lambda n, v: n == a and v == {"state/mtu": 1400})
            lat["gone"] = await step("link", "del", a, until=lambda n, v: n == b and v is None)
            task.cancel()
            call.cancel()
        return lat, events

    try:
        lat, events = asyncio.run(run())
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        assert t.stop() == 0
    print("ON_CHANGE latency (ms):", {k: round(v * 1e3, 1) for k, v in lat.items()})
    assert all(v < 0.1 for v in lat.values()), lat  # rtnetlink, not the 1 s rescan
    assert {name for _, name, v in events if v is None} == {a, b}  # both ends deleted
