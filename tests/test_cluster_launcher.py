"""`nms cluster up|status|down` with real processes: nats-server (JetStream), PostgreSQL, influxd and
`nms serve` members per role, all started by the launcher (nms/app/cluster_launcher.py) on loopback.

A batch ingested through one API worker is read back through the other once the writer stored it
(api -> NATS -> write -> InfluxDB -> api); `status --json` says which member is alive, also after one
is killed with SIGKILL; `down` leaves no process of the cluster (checked by pid in /proc, not through
the launcher); a second `up` in the same directory works; a missing binary is named with its
Debian package."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import nats.errors
import pytest
from _nats import have_nats_server

from nms.app.local_daemons import postgres_bin_dir
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (have_nats_server() and shutil.which("influxd") and postgres_bin_dir()),
                                reason="needs nats-server, influxdb and postgresql (scripts/test.sh installs them)")


def nms(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nms", "cluster", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


def running(pid: int) -> bool:
    """The pid is a live process (not gone, not a zombie), read from /proc directly."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def status(cluster: Path) -> tuple[int, dict[str, dict]]:
    r = nms("status", "--dir", str(cluster), "--json")
    return r.returncode, {m["name"]: m for m in json.loads(r.stdout)["members"]}


@pytest.fixture
def cluster():
    # short: PostgreSQL's socket path (<dir>/postgres/.s.PGSQL.5432) must fit 107 bytes
    path = Path(tempfile.mkdtemp(prefix="nms-cl-"))
    yield path
    if (path / "state.json").exists():
        nms("down", "--dir", str(path))
    shutil.rmtree(path, ignore_errors=True)


