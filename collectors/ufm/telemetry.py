"""UFM Telemetry's Prometheus endpoint -> PortSample counters (docs/ufm.md "Counters from UFM Telemetry").

UFM Telemetry serves the last sample of every port in the Prometheus text format on port 9001
(NVIDIA UFM Telemetry documentation, "Prometheus Endpoint Support"; NVIDIA's Grafana plugin reads
`http://<ufm>:9001/enterprise`, Mellanox/ufm_sdk_3.0 plugins/grafana_infiniband_telemetry_plugin).
A port's samples carry the labels `port_guid` ("0x<node GUID>"; a switch's ports share one) and
`port_num`, so `<node GUID>_<port_num>` is UFM's port name.

The text is parsed by prometheus_client's parser, which keeps an integer value an exact int (a
64-bit counter is never rounded through a float); a value it can only give as a float is used
where that is exact (integral, below 2^53) and otherwise left out and noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from collectors.ufm.model import U64, Bad, exact, guid_of

# PortSample counter <- UFM Telemetry counter (IB PortCountersExtended names, as UFM Telemetry and
# NVIDIA's Grafana dashboard and PDR plugin name them)
COUNTERS = {
    "out_octets": "PortXmitDataExtended",
    "in_octets": "PortRcvDataExtended",
    "out_pkts": "PortXmitPktsExtended",
    "in_pkts": "PortRcvPktsExtended",
    "in_errors": "PortRcvErrors",
    "out_discards": "PortXmitDiscards",
}
# counters without a PortSample field: stored as a `ufm_port_errors` point; link_downed's increase is
# also link-flap evidence (collectors/ufm/events.py)
EXTRA = {"link_downed": "LinkDownedCounterExtended", "symbol_errors": "Symbol_Errors"}
DATA = ("out_octets", "in_octets")
_WANTED = {name: key for key, name in (COUNTERS | EXTRA).items()}


@dataclass
class Scrape:
    newest_ns: int | None = None  # the newest sample time the endpoint gave (None: it gave none)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)  # UFM port name -> PortSample counters
    extra: dict[str, dict[str, int]] = field(default_factory=dict)  # UFM port name -> EXTRA counters
    problems: list[str] = field(default_factory=list)


def parse(text: str, data_in_words: bool) -> Scrape:
    """The endpoint's text -> counters per UFM port name. Raises Bad when the text is not the
    Prometheus format."""
    out = Scrape()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise Bad(f"not Prometheus text ({e})"[:300]) from None
    for family in families:
        key = _WANTED.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            _take(out, key, sample.name, sample.labels, sample.value, sample.timestamp, data_in_words)
    return out


def _take(out: Scrape, key: str, name: str, labels: dict[str, str], value: object, timestamp: object,
          data_in_words: bool) -> None:
    guid, number = labels.get("port_guid") or labels.get("node_guid"), labels.get("port_num")
    if not guid or not number or not number.isdigit():
        out.problems.append(f"{name}{_show(labels)}: no port_guid and port_num labels")
        return
    port = f"{guid_of(guid)}_{int(number)}"
    count = exact(value)
    if count is None:
        out.problems.append(f"{name}{_show(labels)}: value {value!r} is no exact unsigned 64-bit count")
        return
    if key in DATA and data_in_words:
        count = (count * 4) & U64
    (out.counters if key in COUNTERS else out.extra).setdefault(port, {})[key] = count
    if isinstance(timestamp, (int, float)) and timestamp > 0:
        ns = round(float(timestamp) * 1000) * 10**6  # the text's times are in ms
        out.newest_ns = max(out.newest_ns or 0, ns)


def _show(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())[:4]) + "}"
