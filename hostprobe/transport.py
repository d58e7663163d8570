"""Which probe transport each NIC uses: RDMA UD through pyverbs where it can, UDP always.

pyverbs is not a dependency: it is imported at run time. `probe.transport`:
- `udp`: UDP only;
- `auto` (default): every NIC whose IPv4 address is an active RoCE v2 GID of an RDMA device also
  probes over RDMA UD (hostprobe.verbs); the others, or all when pyverbs or devices are missing,
  probe over UDP, and the agent says why, once;
- `verbs`: like auto, but a NIC without a usable RDMA device is an error at start.
UDP responders run in every case, so peers probing over UDP always get answers.
"""

from __future__ import annotations

import logging

from hostprobe import verbs

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
        devices = verbs.device_names(device)
    except Exception as e:  # pyverbs raises when the kernel has no RDMA device at all
        return [], f"pyverbs cannot list RDMA devices: {e}"
    return devices, "" if devices else "no RDMA device found"


def open_devices(wanted: str, addresses: list[str], stats: dict) -> dict[str, verbs.VerbsDevice]:
    """The RDMA device of each NIC address that has one (none for `udp`); raises TransportError when
    `verbs` is wanted and a NIC has none."""
    if wanted == "udp":
        return {}
    devices, why = detect_verbs()
    found: dict[str, verbs.VerbsDevice] = {}
    problems: list[str] = []
    if devices:
        pv = verbs.load_pyverbs()
        for address in addresses:
            try:
                found[address] = verbs.VerbsDevice(address, stats, pv)
            except (verbs.VerbsError, pv.PyverbsError) as e:
                problems.append(f"{address}: {e}")
    else:
        problems.append(why)
    if problems and wanted == "verbs":
        for dev in found.values():
            dev.close()
        raise TransportError(f"probe.transport is verbs but {'; '.join(problems)}")
    if found:
        log.info("RDMA UD probes from %s", ", ".join(f"{a} ({d.name} port {d.port} GID {d.gid_index})"
                                                     for a, d in found.items()))
    if problems:
        log.info("RDMA UD probes unavailable (%s): probing over UDP%s", "; ".join(problems),
                 " from the other NICs" if found else "")
    return found
