"""A stand-in NVIDIA UFM Enterprise server for the UFM collector's tests: a real HTTP server on
127.0.0.1 serving a small InfiniBand fat tree (2 spines, 2 leaves, 4 GPU hosts, NDR).

No real UFM ran these tests. Routes, JSON shapes, field names and authentication follow the NVIDIA
UFM Enterprise REST API Guide and public code that talks to real UFMs (IBM/CAST's UFM collector,
NVIDIA's Mellanox/ufm_sdk_3.0 plugins, NVIDIA/bare-metal-manager-core's UFM client); each shape's
source is cited in tests/test_ufm_collector.py and next to the code that serves it. The stand-in
answers the Monitoring snapshot only in the public Site / Grid.default form, with the values under
"statistics"; names link events as links; carries multi-ASIC ports (systemID); accepts a client
certificate its client CA signed (`client_ca`); and serves UFM Telemetry's Prometheus text at
/enterprise (UFM serves it on port 9001; here on the same port, without credentials).

Knobs for failure tests: `faults[route]` is a list of actions taken, one per request, before the
route answers normally again ("500", "hang", "not json", or a callable returning the body to send);
`requests` records (method, path, query, Authorization header) of every request.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

USERNAME, PASSWORD = "admin", "ufm-stand-in-password"
TOKEN = "Zb3qGk1xW9sTqfPk7LmN0aYc4RvE2d"  # UFM access tokens are opaque strings

# (name, system GUID, management IP, role)
SWITCHES = [("spine-1", "fc6a1c0300a0b000", "10.10.0.11", "core"),
            ("spine-2", "fc6a1c0300a0c000", "10.10.0.12", "core"),
            ("leaf-1", "fc6a1c0300a0d000", "10.10.0.21", "tor"), ("leaf-2", "fc6a1c0300a0e000", "10.10.0.22", "tor")]
HOSTS = [("gpu-01", "b8599f0300f01000"), ("gpu-02", "b8599f0300f02000"), ("gpu-03", "b8599f0300f03000"),
         ("gpu-04", "b8599f0300f04000")]
GUID = {name: guid for name, guid, *_ in SWITCHES} | dict(HOSTS)
SWITCH_NAMES = {name for name, *_ in SWITCHES}
# spine-2 is a multi-ASIC switch: its ports carry their ASIC's node GUID (by the label's second part),
# the chassis GUID only in systemID. A host's HCA port GUID is not its host's system GUID either
# (NVIDIA/bare-metal-manager-core crates/api/src/ib/rest.rs: port guid 1070fd0300176625, systemID
# 1070fd0300176624).
ASICS = {"spine-2": {1: "fc6a1c0300a0c010", 2: "fc6a1c0300a0c020", 3: "fc6a1c0300a0c030"}}
# cables: (switch, label, far system, far label); NDR labels 1/N/1 are port number 2N - 1
CABLES = [("leaf-1", "1/1/1", "spine-1", "1/1/1"), ("leaf-1", "1/2/1", "spine-2", "1/1/1"),
          ("leaf-2", "1/1/1", "spine-1", "1/2/1"), ("leaf-2", "1/2/1", "spine-2", "1/2/1"),
          ("leaf-1", "1/3/1", "gpu-01", "1"), ("leaf-1", "1/4/1", "gpu-02", "1"),
          ("leaf-2", "1/3/1", "gpu-03", "1"), ("leaf-2", "1/4/1", "gpu-04", "1")]
# unconnected switch ports: (switch, label, physical state)
SPARE = [("spine-1", "1/3/1", "Polling"), ("leaf-2", "1/5/1", "Disabled")]
AN_GUID = "fc6a1c0300a0d0a0"  # leaf-1's SHARP aggregation node
ATTRIBUTES = ["Infiniband_MBIn", "Infiniband_MBOut", "Infiniband_PckIn", "Infiniband_PckOut", "Infiniband_RcvErrors",
              "Infiniband_XmtDiscards"]


def number(label: str) -> int:
    return 2 * int(label.split("/")[1]) - 1 if "/" in label else int(label)


def node_guid(system: str, label: str) -> str:
    if system in ASICS:
        return ASICS[system][int(label.split("/")[1]) if "/" in label else 1]
    return GUID[system][:-1] + "1" if system not in SWITCH_NAMES else GUID[system]


def port_name(system: str, label: str) -> str:
    return f"{node_guid(system, label)}_{number(label)}"


def ufm_time(seconds_ago: float) -> str:
    """UFM's event / alarm time format (server clock, here UTC), e.g. '2024-05-28 08:23:10'."""
    return datetime.fromtimestamp(time.time() - seconds_ago, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _switch_port(system: str, label: str, peer: tuple[str, str] | None, physical: str = "LinkUp") -> dict:
    up = peer is not None
    peer_system, peer_label = peer or ("N/A", "N/A")
    return {
        "description": "Switch IB Port", "number": number(label), "external_number": number(label),
        "physical_state": physical, "path": f"default(5) / Switch: {system} / {label}",
        "tier": 2 if "spine" in system else 1,
        "high_ber_severity": "N/A", "lid": 10 + number(label), "mirror": "disable",
        "logical_state": "Active" if up else "Down",
        "capabilities": ["reset", "healthy_operations", "disable", "get_cables_info"], "mtu": 4096,
        "peer_port_dname": peer_label, "severity": "Info",
        "active_speed": "NDR" if up else None, "enabled_speed": ["NDR", "HDR", "EDR"] if up else [],
        "supported_speed": ["NDR", "HDR", "EDR"], "active_width": "4x" if up else None,
        "enabled_width": ["4x", "2x", "1x"] if up else [], "supported_width": ["4x", "2x", "1x"],
        "dname": label, "name": port_name(system, label), "guid": node_guid(system, label), "system_name": system,
        "systemID": GUID[system], "node_description": system, "module": "N/A",
        "peer": port_name(peer_system, peer_label) if up else "N/A", "peer_node_name": peer_system,
        "peer_guid": node_guid(peer_system, peer_label) if up else "N/A",
    }


def _host_port(host: str, switch: str, label: str) -> dict:
    return {
        "description": "Computer IB Port", "number": 1, "external_number": 1, "physical_state": "LinkUp",
        "path": f"default(5) / Computer: {host} / mlx5_0 / 1", "tier": 0, "high_ber_severity": "N/A", "lid": 100,
        "mirror": "disable", "logical_state": "Active", "capabilities": ["healthy_operations"], "mtu": 4096,
        "peer_port_dname": label, "severity": "Info", "active_speed": "NDR", "enabled_speed": ["NDR"],
        "supported_speed": ["NDR"], "active_width": "4x", "enabled_width": ["4x"], "supported_width": ["4x"],
        "dname": "1", "name": port_name(host, "1"), "guid": node_guid(host, "1"), "system_name": host,
        "systemID": GUID[host], "node_description": f"{host} mlx5_0", "module": "N/A",
        "peer": port_name(switch, label), "peer_node_name": switch, "peer_guid": node_guid(switch, label),
    }


def fat_tree() -> dict[str, Any]:
    """systems, ports, links, counters (per port name), alarms and events of the fixture fabric."""
    systems = [{"system_name": name, "guid": guid, "system_guid": guid, "ip": ip, "type": "switch", "model": "MQM9700",
                "vendor": "NVIDIA", "description": "MQM9700", "fw_version": "31.2012.1068", "state": "active",
                "severity": "Info", "role": role, "technology": "NDR", "is_manual_ip": False, "script": "N/A",
                "url": "", "in_rack": False, "modules": [], "capabilities": ["reboot", "fw_upgrade"],
                "ports": []} for name, guid, ip, role in SWITCHES]
    systems += [{"system_name": host, "guid": guid, "system_guid": guid, "ip": "0.0.0.0", "type": "host",
                 "model": "ConnectX-7", "vendor": "NVIDIA", "description": "Computer", "fw_version": "28.39.1002",
                 "state": "active", "severity": "Info", "role": "endpoint", "technology": "NDR",
                 "is_manual_ip": False, "script": "N/A", "url": "", "in_rack": False, "modules": [],
                 "capabilities": [], "ports": []} for host, guid in HOSTS]
    ports: list[dict] = []
    links: list[dict] = []
    for a, la, b, lb in CABLES:
        ports.append(_switch_port(a, la, (b, lb)))
        ports.append(_switch_port(b, lb, (a, la)) if b in SWITCH_NAMES else _host_port(b, a, la))
        src, dst = (b, lb), (a, la)  # UFM lists a link from either end; these run from the far end
        links.append({"source_guid": node_guid(*src), "source_port": str(number(src[1])),
                      "destination_guid": node_guid(*dst),
                      "destination_port": str(number(dst[1])), "source_port_dname": src[1],
                      "destination_port_dname": dst[1],
                      "source_port_node_description": src[0] if "gpu" not in src[0] else f"{src[0]} mlx5_0",
                      "destination_port_node_description": dst[0], "width": "IB_4x", "severity": "Info",
                      "name": f"{port_name(*src)}:{port_name(*dst)}", "capabilities": []})
    for system, label, physical in SPARE:
        ports.append(_switch_port(system, label, None, physical))
    links.append({"source_guid": GUID["leaf-1"], "source_port": "65", "destination_guid": AN_GUID,
                  "destination_port": "1",
                  "source_port_dname": "65", "destination_port_dname": "1", "source_port_node_description": "leaf-1",
                  "destination_port_node_description": "Mellanox Technologies Aggregation Node", "width": "IB_4x",
                  "severity": "Info", "name": f"{GUID['leaf-1']}_65:{AN_GUID}_1", "capabilities": []})
    by_system: dict[str, list[str]] = {}
    for p in ports:
        by_system.setdefault(p["system_name"], []).append(p["name"])
    for s in systems:
        s["ports"] = by_system.get(s["system_name"], [])
    counters, telemetry = {}, {}
    for k, p in enumerate(ports):  # every port, the hosts' too: a Site snapshot covers the whole fabric
        up = p["logical_state"] == "Active"
        counters[p["name"]] = {"Infiniband_MBIn": 5_000_000_000 + 1_000_003 * k if up else 0,
                               "Infiniband_MBOut": 7_000_000_000 + 2_000_029 * k if up else 0,
                               "Infiniband_PckIn": 90_000_000 + 1_001 * k if up else 0,
                               "Infiniband_PckOut": 80_000_000 + 2_003 * k if up else 0,
                               "Infiniband_RcvErrors": k % 3, "Infiniband_XmtDiscards": 7 * k}
        # UFM Telemetry: octets, not 4-octet units (NVIDIA's dashboard plots rate(PortXmitDataExtended) * 8
        # as bit/s); counters past 2^53 that a float would round
        telemetry[p["name"]] = {"PortXmitDataExtended": (1 << 60) + 8_000_000_000_003 * k if up else 0,
                                "PortRcvDataExtended": (1 << 59) + 3_000_000_000_007 * k if up else 0,
                                "PortXmitPktsExtended": 80_000_000 + 2_003 * k if up else 0,
                                "PortRcvPktsExtended": 90_000_000 + 1_001 * k if up else 0,
                                "PortRcvErrors": k % 3, "PortXmitDiscards": 7 * k,
                                "LinkDownedCounterExtended": k % 2, "Symbol_Errors": 11 * k}
    alarms = [{"id": 7, "type": "IBPort", "name": "Link HW Error", "description": "Link Downed", "event_type": 112,
               "duration": "0 s", "severity": "Warning", "timestamp": ufm_time(60), "counter": "Infiniband_LinkDowned",
               "event_count": 9, "object_name": port_name("spine-2", "1/1/1"), "object_path": "Switch: spine-2 / 1/1/1",
               "reason": "Link-Downed counter delta threshold exceeded. Threshold is 0, calculated delta is 9. "
                         "Peer info: default / Switch: leaf-1 / 1/2/1."}]
    events = [
        link_event(100, "down", 7200, ("leaf-2", "1/2/1"), ("spine-2", "1/2/1")),
        _event(101, "MCast Group Deleted", "Site", 900, "default", "default(5)", "Info", "Fabric Notification",
               "Mcast group is deleted: ff12601bffff0000, 1fffc6ec2", event_type="67"),
        link_event(102, "down", 300, ("leaf-1", "1/2/1"), ("spine-2", "1/1/1")),
        link_event(103, "up", 290, ("leaf-1", "1/2/1"), ("spine-2", "1/1/1")),
        _event(104, "Link HW Error", "IBPort", 60, port_name("spine-2", "1/1/1"), "Switch: spine-2 / 1/1/1",
               "Warning", "Hardware", "Link Downed", counter="Infiniband_LinkDowned", event_type="112",
               reason=alarms[0]["reason"]),
        _event(105, "Symbol Error", "IBPort", 45, port_name("leaf-2", "1/3/1"), "Switch: leaf-2 / 1/3/1",
               "Warning", "Communication Error", "Symbol error counter delta threshold exceeded",
               counter="Infiniband_SymbolErrors", event_type="110"),
        link_event(106, "down", 30, ("gpu-04", "1"), ("leaf-2", "1/4/1")),
    ]
    return {"systems": systems, "ports": ports, "links": links, "counters": counters, "telemetry": telemetry,
            "alarms": alarms, "events": events}


def link_event(id_: int, state: str, ago: float, a: tuple[str, str], b: tuple[str, str]) -> dict:
    """A link's event as UFM reports it: event id 329 "Link went down" or 328 "Link is up" (UFM's event
    policy table: IBM/CAST csmd/src/ras/ufm/ufm_csm_ras_type_data.csv, "Fabric_Topology.328/329"), the
    object a link (type "Link") named '<guid>_<port> : <guid>_<port>' (Mellanox/ufm_sdk_3.0
    plugins/ufm_log_analyzer_plugin/src/loganalyze/log_parsing/event_log_regex.py, LINK_OBJ_REGEX), the
    text 'Link went down: (Switch:leaf-1 ...) - (Switch:spine-2 ...)' (ufm_sdk_3.0 scripts/eventor.py)."""
    kind = {n: "Switch" if n in SWITCH_NAMES else "Computer" for n in (a[0], b[0])}
    name = "Link went down" if state == "down" else "Link is up"
    return _event(id_, name, "Link", ago, f"{port_name(*a)} : {port_name(*b)}",
                  f"{kind[a[0]]}: {a[0]} / {a[1]} - {kind[b[0]]}: {b[0]} / {b[1]}",
                  "Warning" if state == "down" else "Info", "Fabric Topology",
                  f"{name}: ({kind[a[0]]}:{a[0]} {a[1]}) - ({kind[b[0]]}:{b[0]} {b[1]})",
                  event_type="329" if state == "down" else "328")


def _event(id_: int, name: str, type_: str, ago: float, object_name: str, object_path: str, severity: str,
           category: str, description: str, counter: str = "N/A", event_type: str = "329", reason: str | None = None
           ) -> dict:
    event = {"id": id_, "name": name, "type": type_, "event_type": event_type, "severity": severity,
             "timestamp": ufm_time(ago), "counter": counter, "category": category, "object_name": object_name,
             "object_path": object_path, "write_to_syslog": False, "description": description}
    if reason is not None:
        event["reason"] = reason
    return event


class UfmStandIn:
    def __init__(self, data: dict[str, Any] | None = None, tls: tuple[str, str] | None = None,
                 client_ca: str | None = None):
        self.data = data or fat_tree()
        self.faults: dict[str, list[str | Callable[[], bytes]]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], str | None]] = []
        self.release = threading.Event()  # set on stop: "hang" faults end
        self.snapshot_time = int(time.time())
        self.freeze_snapshot = False
        self.snapshot_requests: list[Any] = []  # bodies of POST monitoring/snapshot
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"ufm": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:  # (certificate file, key file): HTTPS, as a UFM server serves it
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            if client_ca is not None:  # UFM's client authentication: a certificate this CA signed is a user
                context.load_verify_locations(client_ca)
                context.verify_mode = ssl.CERT_OPTIONAL
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> UfmStandIn:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def advance(self, port: str, attribute: str, delta: int, source: str = "counters") -> None:
        with self._lock:
            self.data[source][port][attribute] += delta

    def fault(self, route: str, *actions: str | Callable[[], bytes]) -> None:
        self.faults.setdefault(route, []).extend(actions)

    # -- routes (path after the /ufmRest or /ufmRestV3 prefix) -----------------------------------
    def answer(self, method: str, route: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        d = self.data
        if method == "GET" and route == "/app/ufm_version":
            return 200, {"opensm": "5.20.0_ef1f438", "sharp": "3.8.0-rc5", "ibdiagnet": "2.18.0.MLNX20240804.a435258",
                         "telemetry": "1.18.2-17094707", "mft": "4.29.0-131", "ufm_webui": "6.18.0-3",
                         "ufm_release_version": "6.18.0-5", "plugins": {}}
        if method == "GET" and route == "/resources/systems":
            wanted = query.get("type", [None])[0]
            return 200, [s for s in d["systems"] if wanted is None or s["type"] == wanted.lower()]
        if method == "GET" and route == "/resources/ports":
            sys_type = query.get("sys_type", [""])[0].lower()
            kind = {"switch": "Switch IB Port", "computer": "Computer IB Port"}.get(sys_type)
            return 200, [p for p in d["ports"] if kind is None or p["description"] == kind]
        if method == "GET" and route == "/resources/links":
            if "page_number" in query and "rpp" in query:
                page, size = int(query["page_number"][0]), int(query["rpp"][0])
                return 200, {"data": d["links"][(page - 1) * size:page * size]}
            return 200, d["links"]
        if method == "POST" and route == "/monitoring/snapshot":
            return self._snapshot(body)
        if method == "GET" and route == "/app/alarms":
            return 200, d["alarms"]
        if method == "GET" and route == "/app/events":
            return 200, d["events"]
        if route == "/app/unhealthy_ports" and method in ("GET", "PUT"):
            return self._unhealthy(method, body)
        return 404, {"error": f"no route {method} {route}"}

    def _unhealthy(self, method: str, body: Any) -> tuple[int, Any]:
        """OpenSM's unhealthy ports (UFM REST API guide, "Unhealthy Ports REST API"): GET lists them,
        PUT {"ports": [name], "ports_policy": "UNHEALTHY", "action": "isolate"} adds, HEALTHY removes."""
        by_name = {p["name"]: p for p in self.data["ports"]}
        unhealthy = self.data.setdefault("unhealthy", {})
        if method == "GET":
            return 200, [{"UnhealthyGUID": p["guid"], "UnhealthyPortNumber": p["number"],
                          "UnhealthyNode": p["system_name"], "UnhealthyPortDname": p["dname"],
                          "UnhealthyPort": f"{p['system_name']}/{p['dname']}", "PeerNode": p["peer_node_name"],
                          "PeerGUID": p["peer_guid"], "PeerPortDname": p["peer_port_dname"],
                          "Condition": ["MANUAL"], "State": "Warning", "StatusTime": when,
                          "Action": action} for p, (when, action) in ((by_name[n], v) for n, v in unhealthy.items())]
        if not isinstance(body, dict) or not isinstance(body.get("ports"), list) \
                or body.get("ports_policy") not in ("HEALTHY", "UNHEALTHY"):
            return 400, {"error": "ports (a list) and ports_policy (HEALTHY or UNHEALTHY) are required"}
        unknown = [n for n in body["ports"] if n not in by_name]
        if unknown or body.get("action", "no_discover") not in ("isolate", "no_discover"):
            return 400, {"error": f"unknown ports {unknown}" if unknown else "action must be isolate or no_discover"}
        for name in body["ports"]:
            if body["ports_policy"] == "UNHEALTHY":
                unhealthy[name] = (time.strftime("%a %b %d %H:%M:%S %Y"), body.get("action", "no_discover"))
            else:
                unhealthy.pop(name, None)
        return 200, {}

    def _snapshot(self, body: Any) -> tuple[int, Any]:
        """A snapshot of the whole fabric, asked as IBM/CAST's collector asks (scope_object "Site",
        objects ["Grid.default"]), answered per port name with the values under "statistics" and the
        time in UFM's format (UFM REST API guide v6.18.0, "Telemetry REST API", history example:
        {"2021-12-01 19:12:36": {"Port": {"ec0d9a03007d7f0a_1": {"statistics": {...}, "guid": ...,
        "name": "ufm-host87 mlx5_0"}}}})."""
        self.snapshot_requests.append(body)
        required = {"attributes": list, "functions": list, "scope_object": str, "monitor_object": str, "objects": list}
        if not isinstance(body, dict) or any(not isinstance(body.get(k), t) for k, t in required.items()):
            return 400, {"error": "attributes, functions, scope_object, monitor_object and objects are required"}
        if body["scope_object"] != "Site" or body["objects"] != ["Grid.default"] or body["monitor_object"] != "Port":
            return 400, {"error": "this stand-in answers the public form only: scope_object Site, monitor_object "
                                  "Port, objects [Grid.default]"}
        names = {p["name"]: f"{p['system_name']} {p['dname']}" for p in self.data["ports"]}
        with self._lock:
            if not self.freeze_snapshot:
                self.snapshot_time = max(int(time.time()), self.snapshot_time + 1)
            ports = {name: {"statistics": {a: c[a] for a in body["attributes"] if a in ATTRIBUTES}, "guid": name,
                            "name": names.get(name, name)} for name, c in self.data["counters"].items()}
        when = datetime.fromtimestamp(self.snapshot_time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        return 200, {when: {"Port": ports}}

    def telemetry_text(self) -> bytes:
        """UFM Telemetry's Prometheus text (GET :9001/enterprise): one sample per counter and port,
        labelled port_guid="0x<node GUID>" and port_num as NVIDIA's Grafana plugin reads them
        (ufm_sdk_3.0 plugins/grafana_infiniband_telemetry_plugin/src/api/labels_api.py), with the
        sample time in ms."""
        ms = int(time.time() * 1000) if not self.freeze_snapshot else self.snapshot_time * 1000
        lines = ["# HELP ufm_telemetry_up an unrelated metric the collector must skip", "ufm_telemetry_up 1"]
        with self._lock:
            rows = [(name, dict(c)) for name, c in self.data["telemetry"].items()]
        for counter in rows[0][1] if rows else []:
            lines += [f"# HELP {counter} {counter}", f"# TYPE {counter} counter"]
            for name, c in rows:
                guid, _, num = name.rpartition("_")
                lines.append(f'{counter}{{port_guid="0x{guid}",port_num="{num}",device_id="54002"}} {c[counter]} {ms}')
        return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    ufm: UfmStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        header = self.headers.get("Authorization")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.ufm.requests.append((method, url.path, query, header))
        prefix, _, rest = url.path[1:].partition("/")
        route = "/" + rest
        basic = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
        if url.path == "/enterprise":  # UFM Telemetry (its own port in UFM; no credential)
            route = url.path
        elif prefix not in ("ufmRest", "ufmRestV3"):
            return self._send(404, b'{"error": "not found"}')
        elif not (self._client_certificate() and prefix == "ufmRest" and header is None) and (
                (prefix == "ufmRest" and header != basic) or (prefix == "ufmRestV3" and header != f"Basic {TOKEN}")):
            return self._send(401, b"Unauthorized")
        actions = self.ufm.faults.get(route)
        action = actions.pop(0) if actions else None
        if action == "hang":
            self.ufm.release.wait(30)
            return self._send(503, b"")
        if action == "500":
            return self._send(500, b'{"error": "Internal Server Error"}')
        if action == "not json":
            return self._send(200, b"<html><body>UFM is starting</body></html>", "text/html")
        if callable(action):
            return self._send(200, action())
        if route == "/enterprise":
            return self._send(200, self.ufm.telemetry_text(), "text/plain; version=0.0.4")
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return self._send(400, b'{"error": "bad JSON"}')
        status, answer = self.ufm.answer(method, route, query, body)
        self._send(status, json.dumps(answer).encode())

    def _client_certificate(self) -> bool:
        """A client certificate the server's client CA verified was presented."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        return bool(getpeercert and getpeercert())

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a hung request)
