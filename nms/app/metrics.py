"""Prometheus metrics of the service itself (one registry per service, so tests stay isolated)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nms import __version__


class _StoreCollector(Collector):
    """Exports the store backend's own numbers (points written, spool bytes, ...) at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, float]], backend: str):
        self._stats = stats
        self._backend = backend

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for key, value in sorted(self._stats().items()):
            family = GaugeMetricFamily(f"nms_store_{key}", f"telemetry store: {key.replace('_', ' ')}",
                                       labels=["backend"])
            family.add_metric([self._backend], float(value))
            yield family


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Gauge("nms_build_info", "build information", ["version"], registry=r).labels(__version__).set(1)
        self._member = Gauge("nms_member_info", "what this process is: its member name (NMS_CLUSTER_MEMBER, "
                             "set by `nms cluster up`; else the host name) and its roles", ["member", "roles"],
                             registry=r)
        self.requests = Counter("nms_http_requests", "HTTP requests", ["method", "route", "status"], registry=r)
        self.latency = Histogram("nms_http_request_seconds", "HTTP request latency", ["route"], registry=r)
        self.auth_failures = Counter("nms_auth_failures", "rejected API calls", ["reason"], registry=r)
        self.ingest_items = Counter("nms_ingest_items", "ingested records", ["kind", "result"], registry=r)
        self.scheduler_runs = Counter("nms_scheduler_job_runs", "scheduled job runs", ["job", "result"], registry=r)
        self.clock_edges = Counter("nms_clock_edges", "clock edges by outcome: used, dropped (outliers), late "
                                   "(slot already solved), ignored", ["result"], registry=r)
        self.clock_hosts = Gauge("nms_clock_hosts", "hosts in the last clock solve", registry=r)
        self.clock_windows = Counter("nms_clock_windows", "ingested probe windows, clock-corrected or not",
                                     ["result"], registry=r)

    def member_info(self, member: str, roles: frozenset[str]) -> None:
        self._member.labels(member, ",".join(sorted(roles))).set(1)

    def watch_store(self, stats: Callable[[], dict[str, float]], backend: str) -> None:
        self.registry.register(_StoreCollector(stats, backend))
