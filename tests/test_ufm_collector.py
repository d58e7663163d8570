"""The UFM collector against a stand-in UFM Enterprise server (tests/_ufm.py): a real HTTP server on
127.0.0.1. No real UFM ran these tests.

The stand-in follows the NVIDIA UFM Enterprise REST API Guide v6.22.1 (docs.nvidia.com/networking,
"ufmenterpriserestapiv6221"), section by section:

* "REST API Complementary Information": basic authentication on /ufmRest (`curl -u user:password`);
  token authentication on /ufmRestV3. The token header, `Authorization: Basic <token>`, is the form
  NVIDIA's own client sends (Mellanox/ufm_sdk_3.0, utils/ufm_rest_client.py); the part of the
  section that spells it out could not be read here.
* "UFM Version REST API": GET app/ufm_version, the example answer as printed.
* "Systems REST API": GET resources/systems and its `type` filter. Its example answer could not be
  read here; the fields used (system_name, guid, ip, type, model, vendor, fw_version, technology)
  are the ones NVIDIA's UFM plugins read (ufm_sdk_3.0 snmp_receiver_plugin, gnmi_nvos_events_plugin).
* "Ports REST API": GET resources/ports (and `?sys_type=Switch`), the example's fields description,
  number, external_number, physical_state, path, tier, high_ber_severity, lid, mirror, logical_state,
  capabilities, mtu, peer_port_dname, severity, active_speed, enabled/supported_speed, active_width,
  enabled/supported_width as printed; name, dname, guid, system_name, systemID, node_description,
  peer, peer_node_name (the rest of the example) as UFM clients read them.
* "Links REST API": source_guid, source_port, destination_guid, destination_port,
  source_port_dname, destination_port_dname, width, severity, name, capabilities as printed (v6.19.3,
  unchanged since v6.11); source/destination_port_node_description as NVIDIA's NDT plugin reads them;
  paging with page_number/rpp answered as {"data": [...]} as NVIDIA's client asks for it.
* "Alarms REST API": the example's fields (id, type, name, description, event_type, duration,
  reason, severity, timestamp, counter, event_count, object_name, object_path), its "Link HW Error" /
  "Link Downed" / Infiniband_LinkDowned alarm and its reason text.
* "Events REST API": the example's fields (id, name, type, event_type, severity, timestamp, counter,
  category, object_name, object_path, write_to_syslog, description).
* "Monitoring REST API": the attribute names Infiniband_MBIn/MBOut ("data octets, divided by 4")
  and PckIn/PckOut, RAW function, the request fields of a session (attributes, functions,
  scope_object, monitor_object, objects).

Shapes from other public sources (each also cited where the stand-in serves it):

* Snapshot request `scope_object: "Site"`, `monitor_object: "Port"`, `objects: ["Grid.default"]`,
  `interval: 2`, and the attributes Infiniband_RcvErrors / Infiniband_XmtDiscards / Infiniband_LinkDowned:
  IBM/CAST csm_big_data/data-aggregators/ufm/ufmCollection.py (POST_PAYLOAD; it reads
  `data[<time>]["Port"][<port>]`). The stand-in answers no other form.
* Snapshot answer, the values one level down under "statistics" and the time as
  'YYYY-MM-DD HH:MM:SS': UFM Enterprise REST API Guide v6.18.0, "Telemetry REST API", the history
  example ({"2021-12-01 19:12:36": {"Port": {"ec0d9a03007d7f0a_1": {"statistics": {...}, "guid": ...,
  "name": ...}}}}), the same monitoring data keyed the same way.
* Link events: event ids 328 "Link is Up" / 329 "Link is Down" in category Fabric_Topology (IBM/CAST
  csmd/src/ras/ufm/ufm_csm_ras_type_data.csv, from UFM's event policy); names "Link went down" /
  "Link is up" and the text "(Switch:a ...) - (Switch:b ...)" (Mellanox/ufm_sdk_3.0 scripts/eventor.py,
  plugins/ufm_log_analyzer_plugin events_log_analyzer.py); the object of type "Link" named
  `<guid>_<port> : <guid>_<port>` (ufm_sdk_3.0 plugins/ufm_log_analyzer_plugin/src/loganalyze/
  log_parsing/event_log_regex.py, LINK_OBJ_REGEX). The event id in `event_type` with `type` the object
  type (guide v6.24.2 "Events REST API" example), or in `type` (guide v6.12.0 example: "type": "352").
* Ports' `systemID` (the chassis GUID; a port's own GUID may differ): NVIDIA/bare-metal-manager-core
  crates/api/src/ib/ufmclient/mod.rs (`#[serde(rename = "systemID")]`) and its test ports in
  crates/api/src/ib/rest.rs (guid 1070fd0300176625, systemID 1070fd0300176624).
* Client-certificate authentication: guide "Client Authentication REST API" (a client certificate's
  SAN is associated with a UFM user); NVIDIA's client (bare-metal-manager-core
  crates/api/src/ib/ufmclient/{mod,rest}.rs) presents CA, certificate and key over TLS, on /ufmRest,
  with no password.
* UFM Telemetry: Prometheus text on port 9001, path `enterprise` (ufm_sdk_3.0
  plugins/grafana_infiniband_telemetry_plugin: conf/*.cfg and src/api/labels_api.py, which reads the
  labels `port_guid="0x..."` and `port_num`); counter names PortXmitDataExtended (NVIDIA's Grafana
  dashboard plugins/grafana_telemetry_plugin/Infiniband_Telemetry.json, plotted as rate x 8 bit/s,
  i.e. octets), PortRcvDataExtended, LinkDownedCounterExtended (fluentd_telemetry_plugin README,
  utils/netfix/link_flapping.py), PortRcvPktsExtended, PortRcvErrors, Symbol_Errors
  (pdr_deterministic_plugin ufm_sim_web_service/constants.py). PortXmitPktsExtended and
  PortXmitDiscards are the IB PortCounters names by analogy, not seen in a UFM sample.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import time

import pytest
import yaml
from _ufm import GUID, PASSWORD, TOKEN, USERNAME, UfmStandIn, link_event, node_guid, port_name

from collectors.base import (
    CollectorAuthError,
    CollectorBadResponse,
    CollectorConfigError,
    CollectorTimeout,
    CollectorUnreachable,
)
from collectors.ufm.collector import UfmCollector
from collectors.ufm.settings import UfmSettings
from correlator.engine import Correlator
from nms.app.polling import Poller
from nms.config import parse_config
from nms.config.models import SwitchConfig
from nms.records import DeviceFacts, GenericPoint, LinkEvent, LldpNeighbor, PortRates, PortSample

NS = 10**9
INTER_SWITCH = {("leaf-1", "1/1/1", "spine-1", "1/1/1"), ("leaf-1", "1/2/1", "spine-2", "1/1/1"),
                ("leaf-2", "1/1/1", "spine-1", "1/2/1"), ("leaf-2", "1/2/1", "spine-2", "1/2/1")}
ACCESS = {("leaf-1", "1/3/1", "gpu-01", "mlx5_0"), ("leaf-1", "1/4/1", "gpu-02", "mlx5_0"),
          ("leaf-2", "1/3/1", "gpu-03", "mlx5_0"), ("leaf-2", "1/4/1", "gpu-04", "mlx5_0")}
FLAPPING = "leaf-1:1/2/1--spine-2:1/1/1"


@pytest.fixture
def ufm():
    server = UfmStandIn().start()
    yield server
    server.stop()


def device(ufm: UfmStandIn, **settings) -> SwitchConfig:
    auth = {"token": TOKEN} if settings.pop("token_auth", False) else {"username": USERNAME, "password": PASSWORD}
    return SwitchConfig(name="ufm-1", mgmt_address="127.0.0.1",
                        collectors={"ufm": {"url": ufm.url, **auth, "backoff": 0.05, **settings}})


def poll(dev: SwitchConfig, collector: UfmCollector | None = None, deadline: float | None = None):
    collector = collector or UfmCollector()

    async def run():
        try:
            return await collector.collect_with_deadline(dev, deadline)
        finally:
            await collector.close()

    return asyncio.run(run())


def of(records, kind):
    return [r for r in records if isinstance(r, kind)]


def requests_to(ufm: UfmStandIn, route: str):
    return [r for r in ufm.requests if r[1].endswith(route)]


# --- a poll -------------------------------------------------------------------------------------


def test_a_poll_reports_the_switches_ufm_manages_with_exact_values(ufm, caplog):
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log requests at debug level
    collector = UfmCollector()
    result = poll(device(ufm), collector)
    facts = of(result.records, DeviceFacts)
    assert result.records[0] == facts[0] and facts[0].device == "ufm-1"  # the service files facts by the first
    assert facts[0].sys_descr == "NVIDIA UFM Enterprise 6.18.0-5" and facts[0].interfaces == 14
    by_name = {f.device: f for f in facts[1:]}
    assert sorted(by_name) == ["leaf-1", "leaf-2", "spine-1", "spine-2"]  # switches only, not the GPU hosts
    assert by_name["leaf-2"].sys_descr == "NVIDIA MQM9700, firmware 31.2012.1068"
    assert by_name["leaf-2"].lldp_chassis_id == GUID["leaf-2"] and by_name["leaf-2"].interfaces == 5

    samples = {(s.device, s.port): s for s in of(result.records, PortSample)}
    assert len(samples) == 14 and not any(d.startswith("gpu") for d, _ in samples)
    raw = ufm.data["counters"][port_name("spine-2", "1/1/1")]
    s = samples[("spine-2", "1/1/1")]
    assert (s.in_octets, s.out_octets) == (4 * raw["Infiniband_MBIn"], 4 * raw["Infiniband_MBOut"]) \
        == (20_012_000_036, 28_024_000_348)  # UFM counts data in 4-octet units
    assert (s.in_pkts, s.out_pkts, s.in_errors, s.out_discards) == (90_003_003, 80_006_009, 0, 21)
    assert (s.oper_status, s.speed_bps, s.mtu, s.out_errors, s.in_discards) == ("up", 400 * 10**9, 4096, None, None)
    assert s.counter_bits is None and result.counter_bits == {}  # all 64-bit
    assert (samples[("spine-1", "1/3/1")].oper_status, samples[("spine-1", "1/3/1")].speed_bps) == ("down", None)
    assert samples[("leaf-2", "1/5/1")].oper_status == "down"  # physical Disabled

    seen = {(n.device, n.port, n.remote_name, n.remote_port) for n in of(result.records, LldpNeighbor)}
    both_ways = INTER_SWITCH | {(c, d, a, b) for a, b, c, d in INTER_SWITCH}
    assert seen == both_ways | ACCESS  # the aggregation node's link is no cable
    host_end = next(n for n in of(result.records, LldpNeighbor) if n.remote_name == "gpu-03")
    assert host_end.remote_chassis_id == GUID["gpu-03"]
    assert result.values == 7 and result.problems == []

    basic = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
    assert all(path.startswith("/ufmRest/") and header == basic for _, path, _, header in ufm.requests)
    assert "/ufmRest/resources/ports" in caplog.text and PASSWORD not in caplog.text and basic[6:] not in caplog.text
    [links] = requests_to(ufm, "/resources/links")
    assert links[2] == {"page_number": ["1"], "rpp": ["1000"]}
    [snapshot] = requests_to(ufm, "/monitoring/snapshot")
    assert snapshot[0] == "POST"


def test_token_authentication_uses_ufmRestV3_and_the_token_header(ufm, caplog):
    caplog.set_level(logging.DEBUG)
    result = poll(device(ufm, token_auth=True))
    assert "/ufmRestV3/resources/ports" in caplog.text and TOKEN not in caplog.text
    assert len(of(result.records, PortSample)) == 14
    assert {path.split("/")[1] for _, path, _, _ in ufm.requests} == {"ufmRestV3"}
    assert {header for *_, header in ufm.requests} == {f"Basic {TOKEN}"}


@pytest.mark.parametrize("credentials", [{"username": USERNAME, "password": "not-the-password"},
                                         {"token": "a-revoked-token-0000000000"}])
def test_a_wrong_credential_is_an_auth_error_and_is_not_retried(ufm, credentials, caplog):
    dev = SwitchConfig(name="ufm-1", mgmt_address="127.0.0.1",
                       collectors={"ufm": {"url": ufm.url, "retries": 3, **credentials}})
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CollectorAuthError) as e:
        poll(dev)
    assert e.value.kind == "auth" and len(ufm.requests) == 1
    assert "HTTP 401" in str(e.value) and "/app/ufm_version" in str(e.value) and ufm.url in str(e.value)
    secret = credentials.get("password") or credentials["token"]
    assert secret not in str(e.value) and secret not in caplog.text


def test_a_server_that_hangs_times_out_within_the_deadline(ufm):
    ufm.fault("/resources/ports", "hang", "hang", "hang")
    started = time.monotonic()
    with pytest.raises(CollectorTimeout) as e:  # each request: 0.4 s, twice, 0.05 s apart
        poll(device(ufm, timeout=0.4, retries=1))
    assert e.value.kind == "timeout" and 0.8 <= time.monotonic() - started < 2.0
    assert "GET /ufmRest/resources/ports timed out after 0.4 s (2 attempts)" in str(e.value)

    ufm.faults.clear()
    ufm.fault("/resources/ports", "hang")
    started = time.monotonic()
    with pytest.raises(CollectorTimeout) as e:  # a request timeout longer than the poll's deadline
        poll(device(ufm, timeout=20, interval=10), deadline=1.0)
    assert time.monotonic() - started < 1.8 and "deadline of 1 s" in str(e.value)


def test_a_500_then_success_is_retried(ufm):
    ufm.fault("/resources/ports", "500")
    result = poll(device(ufm))
    assert len(of(result.records, PortSample)) == 14 and len(requests_to(ufm, "/resources/ports")) == 2

    ufm.requests.clear()
    ufm.fault("/resources/ports", "500", "500", "500")
    with pytest.raises(CollectorBadResponse) as e:
        poll(device(ufm, retries=2))
    assert e.value.kind == "bad_response" and len(requests_to(ufm, "/resources/ports")) == 3
    assert "GET /ufmRest/resources/ports: HTTP 500" in str(e.value)


def test_a_refused_connection_is_unreachable(ufm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    dev = SwitchConfig(name="ufm-1", mgmt_address="127.0.0.1", collectors={"ufm": {
        "url": f"http://127.0.0.1:{closed}", "username": USERNAME, "password": PASSWORD, "retries": 1,
        "backoff": 0.05}})
    with pytest.raises(CollectorUnreachable) as e:
        poll(dev)
    assert e.value.kind == "unreachable" and "(2 attempts)" in str(e.value) and PASSWORD not in str(e.value)


def test_https_checks_the_certificate_against_the_configured_ca(tmp_path):
    cert, key = _self_signed(tmp_path)
    server = UfmStandIn(tls=(cert, key)).start()
    try:
        with pytest.raises(CollectorUnreachable) as e:  # the system's CAs do not know it
            poll(device(server, retries=0))
        assert "CERTIFICATE_VERIFY_FAILED" in str(e.value) and server.url.startswith("https://")
        assert len(of(poll(device(server, ca_file=cert)).records, PortSample)) == 14
        assert len(of(poll(device(server, verify_tls=False)).records, PortSample)) == 14
        with pytest.raises(CollectorConfigError, match="ca_file .*missing.pem"):
            poll(device(server, ca_file=str(tmp_path / "missing.pem")))
    finally:
        server.stop()


def test_a_client_certificate_authenticates_without_a_password(tmp_path, caplog):
    """UFM's client authentication: the certificate in the TLS handshake is the credential, on /ufmRest
    with no Authorization header (NVIDIA bare-metal-manager's UFM client does the same)."""
    cert, key = _self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    (tmp_path / "stranger").mkdir()
    client_cert, client_key = _self_signed(tmp_path / "client")
    stranger_cert, stranger_key = _self_signed(tmp_path / "stranger")
    server = UfmStandIn(tls=(cert, key), client_ca=client_cert).start()
    caplog.set_level(logging.DEBUG)

    def dev(cert_file: str, key_file: str, **extra) -> SwitchConfig:
        return SwitchConfig(name="ufm-1", mgmt_address="127.0.0.1", collectors={"ufm": {
            "url": server.url, "cert_file": cert_file, "key_file": key_file, "ca_file": cert, "retries": 0,
            **extra}})

    try:
        result = poll(dev(client_cert, client_key))
        assert len(of(result.records, PortSample)) == 14
        assert {(path.split("/")[1], header) for _, path, _, header in server.requests} == {("ufmRest", None)}
        with pytest.raises(CollectorUnreachable):  # a certificate the server's client CA did not sign
            poll(dev(stranger_cert, stranger_key))
        with pytest.raises(CollectorConfigError, match="cert_file/key_file .*missing.key"):
            poll(dev(client_cert, str(tmp_path / "missing.key")))
        key_body = open(client_key).read().splitlines()[1]
        assert key_body not in caplog.text
    finally:
        server.stop()


def test_malformed_json_is_a_bad_response_naming_the_route(ufm):
    ufm.fault("/resources/systems", "not json")
    with pytest.raises(CollectorBadResponse) as e:
        poll(device(ufm))
    assert "GET /ufmRest/resources/systems: not JSON" in str(e.value) and "UFM is starting" in str(e.value)

    ufm.fault("/resources/ports", lambda: b'{"ports": []}')
    with pytest.raises(CollectorBadResponse) as e:
        poll(device(ufm))
    assert "GET /ufmRest/resources/ports: expected a JSON list, got an object" in str(e.value)


def test_items_missing_fields_are_left_out_and_the_good_ones_kept(ufm, caplog):
    ports = json.loads(json.dumps(ufm.data["ports"]))
    bad_state = next(p for p in ports if p["name"] == port_name("leaf-1", "1/3/1"))
    del bad_state["logical_state"]
    ports[0]["name"] = "no-port-number"
    links = json.loads(json.dumps(ufm.data["links"]))
    del links[1]["destination_guid"]
    ufm.fault("/resources/ports", lambda: json.dumps(ports).encode())
    ufm.fault("/resources/links", lambda: json.dumps({"data": links}).encode())
    collector = UfmCollector()
    result = poll(device(ufm), collector)
    samples = {(s.device, s.port) for s in of(result.records, PortSample)}
    assert len(samples) == 12 and ("leaf-1", "1/3/1") not in samples and ("leaf-1", "1/1/1") not in samples
    assert ("spine-2", "1/1/1") in samples
    problems = [str(p) for p in result.problems]
    assert all(p.kind == "bad_response" for p in result.problems)
    assert any("GET /ufmRest/resources/ports: 2 of 18 items left out" in p and "no 'logical_state'" in p
               and "'no-port-number' is not <GUID>_<port number>" in p for p in problems), problems
    assert any("GET /ufmRest/resources/links: 1 of 9 items left out" in p and "no 'destination_guid'" in p
               for p in problems), problems
    assert PASSWORD not in " ".join(problems) + caplog.text
    assert len(of(result.records, LldpNeighbor)) == 10  # one inter-switch link (two ends) less

    every = json.loads(json.dumps(ufm.data["systems"]))
    for system in every:
        del system["guid"]
    ufm.fault("/resources/systems", lambda: json.dumps(every).encode())
    with pytest.raises(CollectorBadResponse) as e:  # nothing usable: the poll fails
        poll(device(ufm))
    assert ("GET /ufmRest/resources/systems: none of its 8 items is usable: item 0 ('spine-1'): no 'guid'"
            in str(e.value))


def test_a_failing_secondary_route_is_noted_and_the_poll_goes_on(ufm):
    ufm.fault("/app/alarms", "500", "500", "500")
    ufm.fault("/monitoring/snapshot", lambda: b'{"1716899674": {"Device": {}}}')
    collector = UfmCollector()
    result = poll(device(ufm), collector)
    samples = of(result.records, PortSample)
    assert len(samples) == 14 and all(s.in_octets is None for s in samples)  # state without counters
    assert not [p for p in of(result.records, GenericPoint) if p.measurement == "ufm_alarm"]
    problems = [str(p) for p in result.problems]
    assert any("GET /ufmRest/app/alarms: HTTP 500" in p for p in problems), problems
    assert any("POST /ufmRest/monitoring/snapshot: no \"Port\" object under '1716899674'" in p for p in problems)


def test_links_are_read_page_by_page(ufm):
    paged = poll(device(ufm, page_size=3))
    pages = [r[2]["page_number"] for r in requests_to(ufm, "/resources/links")]
    assert pages == [["1"], ["2"], ["3"], ["4"]]  # 9 links: three full pages, then an empty one
    ufm.requests.clear()
    whole = poll(device(ufm, page_size=0))
    assert [r[2] for r in requests_to(ufm, "/resources/links")] == [{}]
    ends = lambda result: {n.model_copy(update={"ts": 0}) for n in of(result.records, LldpNeighbor)}  # noqa: E731
    assert ends(paged) == ends(whole) and len(ends(paged)) == 12


def test_the_systems_filter_reports_only_matching_switches(ufm):
    result = poll(device(ufm, systems=["leaf-*"]))
    assert {s.device for s in of(result.records, PortSample)} == {"leaf-1", "leaf-2"}
    spine_end = next(n for n in of(result.records, LldpNeighbor) if (n.device, n.port) == ("leaf-1", "1/1/1"))
    assert (spine_end.remote_name, spine_end.remote_port) == ("spine-1", "1/1/1")  # a switch, not a host HCA


def test_switches_sharing_a_name_are_named_by_their_guid(ufm):
    for item in ufm.data["systems"] + ufm.data["ports"]:
        if item["system_name"] in ("spine-1", "spine-2"):
            item["system_name"] = "Quantum Mellanox Technologies"  # UFM's name for switches nobody named
    result = poll(device(ufm))
    ports = {(s.device, s.port) for s in of(result.records, PortSample)}
    assert {(GUID["spine-1"], "1/3/1"), (GUID["spine-2"], "1/1/1"), ("leaf-1", "1/1/1")} <= ports and len(ports) == 14
    assert {f.device for f in of(result.records, DeviceFacts)} == {"ufm-1", "leaf-1", "leaf-2", GUID["spine-1"],
                                                                   GUID["spine-2"]}


def test_the_snapshot_is_asked_for_the_whole_site_and_read_under_statistics(ufm):
    collector = UfmCollector()
    result = poll(device(ufm), collector)
    [body] = ufm.snapshot_requests
    assert (body["scope_object"], body["monitor_object"], body["objects"], body["functions"]) == (
        "Site", "Port", ["Grid.default"], ["RAW"])  # the form IBM/CAST's collector sends
    assert {"Infiniband_MBIn", "Infiniband_MBOut", "Infiniband_RcvErrors"} <= set(body["attributes"])
    samples = {(s.device, s.port): s for s in of(result.records, PortSample)}
    raw = ufm.data["counters"][port_name("spine-2", "1/2/1")]
    assert samples[("spine-2", "1/2/1")].in_octets == 4 * raw["Infiniband_MBIn"]  # a multi-ASIC switch's port
    assert len(samples) == 14 and result.problems == []  # the hosts' ports in the answer are skipped

    # values at the port's top level (not the public shape): no counters, and the poll says why
    flat = {"2024-05-28 08:03:05": {"Port": {name: dict(c) for name, c in ufm.data["counters"].items()}}}
    ufm.fault("/monitoring/snapshot", lambda: json.dumps(flat).encode())
    result = poll(device(ufm), collector)
    assert all(s.in_octets is None for s in of(result.records, PortSample))
    [problem] = [str(p) for p in result.problems]
    assert "POST /ufmRest/monitoring/snapshot: 14 of 14 items left out" in problem
    assert 'no "statistics" object' in problem


def test_a_ufm_6_1_systems_item_without_model_is_described_by_its_description(ufm):
    """The keys and values of a real UFM 6.1 switch in /resources/systems (IBM/CAST
    csmtest/include/json/ufm/output_6_1.json, first item; its GUID replaced by spine-1's)."""
    item = {"ip": "10.7.7.2", "fw_version": "15.1630.210", "is_manual_ip": True, "psid": "MT_2630110032",
            "total_alarms": 0, "temperature": "58", "capabilities": ["ssh", "sysinfo", "reboot"], "state": "active",
            "role": "core", "type": "switch", "vendor": "Mellanox", "description": "MSB7800", "has_ufm_agent": False,
            "system_guid": GUID["spine-1"], "groups": [], "guid": GUID["spine-1"], "sm_mode": "noSM",
            "system_name": "spine-1", "sw_version": "3.6.6107-X86_64", "server_operation_mode": "Switch",
            "name": GUID["spine-1"], "modules": []}
    ufm.data["systems"] = [item if s["system_name"] == "spine-1" else s for s in ufm.data["systems"]]
    facts = {f.device: f for f in of(poll(device(ufm)).records, DeviceFacts)}
    assert facts["spine-1"].sys_descr == "Mellanox MSB7800, firmware 15.1630.210"
    assert (facts["spine-1"].lldp_chassis_id, facts["spine-1"].interfaces) == (GUID["spine-1"], 3)


def test_ports_join_their_switch_by_systemID_else_by_the_guid_of_their_name(ufm):
    result = poll(device(ufm))
    spine2 = {s.port for s in of(result.records, PortSample) if s.device == "spine-2"}
    assert spine2 == {"1/1/1", "1/2/1"}  # two ASICs, one switch (systemID)
    assert node_guid("spine-2", "1/1/1") != node_guid("spine-2", "1/2/1") != GUID["spine-2"]
    assert next(f for f in of(result.records, DeviceFacts) if f.device == "spine-2").interfaces == 2
    up = next(n for n in of(result.records, LldpNeighbor) if (n.device, n.port) == ("leaf-1", "1/2/1"))
    assert (up.remote_name, up.remote_port, up.remote_chassis_id) == ("spine-2", "1/1/1", GUID["spine-2"])
    host = next(n for n in of(result.records, LldpNeighbor) if (n.device, n.port) == ("leaf-1", "1/3/1"))
    assert host.remote_chassis_id == GUID["gpu-01"] != node_guid("gpu-01", "1")  # the host, not its HCA port

    for port in ufm.data["ports"]:
        del port["systemID"]  # without it, the GUID of the port's name decides
    result = poll(device(ufm))
    devices = {s.device for s in of(result.records, PortSample)}
    assert devices == {"spine-1", "leaf-1", "leaf-2"}  # spine-2's ASIC GUIDs are no switch's


# --- events and alarms: switch evidence -------------------------------------------------------------


def test_link_events_name_a_link_and_count_for_both_ends(ufm):
    """329 'Link went down' names a link '<guid>_<port> : <guid>_<port>': both switch ends get the
    evidence, even when the link is gone from /resources/links; 328 'Link is up' is no down."""
    gone = (port_name("leaf-2", "1/1/1"), port_name("spine-1", "1/2/1"))
    ufm.data["links"] = [x for x in ufm.data["links"] if x["name"] != f"{gone[1]}:{gone[0]}"]
    older = link_event(12, "down", 20, ("spine-1", "1/2/1"), ("leaf-2", "1/1/1"))
    del older["event_type"]
    older["type"] = "329"  # older UFMs carry the event id in "type"
    ufm.data["events"] = [link_event(10, "down", 40, ("leaf-2", "1/1/1"), ("spine-1", "1/2/1")),
                          link_event(11, "up", 35, ("leaf-2", "1/1/1"), ("spine-1", "1/2/1")), older,
                          link_event(13, "up", 10, ("leaf-1", "1/1/1"), ("spine-1", "1/1/1"))]
    result = poll(device(ufm, alarms=False))
    events = {(e.device, e.port): e for e in of(result.records, LinkEvent)}
    assert set(events) == {("leaf-2", "1/1/1"), ("spine-1", "1/2/1")}  # the lone "Link is up" is no evidence
    for e in events.values():
        assert (e.state, e.previous, e.transitions, e.flaps_in_window) == ("up", "down", 4, 2)
    point = next(p for p in of(result.records, GenericPoint) if p.fields.get("id") == 10)
    assert point.tags == {"ufm": "ufm-1", "device": "leaf-2", "port": "1/1/1", "peer": "spine-1:1/2/1",
                          "event": "Link went down", "severity": "Warning", "category": "Fabric Topology"}
    assert point.fields["event_type"] == "329"




def test_events_and_alarms_become_link_events_and_points(ufm):
    collector = UfmCollector(flap_count=8, flap_window_s=3600)

    async def run():
        dev = device(ufm)
        try:
            first = await collector.collect(dev)
            second = await collector.collect(dev)
        finally:
            await collector.close()
        return first, second

    first, second = asyncio.run(run())
    events = {(e.device, e.port): e for e in of(first.records, LinkEvent)}
    # "Link went down" on leaf-1 1/2/1 and "Link Downed ... calculated delta is 9" at its other end
    # (spine-2 1/1/1): nine downs of one cable that is up again, more than flap_count
    for end in (("leaf-1", "1/2/1"), ("spine-2", "1/1/1")):
        e = events.pop(end)
        assert (e.state, e.previous, e.transitions, e.flaps_in_window, e.flapping) == ("up", "down", 18, 9, True)
    # gpu-04's HCA went down and back: evidence on the switch port at the other end
    e = events.pop(("leaf-2", "1/4/1"))
    assert (e.state, e.transitions, e.flaps_in_window, e.flapping) == ("up", 2, 1, False)
    assert events == {}  # the 2-hour-old down is outside the flap window; a symbol error is no link state
    points = of(first.records, GenericPoint)
    assert sorted(p.fields["id"] for p in points if p.measurement == "ufm_event") == [100, 101, 102, 103, 104, 105, 106]
    symbol = next(p for p in points if p.measurement == "ufm_event" and p.fields["id"] == 105)
    assert symbol.tags == {"ufm": "ufm-1", "device": "leaf-2", "port": "1/3/1", "event": "Symbol Error",
                           "severity": "Warning", "category": "Communication Error"}
    [alarm] = [p for p in points if p.measurement == "ufm_alarm"]
    assert alarm.tags == {"ufm": "ufm-1", "device": "spine-2", "port": "1/1/1", "alarm": "Link HW Error",
                          "severity": "Warning"}
    assert alarm.fields["event_count"] == 9 and alarm.fields["counter"] == "Infiniband_LinkDowned"
    # the next poll reads only newer events: none, so no evidence twice; the alarm is still active
    assert not of(second.records, LinkEvent)
    assert [p.measurement for p in of(second.records, GenericPoint)] == ["ufm_alarm"]


def test_ufm_evidence_reaches_the_correlator_as_a_flapping_link(ufm, tmp_path):
    config = _config(tmp_path, ufm, links=[{"a": "leaf-1:1/2/1", "b": "spine-2:1/1/1"},
                                           {"a": "leaf-1:1/1/1", "b": "spine-1:1/1/1"}])
    result = poll(config.fabric.switches[0], UfmCollector.from_config(config))
    correlator = Correlator(config.fabric, config.thresholds, config.correlator)
    correlator.add(result.records)
    findings = correlator.step(time.time_ns())
    assert correlator.ctx.link_events[("spine-2", "1/1/1")][-1].flaps_in_window == 9
    assert correlator.ctx.port_samples[("leaf-1", "1/1/1")].oper_status == "up"
    flapping = [f for f in findings if f.kind == "link_flapping"]
    assert [f.element for f in flapping] == [FLAPPING] and flapping[0].evidence["switch_flaps"] == 9
    assert not [f for f in findings if "spine-1" in f.element]


def test_a_down_the_samples_show_is_not_reported_twice(ufm, tmp_path):
    config = _config(tmp_path, ufm)
    poller = Poller(config, _Store(), registry=None, collectors={"ufm": UfmCollector.from_config(config)})
    batches = []
    poller.on_records = batches.append
    name = port_name("leaf-2", "1/2/1")

    async def run():
        try:
            await poller.poll_all()
            port = next(p for p in ufm.data["ports"] if p["name"] == name)
            port.update(logical_state="Down", physical_state="Polling", active_speed=None, active_width=None)
            ufm.data["events"].append(link_event(200, "down", 0, ("leaf-2", "1/2/1"), ("spine-2", "1/2/1")))
            await poller.poll_all()
        finally:
            await poller.close()

    asyncio.run(run())
    second = [r for r in batches[1] if isinstance(r, LinkEvent)]
    downs = [e for e in second if (e.device, e.port) == ("leaf-2", "1/2/1")]
    assert [(e.state, e.previous, e.transitions) for e in downs] == [("down", "up", 1)]  # from the samples only


# --- the service's poller: records filed by device, topology, rates ------------------------------------


def test_the_poller_files_each_switch_under_its_name_and_builds_the_topology(ufm, tmp_path):
    config = _config(tmp_path, ufm)
    poller = Poller(config, _Store(), registry=None, collectors={"ufm": UfmCollector.from_config(config)})

    async def run():
        try:
            return await poller.poll_all()
        finally:
            await poller.close()

    [status] = asyncio.run(run())
    assert (status.device, status.state, status.last_error) == ("ufm-1", "ok", None)
    assert sorted(poller.recent.facts) == ["leaf-1", "leaf-2", "spine-1", "spine-2", "ufm-1"]
    assert poller.recent.facts["ufm-1"].sys_descr == "NVIDIA UFM Enterprise 6.18.0-5"
    assert {(n.port, n.remote_name) for n in poller.recent.neighbors["leaf-1"]} == {
        ("1/1/1", "spine-1"), ("1/2/1", "spine-2"), ("1/3/1", "gpu-01"), ("1/4/1", "gpu-02")}
    assert poller.recent.neighbors["ufm-1"] == []
    topology = poller.topology()
    links = {(link.a, link.b): link for link in topology.links}
    assert links[("leaf-1:1/1/1", "spine-1:1/1/1")].check == "discovered"
    assert links[("leaf-1:1/1/1", "spine-1:1/1/1")].state == "up"  # the switches count as polled
    assert sorted(link.seen_by for link in links.values() if link.a == "leaf-1:1/1/1")[0] == ["leaf-1", "spine-1"]
    assert links[("gpu-01:mlx5_0", "leaf-1:1/3/1")].seen_by == ["leaf-1"]
    nodes = {n.name: n for n in topology.nodes}
    assert nodes["spine-2"].kind == "switch" and nodes["spine-2"].reachable is True


def test_rates_from_two_polls_use_64_bit_counters_and_drop_a_reset(ufm, tmp_path):
    config = _config(tmp_path, ufm)
    poller = Poller(config, _Store(), registry=None, collectors={"ufm": UfmCollector.from_config(config)})
    name = port_name("spine-2", "1/1/1")
    samples = []
    poller.on_records = lambda records: samples.extend(
        r for r in records if isinstance(r, (PortSample, PortRates)) and (r.device, r.port) == ("spine-2", "1/1/1"))

    async def run():
        try:
            await poller.poll_all()
            await asyncio.sleep(0.2)
            ufm.advance(name, "Infiniband_MBIn", 3_000_000_000)  # 12e9 octets: the octet counter passes 2^35
            ufm.advance(name, "Infiniband_RcvErrors", 5)
            await poller.poll_all()
            await asyncio.sleep(0.2)
            ufm.advance(name, "Infiniband_MBOut", -1)  # counters went back: reset, not a wrap
            await poller.poll_all()
        finally:
            await poller.close()

    asyncio.run(run())
    first, second, rates, third = samples  # the third interval gives no rates
    assert isinstance(rates, PortRates) and isinstance(third, PortSample)
    elapsed = second.ts - first.ts
    assert second.in_octets - first.in_octets == 12_000_000_000
    assert rates.in_bps == 12_000_000_000 * 8 * NS / elapsed and rates.out_bps == 0
    assert rates.in_errors_ps == 5 * NS / elapsed and rates.in_utilization == rates.in_bps / 400e9


def test_a_repeated_snapshot_keeps_its_first_time(ufm):
    collector = UfmCollector()

    async def run():
        dev = device(ufm, events=False, alarms=False, links=False)
        try:
            first = await collector.collect(dev)
            second = await collector.collect(dev)
            ufm.freeze_snapshot = True  # UFM answers with the snapshot it answered last time
            third = await collector.collect(dev)
        finally:
            await collector.close()
        return first, second, third

    first, second, third = (of(r.records, PortSample)[0] for r in asyncio.run(run()))
    assert second.ts > first.ts and third.ts == second.ts  # no rate over an interval UFM did not sample


# --- UFM Telemetry: the counters at scale -----------------------------------------------------------------


def test_ufm_telemetry_gives_exact_64_bit_counters(ufm):
    collector = UfmCollector()
    result = poll(device(ufm, telemetry_url=f"{ufm.url}/enterprise"), collector)
    assert not ufm.snapshot_requests and result.problems == []
    [scrape] = requests_to(ufm, "/enterprise")
    assert scrape[3] is None  # no UFM credential goes to the telemetry endpoint
    samples = {(s.device, s.port): s for s in of(result.records, PortSample)}
    t = ufm.data["telemetry"][port_name("spine-2", "1/2/1")]
    s = samples[("spine-2", "1/2/1")]
    assert s.out_octets == t["PortXmitDataExtended"] > 2**60 and float(s.out_octets) != s.out_octets - 3  # exact
    assert (s.in_octets, s.out_pkts, s.in_pkts) == (t["PortRcvDataExtended"], t["PortXmitPktsExtended"],
                                                    t["PortRcvPktsExtended"])
    assert (s.in_errors, s.out_discards, s.oper_status) == (t["PortRcvErrors"], t["PortXmitDiscards"], "up")
    assert len(samples) == 14 and all(x.in_octets is not None for x in samples.values())
    errors = {(p.tags["device"], p.tags["port"]): p for p in of(result.records, GenericPoint)
              if p.measurement == "ufm_port_errors"}
    assert len(errors) == 14 and errors[("spine-2", "1/2/1")].fields == {
        "link_downed": t["LinkDownedCounterExtended"], "symbol_errors": t["Symbol_Errors"]}

    ufm.advance(port_name("spine-2", "1/2/1"), "PortRcvDataExtended", 12_000_000_001, source="telemetry")
    again = poll(device(ufm, telemetry_url=f"{ufm.url}/enterprise"))
    later = next(x for x in of(again.records, PortSample) if (x.device, x.port) == ("spine-2", "1/2/1"))
    assert later.in_octets - s.in_octets == 12_000_000_001  # past 2^59 a float is 128 octets coarse

    words = poll(device(ufm, telemetry_url=f"{ufm.url}/enterprise", telemetry_data_unit="words"))
    s = next(x for x in of(words.records, PortSample) if (x.device, x.port) == ("spine-2", "1/2/1"))
    assert s.out_octets == (4 * t["PortXmitDataExtended"]) % 2**64 and s.out_pkts == t["PortXmitPktsExtended"]


def test_a_growing_link_downed_counter_is_flap_evidence_for_both_ends(ufm):
    collector = UfmCollector(flap_count=2, flap_window_s=3600)
    dev = device(ufm, telemetry_url=f"{ufm.url}/enterprise", events=False, alarms=False)

    async def run():
        try:
            first = await collector.collect(dev)
            ufm.advance(port_name("leaf-2", "1/1/1"), "LinkDownedCounterExtended", 3, source="telemetry")
            return first, await collector.collect(dev)
        finally:
            await collector.close()

    first, second = asyncio.run(run())
    assert not of(first.records, LinkEvent)  # a first reading is no increase
    events = {(e.device, e.port): e for e in of(second.records, LinkEvent)}
    assert set(events) == {("leaf-2", "1/1/1"), ("spine-1", "1/2/1")}
    assert {(e.state, e.transitions, e.flaps_in_window, e.flapping) for e in events.values()} == {("up", 6, 3, True)}


def test_bad_telemetry_is_noted_and_the_rest_kept(ufm):
    collector = UfmCollector()
    dev = device(ufm, telemetry_url=f"{ufm.url}/enterprise")
    rounded = port_name("leaf-1", "1/1/1")
    guid, _, num = rounded.rpartition("_")
    text = ufm.telemetry_text().decode().replace(
        f'PortXmitDataExtended{{port_guid="0x{guid}",port_num="{num}",device_id="54002"}} '
        f'{ufm.data["telemetry"][rounded]["PortXmitDataExtended"]}',
        f'PortXmitDataExtended{{port_guid="0x{guid}",port_num="{num}",device_id="54002"}} 1.152921504606847e+18')
    ufm.fault("/enterprise", lambda: text.encode())
    result = poll(dev, collector)
    s = next(x for x in of(result.records, PortSample) if (x.device, x.port) == ("leaf-1", "1/1/1"))
    assert s.out_octets is None and s.in_octets == ufm.data["telemetry"][rounded]["PortRcvDataExtended"]
    [problem] = [str(p) for p in result.problems]
    assert f"GET {ufm.url}/enterprise: 1 of 14 items left out" in problem and "no exact unsigned 64-bit" in problem

    ufm.fault("/enterprise", lambda: b"<html><body>UFM Telemetry is starting</body></html>")
    result = poll(dev, collector)
    samples = of(result.records, PortSample)
    assert len(samples) == 14 and all(x.in_octets is None for x in samples)
    [problem] = [str(p) for p in result.problems]
    assert f"GET {ufm.url}/enterprise: not Prometheus text" in problem


# --- configuration -------------------------------------------------------------------------------------


def test_settings_need_one_kind_of_credential_and_hide_secrets():
    with pytest.raises(ValueError, match="one credential, not token and username/password"):
        UfmSettings(token=TOKEN, username=USERNAME, password=PASSWORD)
    with pytest.raises(ValueError, match="needs a token, a username and a password, or cert_file and key_file"):
        UfmSettings(username=USERNAME)
    with pytest.raises(ValueError, match="needs both cert_file and key_file"):
        UfmSettings(cert_file="/etc/nms/ufm-client.pem")
    with pytest.raises(ValueError, match="one credential, not token and cert_file/key_file"):
        UfmSettings(token=TOKEN, cert_file="/etc/nms/c.pem", key_file="/etc/nms/c.key")
    with pytest.raises(ValueError, match="not in the URL"):
        UfmSettings(token=TOKEN, telemetry_url=f"http://{USERNAME}:{PASSWORD}@ufm.example.com:9001/enterprise")
    assert UfmSettings(cert_file="/etc/nms/c.pem", key_file="/etc/nms/c.key").telemetry_data_unit == "octets"
    with pytest.raises(ValueError, match="not in the URL"):
        UfmSettings(url=f"https://{USERNAME}:{PASSWORD}@ufm.example.com", token=TOKEN)
    with pytest.raises(ValueError, match="unknown time zone"):
        UfmSettings(token=TOKEN, timezone="Mars/Olympus")
    settings = UfmSettings(url="https://ufm.example.com/", username=USERNAME, password=PASSWORD)
    assert settings.url == "https://ufm.example.com" and PASSWORD not in repr(settings)
    doc = {"fabric": {"switches": [{"name": "ufm-1", "mgmt_address": "192.0.2.10",
                                    "collectors": {"ufm": {"token": "${UFM_TOKEN:-x}", "interval": "1m"}}}]}}
    parsed = parse_config(yaml.safe_dump(doc)).fabric.switches[0].collectors.ufm
    assert parsed.interval == 60 and parsed.token.get_secret_value() == "x"


def test_nms_collect_ufm_once_prints_the_switches_and_what_was_left_out(ufm, tmp_path):
    """The CLI polls UFM once: every switch port in the table, the links as neighbours, a route's bad
    answer under it (the poll still ok), the password nowhere; --json has it in the device's status."""
    import os
    import subprocess
    import sys

    config = tmp_path / "nms.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "fabric": {"switches": [
        {"name": "ufm-1", "mgmt_address": "127.0.0.1", "collectors": {"ufm": {
            "url": ufm.url, "username": USERNAME, "password": PASSWORD, "backoff": 0.05}}}]}}))
    env = {**os.environ, "COLUMNS": "80"}

    def nms(*args):
        return subprocess.run([sys.executable, "-m", "nms", "collect", "ufm", "--once", "--config", str(config), *args],
                              capture_output=True, text=True, timeout=60, env=env)

    ufm.fault("/app/alarms", "500", "500", "500")
    proc = nms()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= 80, out
    for switch, label, *_ in [("leaf-1", "1/1/1"), ("spine-2", "1/2/1"), ("leaf-2", "1/4/1")]:
        assert any(switch in line and label in line for line in out.splitlines()), out
    notes = " ".join(out.split("left out of the last poll (the rest was kept):")[1].split())
    assert "ufm-1 (ufm): GET /ufmRest/app/alarms: HTTP 500" in notes and "alarms left out" in notes, out
    assert PASSWORD not in out + proc.stderr
    assert "1/1 devices ok" in proc.stderr

    ufm.fault("/app/alarms", "500", "500", "500")
    js = json.loads(nms("--json").stdout)
    [status] = js["devices"]
    assert status["state"] == "ok" and status["last_problem_count"] == status["problems"] == 1
    assert status["last_problems"][0]["what"] == "GET /ufmRest/app/alarms"
    assert status["last_problems"][0]["reason"].startswith("HTTP 500")
    assert {f["device"] for f in js["facts"]} == {"ufm-1", "spine-1", "spine-2", "leaf-1", "leaf-2"}
    assert ("leaf-1", "1/1/1", "spine-1", "1/1/1") in {(n["device"], n["port"], n["remote_name"], n["remote_port"])
                                                       for n in js["lldp"]}


# --- helpers -------------------------------------------------------------------------------------------


def _config(tmp_path, ufm: UfmStandIn, links: list | None = None):
    doc = {"data_dir": str(tmp_path / "data"), "fabric": {
        "switches": [{"name": "ufm-1", "mgmt_address": "127.0.0.1", "collectors": {"ufm": {
            "url": ufm.url, "username": USERNAME, "password": PASSWORD, "backoff": 0.05}}}],
        "links": links or []}}
    if links:  # the inventory's switches
        doc["fabric"]["switches"] += [{"name": n, "mgmt_address": f"10.10.0.{i}", "role": r}
                                      for i, (n, r) in enumerate([("spine-1", "spine"), ("spine-2", "spine"),
                                                                  ("leaf-1", "leaf"), ("leaf-2", "leaf")], 11)]
    return parse_config(yaml.safe_dump(doc))


def _self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ufm stand-in")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "ufm.pem", tmp_path / "ufm.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


class _Store:
    def write(self, points):
        from nms.store import WriteResult

        return WriteResult(accepted=len(points))
