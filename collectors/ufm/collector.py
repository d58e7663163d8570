"""The UFM collector: one NVIDIA UFM Enterprise server, reporting the InfiniBand switches it manages.

The configured device is the UFM server (its `collectors.ufm` section); one poll reads, from UFM
Enterprise REST API Guide v6.22.1 routes (docs/ufm.md):

1. GET  app/ufm_version       -> DeviceFacts of the UFM server itself (first record: the service
                                  files a poll's facts under the polled device by the first one)
2. GET  resources/systems     -> DeviceFacts per switch (`systems` patterns pick which)
3. GET  resources/ports       -> PortSample per switch port (state, speed, MTU)
4. POST monitoring/snapshot   -> the PortSamples' counters (64-bit; data counted in 4-octet units),
   or, when `telemetry_url` is set, UFM Telemetry's Prometheus endpoint (collectors/ufm/telemetry.py)
5. GET  resources/links       -> LldpNeighbor per switch end of each link (paged: page_number/rpp)
6. GET  app/events            -> LinkEvent for link downs / flaps the samples cannot see, and a
                                  `ufm_event` point per new event (collectors/ufm/events.py)
7. GET  app/alarms            -> a `ufm_alarm` point per active alarm

Records name switches by UFM's system name, so a switch also polled over SNMP under the same name
is the same device. 1-3 are the poll: their failure fails it. 4-7 add to it: a bad answer there
(HTTP error, not JSON, wrong shape) is a problem of the poll (PollResult.problems), and the poll goes
on; a timeout, a refused connection or refused credentials fail the poll whatever the route. Items of
an answer that lack what is needed are left out and noted as one problem per route (the items and
why); the rest is kept.
"""

from __future__ import annotations

import fnmatch
import time
from typing import Any
from zoneinfo import ZoneInfo

from collectors.base import Collector, CollectorBadResponse, DeviceCache, PollProblem, PollResult, PollStart
from collectors.ufm import telemetry as ufm_telemetry
from collectors.ufm.events import LinkEvidence, alarm_points, event_points
from collectors.ufm.model import (
    COUNTERS,
    Bad,
    Fabric,
    Problems,
    counter_values,
    device_facts,
    index_ports,
    index_systems,
    neighbors,
    port_sample,
    snapshot_counters,
)
from collectors.ufm.settings import UfmSettings
from collectors.ufm.transport import UfmClient
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint

# The whole fabric's ports in one snapshot, as public callers ask (IBM/CAST
# csm_big_data/data-aggregators/ufm/ufmCollection.py); the answer keys each port by its UFM name
SNAPSHOT_SCOPE = {"functions": ["RAW"], "scope_object": "Site", "interval": 2, "monitor_object": "Port",
                  "objects": ["Grid.default"]}