def test_up_ingest_through_one_worker_read_through_another_kill_down_up_again(cluster):
    started = time.monotonic()
    r = nms("up", "--dir", str(cluster), "--api", "2", "--write", "1", "--correlate", "1", "--poll", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("nats", "postgres", "influxd", "api-1", "api-2", "write-1", "correlate-1", "poll-1"):
        assert name in r.stdout
    rc, members = status(cluster)
    assert rc == 0 and all(m["state"] == "alive" for m in members.values()), members
    assert {m["role"] for m in members.values()} == {"nats", "postgres", "influxd", "api", "write", "correlate", "poll"}
    a, b = members["api-1"]["url"], members["api-2"]["url"]
    assert a != b and a.startswith("http://127.0.0.1:")
    for url in (a, b):
        assert httpx.get(f"{url}/health", timeout=5).json()["status"] == "ok"
    assert members["nats"]["health"] == "answers"
    # every nms member's health from its entry in the bus (nms/app/member_health.py), those without an
    # HTTP endpoint too: the poll member's share of the (no) switches, the correlate member's partition
    want = {"api-1": "ok", "api-2": "ok", "write-1": "ok", "correlate-1": "ok, partitions fabric",
            "poll-1": "ok, 0 switches"}
    wait_until(lambda: {n: m["health"] for n, m in status(cluster)[1].items() if n in want} == want, 15,
               what="every member's health entry", why=lambda: str(status(cluster)[1]))

    secrets = cluster / "secrets"
    for secret in secrets.iterdir():
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    ingest = {"Authorization": f"Bearer {(secrets / 'ingest-token').read_text().strip()}"}
    admin = {"Authorization": f"Bearer {(secrets / 'api-token').read_text().strip()}"}
    assert "nms_member_info{member=\"api-1\",roles=\"api\"} 1.0" in httpx.get(f"{a}/metrics", headers=admin).text
    listed = httpx.get(f"{b}/cluster/members", headers=admin, timeout=5).json()
    assert {(e["member"], tuple(e["roles"]), e["health"]["ok"]) for e in listed} == {
        ("api-1", ("api",), True), ("api-2", ("api",), True), ("write-1", ("write",), True),
        ("correlate-1", ("correlate",), True), ("poll-1", ("poll",), True)}
    assert 'nms_cluster_member_up{member="write-1",ok="true",roles="write"} 1.0' in httpx.get(
        f"{b}/metrics", headers=admin).text

    t0 = time.time_ns() - 60 * 10**9
    points = [{"measurement": "launcher_test", "tags": {"host": "gpu-1"}, "fields": {"seq": i}, "ts": t0 + i * 1000}
              for i in range(50)]
    r2 = httpx.post(f"{a}/ingest/points", json={"items": points}, headers=ingest, timeout=30)
    assert r2.status_code == 202 and r2.json()["accepted"] == 50, r2.text

    def read_through_b() -> list:
        q = {"measurement": "launcher_test", "start": t0, "end": t0 + 10**9}
        r = httpx.post(f"{b}/telemetry/query", json=q, headers=admin, timeout=10)
        assert r.status_code == 200, r.text
        series = r.json()["series"]
        return [row[1] for s in series for row in s["values"]]
    seqs = wait_until(lambda: len(read_through_b()) == 50 and read_through_b(), 60,
                      what="the batch ingested through api-1 readable through api-2",
                      why=lambda: (cluster / "members" / "write-1" / "serve.log").read_text()[-2000:])
    assert sorted(seqs) == list(range(50))

    for name in ("api-2", "write-1"):
        os.kill(members[name]["pid"], signal.SIGKILL)
        wait_until(lambda name=name: not running(members[name]["pid"]), 10, what=f"{name} gone")
    rc, after = status(cluster)
    assert rc == 1 and after["api-2"]["state"] == "dead" and after["api-2"]["health"] == "dead"
    # a dead member's store ledger (nms/store/influx.py): what InfluxDB had acknowledged to the writer
    assert after["write-1"]["state"] == "dead", after["write-1"]
    stored = re.fullmatch(r"dead; InfluxDB acknowledged ([\d,]+) points to it", after["write-1"]["health"])
    assert stored and int(stored[1].replace(",", "")) >= 50, after["write-1"]
    assert all(m["state"] == "alive" for name, m in after.items() if name not in ("api-2", "write-1"))

    r = nms("up", "--dir", str(cluster))
    assert r.returncode == 1 and "holds a running cluster" in r.stderr and "nms cluster down" in r.stderr

    r = nms("down", "--dir", str(cluster))
    assert r.returncode == 0, r.stderr
    assert not [name for name, m in members.items() if running(m["pid"])]
    assert (cluster / "state.json").exists()  # down keeps the directory

    r = nms("up", "--dir", str(cluster), "--api", "1", "--write", "1", "--correlate", "0", "--poll", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    rc, again = status(cluster)
    assert rc == 0 and set(again) == {"nats", "postgres", "influxd", "api-1", "write-1"}
    # the same data: what the first run stored is there
    b = again["api-1"]["url"]
    assert sorted(read_through_b()) == list(range(50))
    r = nms("down", "--dir", str(cluster), "--purge")
    assert r.returncode == 0 and not cluster.exists()
    assert not [name for name, m in again.items() if running(m["pid"])]
    print(f"launcher test took {time.monotonic() - started:.1f} s")


def test_missing_binary_is_named_with_its_package(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = nms("up", "--dir", str(tmp_path / "c"), env={**os.environ, "PATH": str(empty)})
    assert r.returncode == 1
    assert "nats-server (apt-get install nats-server)" in r.stderr and "influxd (apt-get install influxdb)" in r.stderr
    assert not (tmp_path / "c").exists()  # nothing made, nothing started


def test_status_and_down_of_no_cluster_say_so(tmp_path):
    for command in ("status", "down"):
        r = nms(command, "--dir", str(tmp_path))
        assert r.returncode == 1 and f"no cluster in {tmp_path}" in r.stderr


def test_member_config_from_the_example_cluster_config_validates_and_keeps_the_base(tmp_path):
    """What `up --config config/cluster.yaml` writes for a member: the launcher's servers, ports and
    secrets (as ${file:...} references, no secret in the file) over the base's own settings."""
    import yaml

    from nms.app.cluster_launcher import ClusterDir, member_config
    from nms.config import load_config

    cdir = ClusterDir(tmp_path)
    cdir.secrets.mkdir()
    for name in ("api-token", "ingest-token", "nats-token"):
        cdir.secret(name)
    base = yaml.safe_load((REPO / "config" / "cluster.yaml").read_text())
    base.setdefault("api", {})["tokens"] = [{"name": "noc-reader", "scopes": ["read"],
                                             "hash": "sha256:" + "0" * 64}]
    doc = member_config(base, cdir, "write-1", 18080, "nats://127.0.0.1:14222", "http://127.0.0.1:18086",
                        f"host={tmp_path / 'postgres'} port=5432 user=nms dbname=nms")
    path = tmp_path / "nms.yaml"
    path.write_text(yaml.safe_dump(doc))
    text = path.read_text()
    assert all((cdir.secrets / s).read_text().strip() not in text for s in ("api-token", "nats-token"))
    cfg = load_config(path)
    assert cfg.cluster.bus.servers == ["nats://127.0.0.1:14222"] and cfg.cluster.bus.replicas == 1
    assert cfg.cluster.bus.token.get_secret_value() == (cdir.secrets / "nats-token").read_text().strip()
    assert cfg.cluster.bus.username is None
    assert str(cfg.store.influxdb.url).startswith("http://127.0.0.1:18086") and cfg.store.influxdb.username is None
    assert cfg.state.backend == "postgresql" and cfg.api.host == "127.0.0.1" and cfg.api.port == 18080
    assert [t.name for t in cfg.api.tokens] == ["noc-reader", "cluster-admin", "cluster-ingest"]  # the base's kept
    assert cfg.data_dir == tmp_path / "members" / "write-1" / "data"
    assert cfg.cluster.poll.member == cfg.cluster.correlate.member == "write-1"  # stable across restarts
    # the base's own settings stay
    assert (cfg.cluster.write.batch_messages, cfg.cluster.write.ack_wait, cfg.cluster.bus.prefix) == (64, 30.0, "nms")
    assert cfg.site == "cluster-example"


def _jetstream_replicas(url: str, token: str, stream: str) -> tuple[int, int, int]:
    """(configured replicas, followers current, messages) of a stream, asked of JetStream directly."""
    import asyncio

    async def ask():
        nc = await nats.connect(url, token=token)
        try:
            info = await nc.jetstream(timeout=10).stream_info(stream)
            current = [p for p in info.cluster.replicas or [] if p.current and not p.offline]
            return info.config.num_replicas, len(current), info.state.messages
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_up_with_three_nats_nodes_replicates_the_bus_and_down_stops_every_node(cluster):
    from nms.config import load_config

    r = nms("up", "--dir", str(cluster), "--nats-nodes", "2")
    assert r.returncode == 1 and "--nats-nodes 2: one of 1, 3" in r.stderr and not (cluster / "state.json").exists()

    started = time.monotonic()
    r = nms("up", "--dir", str(cluster), "--nats-nodes", "3", "--api", "1", "--write", "1", "--poll", "1",
            "--correlate", "0")
    took = time.monotonic() - started
    assert r.returncode == 0, r.stdout + r.stderr
    rc, members = status(cluster)
    assert rc == 0 and "nats" not in members, members
    nodes = [members[f"nats-{i}"] for i in (1, 2, 3)]
    assert all(n["role"] == "nats" and n["state"] == "alive" and n["health"] == "answers" for n in nodes), nodes
    urls = [n["url"] for n in nodes]
    assert len(set(urls)) == 3 and all((cluster / f"nats-{i}" / f"nats-{i}.log").exists() for i in (1, 2, 3))

    # every member lists the three nodes and replicas 3; the launcher made the streams and the poll
    # members' bucket with 3 replicas before the members started, so none of them changed a stream
    for name in ("api-1", "write-1", "poll-1"):
        bus = load_config(cluster / "members" / name / "nms.yaml").cluster.bus
        assert bus is not None and bus.servers == urls and bus.replicas == 3
        assert "bus: stream" not in (cluster / "members" / name / "serve.log").read_text()
    token = (cluster / "secrets" / "nats-token").read_text().strip()
    for stream in ("NMS_TEL_SWITCH", "KV_nms_members_poll"):
        wait_until(lambda s=stream: _jetstream_replicas(urls[2], token, s)[:2] == (3, 2), 30,
                   what=f"{stream}: 3 replicas, the 2 followers current", ignore=(nats.errors.Error,))
    ingest = {"Authorization": f"Bearer {(cluster / 'secrets' / 'ingest-token').read_text().strip()}"}
    point = {"measurement": "nodes_test", "tags": {"host": "gpu-1"}, "fields": {"v": 1}, "ts": time.time_ns()}
    r2 = httpx.post(f"{members['api-1']['url']}/ingest/points", json={"items": [point]}, headers=ingest, timeout=30)
    assert r2.status_code == 202, r2.text

    os.kill(nodes[1]["pid"], signal.SIGKILL)
    wait_until(lambda: not running(nodes[1]["pid"]), 10, what="nats-2 gone")
    rc, after = status(cluster)
    assert rc == 1 and after["nats-2"]["state"] == "dead"
    assert all(m["state"] == "alive" for name, m in after.items() if name != "nats-2")

    r = nms("down", "--dir", str(cluster))
    assert r.returncode == 0, r.stderr
    assert "nats-1: stopped" in r.stdout and "nats-2: not running" in r.stdout and "nats-3: stopped" in r.stdout
    assert not [name for name, m in members.items() if running(m["pid"])]

    # up again on the same stores with new ports: the nodes keep their names, so JetStream finds its
    # peers and the stream its message
    r = nms("up", "--dir", str(cluster), "--nats-nodes", "3", "--api", "1", "--write", "0", "--poll", "0",
            "--correlate", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    rc, again = status(cluster)
    assert rc == 0 and {n for n, m in again.items() if m["role"] == "nats"} == {"nats-1", "nats-2", "nats-3"}
    url = again["nats-1"]["url"]
    wait_until(lambda: _jetstream_replicas(url, token, "NMS_TEL_HOST") == (3, 2, 1), 30,
               what="the stream's message on 3 current replicas after the second up",
               ignore=(nats.errors.Error,))  # a stream info may go unanswered while the nodes catch up
    r = nms("down", "--dir", str(cluster))
    assert r.returncode == 0 and not [name for name, m in again.items() if running(m["pid"])]
    print(f"up with 3 NATS nodes took {took:.1f} s")
