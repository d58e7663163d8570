"""Correlator step time per shard (part 3 of bench/cluster_capacity.py): bench/correlator_scale.py's
synthetic leaf-spine fabric, one correlator over the whole fabric against one that owns a shard of a
4-way leaf split (nms/app/correlate_partitions.py: `leaf` partitions, rendezvous ownership over 4
members) and is handed the windows whose source or destination host is under one of its leaves.

Routing as modelled here: a window goes to the owners of both its hosts' leaves (the spine links
between have one owner, the leaf's side: docs/cluster.md, "Sharded correlation"). The `core`
partition is left out: were every cross-leaf window routed to core's owner too, that owner would see
nearly everything (docs/scale.md says so).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the synthetic fabric

from _fabric_synth import NS, T0, Synth  # noqa: E402

from bench.correlator_scale import HOSTS_PER_LEAF, PATHS, PEERS, SPINES  # noqa: E402
from correlator.engine import Correlator  # noqa: E402
from nms.app.correlate_partitions import CORE, owned, partitions  # noqa: E402
from nms.config.models import CorrelatorConfig, Thresholds  # noqa: E402

SHARDS = 4


def shard_hosts(synth: Synth, shards: int = SHARDS, member: str = "m0") -> set[str]:
    """The hosts under the leaves that `member` owns among `shards` members."""
    parts = partitions(synth.fabric, "leaf")
    leaves = {name: hosts for name, hosts in parts.items() if name != CORE}
    mine = owned(leaves, [f"m{i}" for i in range(shards)], member)
    return {h for name in mine for h in leaves[name] if h in synth.host_idx}


def _correlator(synth: Synth, keep: Callable[[object], bool]) -> Correlator:
    c = Correlator(synth.fabric, Thresholds(), CorrelatorConfig())
    c.add([r for r in synth.inventory_records() if r.measurement != "probe_path" or keep(r)])
    c.add(synth.switch_records(T0))
    return c


def _time_steps(synth: Synth, keep: Callable[[object], bool], warm: int, windows: int) -> dict:
    """Median step times of a correlator over the whole fabric and of one handed only what `keep` lets
    through, stepped side by side on the same windows; and the windows each was handed a second."""
    whole, shard = _correlator(synth, lambda _: True), _correlator(synth, keep)
    times: dict[str, list[float]] = {"whole": [], "shard": []}
    handed = {}
    for i, t in enumerate(range(T0, T0 + warm + windows)):
        batch = synth.windows(t)
        mine = [r for r in batch if keep(r)]
        handed = {"whole": len(batch), "shard": len(mine)}
        for name, c, records in (("whole", whole, batch), ("shard", shard, mine)):
            c.add(records)
            started = time.perf_counter()
            c.step((t + 1) * NS + NS // 10)
            if i >= warm:
                times[name].append(time.perf_counter() - started)
        del batch, mine
    del whole, shard
    gc.collect()
    return {"whole_s": statistics.median(times["whole"]), "shard_s": statistics.median(times["shard"]),
            "whole_windows": handed["whole"], "shard_windows": handed["shard"]}


def run(hosts: int, warm: int, windows: int, say: Callable[[str], None] = print) -> dict:
    say(f"[shards {hosts} hosts] building the fabric ...")
    synth = Synth(spines=SPINES, leaves=max(1, hosts // HOSTS_PER_LEAF), hosts_per_leaf=HOSTS_PER_LEAF,
                  peers=PEERS, paths_per_peer=PATHS, validate=False, seed=hosts)
    shares = [shard_hosts(synth, SHARDS, f"m{i}") for i in range(SHARDS)]
    mine = max(shares, key=len)  # the busiest member sets the pace
    say(f"[shards {hosts} hosts] {len(synth.keys):,} paths; the largest of {SHARDS} shards "
        f"({sorted(map(len, shares))} hosts) and the whole fabric side by side, {warm} + {windows} windows ...")
    result = _time_steps(synth, lambda r: r.src_host in mine or r.dst_host in mine, warm, windows)
    say(f"[shards {hosts} hosts] step whole {result['whole_s']:.3f} s ({result['whole_windows']:,} windows), "
        f"shard {result['shard_s']:.3f} s ({result['shard_windows']:,}): ratio "
        f"{result['shard_s'] / result['whole_s']:.2f}")
    return {"hosts": len(synth.hosts), "shard_hosts": len(mine), **result}
