"""Which probe transport to use: UDP (always available) or RDMA UD through pyverbs (optional).

pyverbs is not a dependency: it is imported at run time and, when an RDMA device is present, the
agent notes it. This build carries only the detection; UD probing itself is not implemented, so
the agent probes over UDP either way and says why, once. `transport: verbs` in the config is
refused with the reason.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class TransportError(Exception):
    pass


def detect_verbs() -> tuple[list[str], str]:
    """(RDMA device names, why none are usable if empty)."""
    try:
        from pyverbs import device  # type: ignore[import-not-found]
    except ImportError:
        return [], "pyverbs is not installed"
    except Exception as e:  # a broken rdma-core install raises all sorts of errors on import
        return [], f"pyverbs failed to load: {e}"
    try:
        devices = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in device.get_device_list()]
    except Exception as e:
        return [], f"pyverbs cannot list RDMA devices: {e}"
    return devices, "" if devices else "no RDMA device found"


def choose(wanted: str) -> str:
    """'udp' (the only transport implemented), after checking what `wanted` asks for."""
    if wanted == "udp":
        return "udp"
    devices, why = detect_verbs()
    if wanted == "verbs":
        raise TransportError(f"probe.transport is verbs but {why or 'UD probing is not implemented in this build'}")
    if devices:
        log.warning("RDMA devices %s found, but UD probing is not implemented in this build: probing over UDP",
                    ", ".join(devices))
    else:
        log.info("RDMA UD probes unavailable (%s): probing over UDP", why)
    return "udp"
