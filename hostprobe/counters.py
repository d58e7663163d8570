"""Host NIC counters: /sys/class/net, /sys/class/infiniband when present, `ethtool -S` when installed.

The sysfs statistics are the kernel's own; RDMA NICs add ECN/CNP counters under
/sys/class/infiniband/<dev>/ports/<n>/hw_counters, and `ethtool -S` adds pause (PFC) frames. On
a host without ethtool or RDMA devices those fields stay empty: nothing is guessed.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

from nms.records import HostNicSample

log = logging.getLogger(__name__)

SYSFS_NET = Path("/sys/class/net")
SYSFS_IB = Path("/sys/class/infiniband")
NET_STATS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
             "tx_dropped")
OPER = {"up": "up", "down": "down", "unknown": "unknown", "dormant": "dormant", "notpresent": "notPresent",
        "lowerlayerdown": "lowerLayerDown", "testing": "testing"}
# RDMA hw_counters (mlx5 names) -> HostNicSample fields
IB_HW = {"np_ecn_marked_roce_packets": "ecn_marked", "np_cnp_sent": "cnp_sent", "rp_cnp_handled": "cnp_received"}
_ETHTOOL_LINE = re.compile(r"^\s*([\w\-.\[\]]+):\s*(\d+)\s*$")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def ib_device_of(nic: str, root: Path = SYSFS_IB) -> Path | None:
    """The RDMA device whose port is this netdev (…/infiniband/<dev>/device/net/<nic>)."""
    if not root.is_dir():
        return None
    for dev in root.iterdir():
        if (dev / "device" / "net" / nic).exists():
            return dev
    return None


def ib_counters(dev: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for port in sorted((dev / "ports").glob("*")):
        for name, field in IB_HW.items():
            value = _read_int(port / "hw_counters" / name)
            if value is not None:
                out[field] = out.get(field, 0) + value
    return out


def parse_ethtool(text: str) -> dict[str, int]:
    """Pause frame totals from `ethtool -S` output (PFC per priority summed; driver names vary)."""
    stats = {m.group(1): int(m.group(2)) for line in text.splitlines() if (m := _ETHTOOL_LINE.match(line))}
    out: dict[str, int] = {}
    for direction in ("rx", "tx"):
        exact = [f"{direction}_pause_ctrl_phy", f"{direction}_pause_frames", f"{direction}_pause"]
        value = next((stats[k] for k in exact if k in stats), None)
        prio = [v for k, v in stats.items() if re.fullmatch(rf"{direction}_prio\d+_pause", k)]
        if value is None and prio:
            value = sum(prio)
        if value is not None:
            out[f"pause_{direction}"] = value
    if "rx_ecn_mark" in stats:
        out["ecn_marked"] = stats["rx_ecn_mark"]
    return out


class NicCounters:
    def __init__(self, host: str, nics: list[str], ethtool: str = "auto", clock=None):
        self.host, self.nics, self.clock = host, nics, clock
        self.ethtool = shutil.which("ethtool") if ethtool == "auto" else None
        if ethtool == "auto" and not self.ethtool:
            log.info("ethtool is not installed: NIC pause/ECN counters from `ethtool -S` are skipped")
        self.ib = {nic: ib_device_of(nic) for nic in nics}
        self._ethtool_failed: set[str] = set()

    def sample(self, nic: str, ts: int) -> HostNicSample:
        base = SYSFS_NET / nic
        fields: dict = {name: _read_int(base / "statistics" / name) for name in NET_STATS}
        try:
            fields["oper_status"] = OPER.get((base / "operstate").read_text().strip(), "unknown")
        except OSError:
            fields["oper_status"] = "notPresent"
        fields["mtu"] = _read_int(base / "mtu")
        # Mb/s; -1 or unreadable (EINVAL) when the link is down or unknown. Only a NIC with a device
        # behind it: virtual ones (veth says 10000 whatever it carries) would fake a speed mismatch
        speed = _read_int(base / "speed") if (base / "device").exists() else None
        fields["speed_bps"] = speed * 1_000_000 if speed is not None and speed > 0 else None
        if self.ib.get(nic) is not None:
            fields.update(ib_counters(self.ib[nic]))
        if self.ethtool and nic not in self._ethtool_failed:
            fields.update(self._ethtool(nic))
        return HostNicSample(host=self.host, nic=nic, ts=ts, **{k: v for k, v in fields.items() if v is not None})

    def _ethtool(self, nic: str) -> dict[str, int]:
        try:
            proc = subprocess.run([self.ethtool, "-S", nic], capture_output=True, text=True, timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is None or proc.returncode != 0:
            self._ethtool_failed.add(nic)  # e.g. veth without statistics: do not retry every period
            log.info("ethtool -S %s gives no statistics; skipping it for this NIC", nic)
            return {}
        return parse_ethtool(proc.stdout)

    def sample_all(self, ts: int) -> list[HostNicSample]:
        return [self.sample(nic, ts) for nic in self.nics]
