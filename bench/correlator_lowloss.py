"""Low-rate loss: detection time per loss rate, and healthy soaks, on a synthetic fabric.

    .venv/bin/python bench/correlator_lowloss.py [--shape 3x4x2] [--rates 1,0.5,0.1] [--seeds 30]
        [--soak-seeds 5] [--soak-s 600] [--background 0.01] [--warm 600]

The test suite's synthetic leaf-spine (tests/_fabric_synth.py: 10 exchanges/s per path, one path
per spine per peer, background loss per exchange everywhere), the correlator with its defaults,
one step per window. Per seed: `--warm` s healthy (the link baselines learn), then one leaf->spine
direction loses `rate` % (rotating over the links); detection = steps until that link is reported
(corrupting_link), limit `loss_horizon` + 60 s. After detection the fault runs on for 120 s: a
window without the finding is a gap (an incident resolves only after 10 in a row). Printed per
rate: exchanges/s crossing the link, the formula's time (docs/correlator.md), detection
p50/p90/p99/max, misses, gaps, other findings.
Soak: `--soak-s` healthy seconds per seed, every finding counted.

    sudo .venv/bin/python bench/correlator_lowloss.py --lab [--shape 3x4x2] [--rates 1,0.5] [--trials 1]
        [--soak-s 120] [--prefix nmsg-] [--mgmt 198.18.230.0/24]

On the lab instead (root): the service with its default thresholds, SNMP every 5 s, an agent per
host at the default probe rate; a soak, then per rate `--trials` netem losses on a leaf->spine
direction (a random uplink): detection = the incident's first corrupting_link event - the fault's
start; the fault then runs on for 60 s (one incident, still open, is the pass), is healed, and
the time to its resolution is taken. The lab is always taken down.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test suite's synthetic fabric
sys.path.insert(0, str(REPO))

from _fabric_synth import NS, T0, Synth, undirected  # noqa: E402

from correlator.engine import Correlator  # noqa: E402
from correlator.sequential import ALPHA_OPEN  # noqa: E402
from nms.config.models import CorrelatorConfig, Thresholds  # noqa: E402


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[max(0, min(len(v) - 1, math.ceil(p / 100 * len(v)) - 1))]


def kl(r: float, b: float) -> float:
    return r * math.log(r / b) + (1 - r) * math.log((1 - r) / (1 - b))


def predicted_s(rate: float, per_s: float, baseline: float) -> float:
    """T ~ ln(1/alpha) / (N * KL(r || b)): seconds until the window's evidence reaches the threshold."""
    return math.log(1 / ALPHA_OPEN) / (per_s * kl(rate, baseline))