class UfmCollector(Collector):
    name = "ufm"
    settings_model = UfmSettings
    counter_bits: dict[str, int] = {}  # every UFM counter is 64-bit
    link_state_rank = 20  # the subnet manager's view, refreshed by its own sweeps

    def __init__(self, flap_count: int = 8, flap_window_s: float = 3600.0):
        self.flap_count, self.flap_window_s = flap_count, flap_window_s
        self._clients: DeviceCache[UfmClient] = DeviceCache(
            lambda device, settings: UfmClient(device.name, device.mgmt_address, settings),
            release=UfmClient.close, forget=self._forget)
        self._evidence: dict[str, LinkEvidence] = {}
        self._snapshots: dict[str, tuple[int | None, int]] = {}  # device -> (UFM's snapshot time, our ts)
        self._link_downed: dict[str, dict[str, int]] = {}  # device -> UFM port name -> LinkDownedCounterExtended

    @classmethod
    def from_config(cls, config: Any) -> UfmCollector:
        return cls(config.thresholds.flap_count, config.thresholds.flap_window)

    async def _client(self, device: SwitchConfig) -> UfmClient:
        return await self._clients.get(device, self.required_settings(device))

    def _forget(self, device: str) -> None:
        """A new client for `device`: its link evidence, snapshot time and Link Downed counters start over."""
        self._evidence[device] = LinkEvidence(self.flap_count, self.flap_window_s)
        self._snapshots.pop(device, None)
        self._link_downed.pop(device, None)

    async def collect(self, device: SwitchConfig) -> PollResult:
        client = await self._client(device)
        s = client.settings
        started = PollStart()
        client.requests = 0
        zone, problems, failed = ZoneInfo(s.timezone), Problems(), []
        optional = _Optional(client, failed)
        version = await client.get("/app/ufm_version")
        route = "GET " + client.route("/resources/systems")
        fabric = index_systems(await client.get_list("/resources/systems"), route, problems,
                               lambda name: not s.systems or any(fnmatch.fnmatchcase(name, p) for p in s.systems))
        _all_bad(device.name, client, route, problems)
        route = "GET " + client.route("/resources/ports")
        index_ports(fabric, await client.get_list("/resources/ports"), route, problems)
        _all_bad(device.name, client, route, problems)
        now = time.time_ns()
        ts, counters, extra = now, {}, {}
        if s.counters and fabric.switch_ports():
            route = (f"GET {s.telemetry_url}" if s.telemetry_url
                     else "POST " + client.route("/monitoring/snapshot"))
            pending = (self._telemetry(client, fabric, now, problems) if s.telemetry_url
                       else self._counters(client, fabric, zone, now, problems))
            ts, counters, extra = await optional(route, "port counters left out", pending, (now, {}, {}))
        samples = [port_sample(ref, ts, counters.get(ref.name, {})) for ref in fabric.switch_ports()]
        records: list[Any] = [_ufm_facts(device.name, version, now, len(samples)), *device_facts(fabric, now), *samples]
        records += _error_points(device.name, fabric, extra, ts)
        peers = {}
        if s.links:
            items = await optional("GET " + client.route("/resources/links"), "links left out",
                                   client.get_list("/resources/links", paged=True), None)
            if items is not None:
                found, peers = neighbors(fabric, items, "GET " + client.route("/resources/links"), problems, now)
                records += found
        downs = self._downs(device.name, extra)
        if s.events or downs:
            items = (await optional("GET " + client.route("/app/events"), "events left out",
                                    client.get_list("/app/events"), None) if s.events else [])
            if items is not None:
                evidence = self._evidence[device.name]
                fresh = evidence.new_events(items, "GET " + client.route("/app/events"), problems)
                by_end = {(x.device, x.port): x for x in samples}
                records += evidence.link_events(fresh, fabric, peers, by_end, now, zone, downs)
                records += event_points(device.name, fresh, fabric, now, zone)
        if s.alarms:
            items = await optional("GET " + client.route("/app/alarms"), "alarms left out",
                                   client.get_list("/app/alarms"), None)
            if items is not None:
                records += alarm_points(device.name, items, "GET " + client.route("/app/alarms"), problems, fabric,
                                        now)
        return self.result(device.name, started, records, values=client.requests, problems=failed + problems.found())

    async def _counters(self, client: UfmClient, fabric: Fabric, zone: ZoneInfo, now: int, problems: Problems
                        ) -> tuple[int, dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Counters of every reported switch port from one Monitoring snapshot of the whole fabric."""
        route = "POST " + client.route("/monitoring/snapshot")
        answer = await client.post("/monitoring/snapshot", {
            "attributes": [attribute for attribute, _ in COUNTERS.values()], **SNAPSHOT_SCOPE})
        try:
            when, ports = snapshot_counters(answer, zone)
        except Bad as e:
            raise CollectorBadResponse(client.device, f"{client.base}: {route}: {e}") from None
        values: dict[str, dict[str, int]] = {}
        wanted = fabric.switch_ports()
        problems.totals[route] = len(wanted)
        for i, ref in enumerate(wanted):
            entry = ports.get(ref.name)
            try:
                if entry is None:
                    raise Bad("not in the snapshot")
                values[ref.name] = counter_values(entry)
            except Bad as e:
                problems.note(route, i, {"name": ref.name}, str(e))
        return self._sample_time(client.device, when, now), values, {}

    async def _telemetry(self, client: UfmClient, fabric: Fabric, now: int, problems: Problems
                         ) -> tuple[int, dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Counters of every reported switch port from UFM Telemetry's Prometheus endpoint."""
        s = client.settings
        url = str(s.telemetry_url)
        route = f"GET {url}"
        text = await client.scrape(url)
        try:
            scrape = ufm_telemetry.parse(text, data_in_words=s.telemetry_data_unit == "words")
        except Bad as e:
            raise CollectorBadResponse(client.device, f"{client.base}: {route}: {e}") from None
        for i, problem in enumerate(scrape.problems):
            problems.note(route, i, None, problem)
        wanted = {ref.name for ref in fabric.switch_ports()}
        problems.totals[route] = max(len(scrape.problems), len(wanted))
        for i, name in enumerate(sorted(wanted - set(scrape.counters)), len(scrape.problems)):
            problems.note(route, i, {"name": name}, "no counters for this switch port")
        counters = {k: v for k, v in scrape.counters.items() if k in wanted}
        extra = {k: v for k, v in scrape.extra.items() if k in wanted}
        return self._sample_time(client.device, scrape.newest_ns, now), counters, extra

    def _sample_time(self, device: str, newest: int | None, now: int) -> int:
        """Now when the source's sample time moved since the last poll, else the time those values were
        first seen (so that a repeated sample gives no rate over the wrong interval)."""
        previous = self._snapshots.get(device)
        ts = previous[1] if previous is not None and newest is not None and previous[0] == newest else now
        self._snapshots[device] = (newest, ts)
        return ts

    def _downs(self, device: str, extra: dict[str, dict[str, int]]) -> dict[str, int]:
        """Downs per UFM port name since the last poll, from UFM Telemetry's LinkDownedCounterExtended."""
        now = {name: c["link_downed"] for name, c in extra.items() if "link_downed" in c}
        before = self._link_downed.get(device, {})
        if now:
            self._link_downed[device] = now
        return {name: n - before[name] for name, n in now.items() if name in before and n > before[name]}

    async def forget(self, device_name: str) -> None:
        """Given to another member: its client closed, its event cursor, snapshot time and Link Downed
        counters dropped (taken back later, its first poll starts them again, as at a member new to it)."""
        client = self._clients.pop(device_name)
        self._forget(device_name)
        self._evidence.pop(device_name, None)  # made again with the next client (_forget)
        if client is not None:
            await UfmClient.close(client)

    async def close(self) -> None:
        await self._clients.close_all()
        self._evidence.clear()
        self._snapshots.clear()
        self._link_downed.clear()


class _Optional:
    """Routes that add to the poll: a bad answer is a problem, not the poll's failure (timeouts,
    refused connections and credentials still are)."""

    def __init__(self, client: UfmClient, failed: list[PollProblem]):
        self.client, self.failed = client, failed

    async def __call__(self, route: str, consequence: str, pending, default):
        try:
            return await pending
        except CollectorBadResponse as e:  # its message: "<base URL>: <route>: <why>"
            why = e.message.removeprefix(f"{self.client.base}: ").removeprefix(f"{route}: ")
            self.failed.append(PollProblem(what=route, reason=f"{why}; {consequence}"))
            return default


def _error_points(ufm: str, fabric: Fabric, extra: dict[str, dict[str, int]], ts: int) -> list[GenericPoint]:
    """UFM Telemetry's counters that have no PortSample field (Link Downed, symbol errors), per switch port."""
    out = []
    for name, fields in extra.items():
        ref = fabric.ports[name]
        out.append(GenericPoint(measurement="ufm_port_errors", ts=ts,
                                tags={"ufm": ufm, "device": ref.device, "port": ref.port}, fields=dict(fields)))
    return out


def _all_bad(device: str, client: UfmClient, route: str, problems: Problems) -> None:
    """An answer none of whose items can be used fails the poll (nothing to report is not 'ok')."""
    notes, total = problems.by_route.get(route, []), problems.totals.get(route, 0)
    if total and len(notes) == total:
        raise CollectorBadResponse(device, f"{client.base}: {route}: none of its {total} items is usable: "
                                           f"{notes[0]}")


def _ufm_facts(device: str, version: Any, ts: int, ports: int) -> DeviceFacts:
    release = version.get("ufm_release_version") if isinstance(version, dict) else None
    descr = "NVIDIA UFM Enterprise" + (f" {release}" if isinstance(release, str) else "")
    return DeviceFacts(device=device, ts=ts, sys_name=device[:255], interfaces=ports, sys_descr=descr)

