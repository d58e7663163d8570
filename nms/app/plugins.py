"""Find plugins (store backends, collectors, notifiers: the `nms.*` entry-point groups) by name."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from nms.bus import Bus
from nms.config import NmsConfig
from nms.config.models import BusConfig
from nms.store import TimeSeriesStore

STORE_GROUP = "nms.stores"
BUS_GROUP = "nms.buses"


class PluginError(Exception):
    pass


def load_plugin(group: str, name: str) -> Any:
    matches = [ep for ep in entry_points(group=group) if ep.name == name]
    if not matches:
        available = sorted(ep.name for ep in entry_points(group=group))
        raise PluginError(f"no {group} plugin named {name!r} (installed: {', '.join(available) or 'none'})")
    return matches[0].load()


def open_store(config: NmsConfig) -> TimeSeriesStore:
    backend = load_plugin(STORE_GROUP, config.store.backend)
    return backend.from_config(config)


def open_bus(config: BusConfig) -> Bus:
    """The telemetry bus of a cluster (not connected yet)."""
    backend = load_plugin(BUS_GROUP, config.backend)
    bus: Bus = backend.from_config(config)
    return bus