class Fabric:
    def __init__(self, shape: tuple[int, int, int], seed: int, background: float):
        spines, leaves, hosts = shape
        self.s = Synth(spines=spines, leaves=leaves, hosts_per_leaf=hosts, seed=seed, background_loss=background)
        self.c = Correlator(self.s.fabric, Thresholds(), CorrelatorConfig())
        self.c.add(self.s.inventory_records())
        self.t = T0

    def step(self) -> list:
        self.c.add(self.s.windows(self.t))
        self.t += 1
        return self.c.step(self.t * NS + NS // 10)


def trial(shape, seed: int, rate: float, background: float, warm_s: int) -> dict:
    fab = Fabric(shape, seed, background)
    warm = [f for _ in range(warm_s) for f in fab.step()]
    directed = fab.s.up_link(1 + seed % shape[1], 1 + seed % shape[0])
    link = undirected(*directed.split("->"))
    fab.s.loss[directed] = rate
    limit = int(CorrelatorConfig().loss_horizon) + 60
    out = {"warm_findings": len(warm), "found": None, "gaps": 0, "others": 0, "per_s": None}
    for second in range(1, limit + 1):
        found = fab.step()
        out["others"] += sum(f.element != link for f in found)
        mine = [f for f in found if f.element == link and f.kind == "corrupting_link"]
        if mine:
            out["found"] = second
            loss = mine[0].evidence["loss"]
            out["per_s"] = loss["sent"] / loss["over_s"]
            out["baseline"] = loss["baseline_pct"] / 100
            break
    if out["found"] is not None:
        for _ in range(120):
            found = fab.step()
            out["gaps"] += not any(f.element == link for f in found)
            out["others"] += sum(f.element != link for f in found)
    return out


def lab_run(args, shape) -> None:
    import random
    import time

    from lab import faults
    from lab.correlator_trials import first_as, incidents, soak, wait_quiet
    from lab.mesh import MeshLab

    spines, leaves, hosts = shape
    rng = random.Random(args.seed)
    mesh = MeshLab(args.prefix, args.mgmt, snmp_interval="5s", spines=spines, leaves=leaves, hosts_per_leaf=hosts)
    try:
        mesh.up()
        mesh.wait_traced(120)
        wait_quiet(mesh, 120)
        print(f"lab {args.shape} up; soak {args.soak_s} s ...", flush=True)
        false = soak(mesh, args.soak_s)
        print(f"soak {args.soak_s} s: {len(false)} false incidents {false}", flush=True)
        uplinks = [link for link in mesh.topo.links if {mesh.topo.nodes[link.a.node].role,
                                                        mesh.topo.nodes[link.b.node].role} == {"spine", "leaf"}]
        for rate_pct in (float(r) for r in args.rates.split(",")):
            for _ in range(args.trials):
                link = rng.choice(uplinks)
                leaf = link.a.node if mesh.topo.nodes[link.a.node].role == "leaf" else link.b.node
                element = "--".join(sorted((str(link.a), str(link.b))))
                fault = faults.inject(mesh.dir, "loss", link.name, percent=rate_pct, from_node=leaf)
                start, flagged, found = fault["start_ns"], None, None
                deadline = time.monotonic() + (30 if rate_pct >= 1 else 90)
                while time.monotonic() < deadline and flagged is None:
                    time.sleep(0.2)
                    found = next((i for i in incidents(mesh, since=start) if i["element"] == element), None)
                    if found is not None:
                        flagged = first_as(mesh, found["id"], "corrupting_link")
                time.sleep(60)  # the fault goes on: the incident must stay one, open
                mine = [i for i in incidents(mesh, since=start) if i["element"] == element]
                others = [f"{i['kind']} {i['element']}" for i in incidents(mesh, since=start)
                          if i["element"] != element and i["opened_ns"] >= start]
                steady = len(mine) == 1 and mine[0]["state"] == "open"
                faults.heal(mesh.dir, fault["id"])
                healed, resolved = time.time_ns(), None
                end = time.monotonic() + 240
                while found is not None and time.monotonic() < end and resolved is None:
                    time.sleep(1)
                    now = next(i for i in incidents(mesh, since=start) if i["id"] == found["id"])
                    resolved = (now["resolved_ns"] - healed) / 1e9 if now["state"] == "resolved" else None
                latency = f"{(flagged - start) / 1e9:.2f} s" if flagged else "MISSED"
                print(f"{rate_pct:g} % on {leaf}'s side of {link.name}: {latency}; one open incident for 60 s more: "
                      f"{steady} ({len(mine)} on the element); resolved {resolved} s after the heal; "
                      f"other incidents: {others}", flush=True)
                wait_quiet(mesh, 120)
    finally:
        mesh.down()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="3x4x2", help="spines x leaves x hosts per leaf")
    ap.add_argument("--rates", default="1,0.5,0.1", help="loss rates in %%")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--soak-seeds", type=int, default=5)
    ap.add_argument("--soak-s", type=int, default=600)
    ap.add_argument("--background", type=float, default=0.01, help="background loss per exchange, %%")
    ap.add_argument("--warm", type=int, default=600, help="healthy seconds before the fault (baselines learn)")
    ap.add_argument("--lab", action="store_true", help="on the lab (root) instead of the synthetic fabric")
    ap.add_argument("--trials", type=int, default=1, help="--lab: faults per rate")
    ap.add_argument("--seed", type=int, default=1, help="--lab: which uplinks")
    ap.add_argument("--prefix", default="nmsg-", help="--lab: namespace prefix")
    ap.add_argument("--mgmt", default="198.18.230.0/24", help="--lab: management subnet")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split("x"))
    if args.lab:
        lab_run(args, shape)
        return
    bg = args.background / 100
    print(f"shape {args.shape}, background {args.background} %, alpha {ALPHA_OPEN:g}, warm {args.warm} s")
    for rate_pct in (float(r) for r in args.rates.split(",")):
        rate = rate_pct / 100
        seeds = args.seeds if rate_pct >= 0.5 else max(1, args.seeds // 3)
        runs = [trial(shape, seed, rate, bg, args.warm) for seed in range(1, seeds + 1)]
        times = [r["found"] for r in runs if r["found"] is not None]
        per_s = [r["per_s"] for r in runs if r["per_s"]]
        n = sum(per_s) / len(per_s) if per_s else float("nan")
        base = sum(r["baseline"] for r in runs if r["found"]) / max(len(times), 1)
        formula = predicted_s(rate + bg, n, base) if per_s else float("nan")
        stats = (f"p50 {pct(times, 50)} s, p90 {pct(times, 90)} s, p99 {pct(times, 99)} s, max {max(times)} s"
                 if times else "none found")
        print(f"{rate_pct:g} %: {len(runs)} seeds, ~{n:.0f} exchanges/s on the link, baseline ~{100 * base:.3f} %, "
              f"formula {formula:.1f} s; {stats}; missed {len(runs) - len(times)}, "
              f"gaps {sum(r['gaps'] for r in runs)}, other findings {sum(r['others'] for r in runs)}", flush=True)
    for seed in range(1, args.soak_seeds + 1):
        fab = Fabric(shape, 1000 + seed, bg)
        found = [f for _ in range(args.soak_s) for f in fab.step()]
        print(f"soak seed {1000 + seed}: {args.soak_s} s healthy, {len(found)} findings "
              f"{sorted({(f.kind, f.element) for f in found})}", flush=True)


if __name__ == "__main__":
    main()
