"""Sharded polling with real processes: two `nms serve --role poll` members against one nats-server
with JetStream (tests/_nats.py), a real net-snmpd that every configured switch points at
(tests/_snmpd.py), each member writing to its own InfluxDB database (tests/_influx.py), so what a
member polled is counted in InfluxDB, asked directly: in steady state each switch's samples land in
its owner's database only; after `kill -9` of one member, the other's database holds samples of
every switch of the dead member, timestamped within 2 heartbeats of the kill. A third process, an
API worker, shows every switch with the member polling it, before and after the kill."""

from __future__ import annotations

import time
import uuid

import httpx
import yaml
from _snmpd import Snmpd
from test_cluster_write import Member

from nms.rendezvous import assign
from tests.helpers import auth, wait_until

HEARTBEAT = 2.0
SWITCHES = [f"sw{i}" for i in range(6)]
NS = 10**9


def poll_member(tmp_path, name: str, influxd, nats_url: str, server: Snmpd, role: str = "poll") -> Member:
    """A test_cluster_write Member whose config polls the switches as the member `name`."""
    database = f"p_{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    member = Member(tmp_path, name, role, influxd.url, database, nats_url)
    doc = yaml.safe_load(member.config.read_text())
    settings = server.settings(interfaces=["lo"], interval=2.0, deadline=1.9)
    doc["polling"] = {"enabled": True}
    doc["cluster"]["poll"] = {"heartbeat": HEARTBEAT, "member": name}
    doc["fabric"] = {"switches": [{"name": s, "mgmt_address": "127.0.0.1", "collectors": {"snmp": settings}}
                                  for s in SWITCHES]}
    member.config.write_text(yaml.safe_dump(doc))
    member.database = database  # type: ignore[attr-defined]
    return member


def sampled_since(influxd, member: Member, since_ns: int) -> dict[str, int]:
    """device -> the earliest port sample timestamp (ns) at or after since_ns in the member's database."""
    q = f'SELECT first("in_octets") FROM "port_counters" WHERE time >= {since_ns} GROUP BY "device"'
    result = influxd.query(q, db=member.database)["results"][0]  # type: ignore[attr-defined]
    return {s["tags"]["device"]: int(s["values"][0][0]) for s in result.get("series", [])}


def api_view(api: Member) -> dict[str, tuple[str, str | None, int]]:
    """The API worker's /devices and /ports: device -> (state, the member polling it, ports shown)."""
    devices = httpx.get(f"{api.url}/devices", headers=auth("read"), timeout=5).json()
    ports = httpx.get(f"{api.url}/ports", headers=auth("read"), timeout=5).json()
    return {d["device"]: (d["state"], d["member"], sum(p["device"] == d["device"] for p in ports)) for d in devices}


def test_two_poll_processes_split_the_switches_and_a_killed_ones_are_polled_by_the_other(
        tmp_path, influxd, nats_server, snmpd):
    a = poll_member(tmp_path, "poll-a", influxd, nats_server.url, snmpd)
    b = poll_member(tmp_path, "poll-b", influxd, nats_server.url, snmpd)
    # a third process, an API worker that polls nothing: its /devices and /ports show every switch,
    # from the members' polls on the bus (nms/app/polled_view.py)
    api = poll_member(tmp_path, "api-w", influxd, nats_server.url, snmpd, role="api")
    try:
        api.start()
        a.start()
        a.wait_ready("poll shard: member poll-a joined")
        b.start()
        b.wait_ready("poll shard: member poll-b joined poll-a, poll-b")
        wait_until(lambda: "members now poll-a, poll-b (joined: poll-b)" in a.text(), 30,
                   what="poll-a to see poll-b", why=a.tail)
        expected = assign(SWITCHES, ["poll-a", "poll-b"])
        assert expected["poll-a"] and expected["poll-b"]

        # steady state: each switch's samples land in its owner's database only (from when a poll that
        # poll-a began before it gave its switches away must have ended: its deadline, 1.9 s)
        steady = time.time_ns() + 2 * NS
        wait_until(lambda: set(sampled_since(influxd, a, steady)) >= expected["poll-a"]
                   and set(sampled_since(influxd, b, steady)) >= expected["poll-b"], 30,
                   what="every switch sampled by its owner", why=lambda: a.tail() + b.tail())
        killed = time.time_ns()
        assert set(sampled_since(influxd, a, steady)) == expected["poll-a"]
        assert set(sampled_since(influxd, b, steady)) == expected["poll-b"]
        owner = {s: m for m, switches in expected.items() for s in switches}
        api.wait_ready()
        wait_until(lambda: api_view(api) == {s: ("ok", owner[s], 1) for s in SWITCHES}, 30,
                   what="the API worker to show every switch polled by its owner", why=lambda: str(api_view(api)))

        b.kill()  # SIGKILL: no leave, its entry expires in the bus
        taken = wait_until(lambda: (found := sampled_since(influxd, a, killed)).keys() >= expected["poll-b"]
                           and found, 30, what="poll-b's switches sampled by poll-a", why=a.tail)
        late = {s: (taken[s] - killed) / NS for s in expected["poll-b"]}
        assert max(late.values()) <= 2 * HEARTBEAT, f"first samples after the kill: {late}"
        assert "members now poll-a (gone: poll-b)" in a.text()
        assert f"poll shard: poll-a took {len(expected['poll-b'])} switches" in a.text()
        print(f"poll-b's switches first sampled by poll-a {max(late.values()):.2f} s after kill -9")
        wait_until(lambda: api_view(api) == {s: ("ok", "poll-a", 1) for s in SWITCHES}, 30,
                   what="the API worker to show poll-a polling every switch", why=lambda: str(api_view(api)))
    finally:
        a.stop()
        b.stop()
        api.stop()
