"""Link down -> PathEvent for every affected path: latency over repeated trials on the fabric lab.

    sudo .venv/bin/python bench/detection_latency.py [--trials 20] [--down-after 900ms]

A 2x2x2 lab with the service and an agent per host (default probing: 10 exchanges/s per path).
Each trial takes one leaf-spine link down (blackhole: carrier lost on both ends, routes kept, so
exactly the flows hashed onto it die), rotating over the four fabric links, waits until the
service holds a down PathEvent for every probed path whose probe or reply crosses that link (as
`ip route get` predicts), then heals and waits for every path to be reported up again.

Per trial and per path: detection = the event's timestamp minus the fault's start (both the
lab's clock, no clock emulation here), and visible = when the bench saw it through the service's
API (polled every 20 ms) minus the fault's start. The fault's start is taken just before the
carrier is dropped, so both are slight overestimates. A trial's latency is its slowest affected
path. Baseline: `down_after`, the silence a path must show before it is declared down (the floor
of any silence detector with that setting); ratio = latency / down_after. Down events for paths
that do not cross the link are counted as false alarms.
"""

from __future__ import annotations

import argparse
import time

FABRIC_LINKS = ["leaf1-spine1", "leaf2-spine2", "leaf1-spine2", "leaf2-spine1"]


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[max(0, min(len(v) - 1, int(round(p / 100 * len(v) + 0.5)) - 1))]


def run(trials: int, down_after: str | None) -> None:
    from hostprobe.config import ProbeSettings
    from lab import faults
    from lab.mesh import MeshLab, legs_through
    from nms.config.models import parse_duration

    threshold = parse_duration(down_after) if down_after else ProbeSettings.model_fields["down_after"].default
    mesh = MeshLab("nmsd-", "198.18.246.0/24")
    per_path, per_trial, visible, false_alarms, recover, inject_s, lower = [], [], [], 0, [], [], []
    try:
        mesh.up(probe_options={"down_after": down_after} if down_after else None)
        mesh.wait_traced()
        time.sleep(2.0)
        sport_of = mesh.probed_paths()
        for i in range(trials):
            link = FABRIC_LINKS[i % len(FABRIC_LINKS)]
            affected = {k for k, sp in sport_of.items() if legs_through(mesh.topo, k[0], k[1], sp, link)}
            f = faults.inject(mesh.dir, "link-down", link)
            start, applied = f["start_ns"], time.time_ns()  # the carrier dropped between these two
            inject_s.append((applied - start) / 1e9)
            seen: dict = {}
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and set(seen) < affected:
                now = time.time_ns()
                for e in mesh.query("path_event", start - 10**9):
                    key = (e["src_host"], e["dst_host"], e["path_id"])
                    if e["state"] == "down" and e["time"] >= start and key not in seen:
                        seen[key] = (e["time"] - start, now - start)
                time.sleep(0.02)
            healed = faults.heal(mesh.dir, f["id"])[0]["end_ns"]
            missing = affected - set(seen)
            false_alarms += len(set(seen) - affected)
            if missing:
                print(f"trial {i + 1}: {link}: no down event within 5 s for {sorted(missing)}")
            got = [seen[k] for k in affected if k in seen]
            per_path += [d / 1e9 for d, _ in got]
            visible += [v / 1e9 for _, v in got]
            per_trial.append(max(d for d, _ in got) / 1e9 if got and not missing else float("inf"))
            lower.append(per_trial[-1] - inject_s[-1])
            # every path answers again before the next trial
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                ups = {(e["src_host"], e["dst_host"], e["path_id"]): e["time"]
                       for e in mesh.query("path_event", healed) if e["state"] == "up"}
                if affected <= set(ups):
                    recover.append(max(ups[k] for k in affected) / 1e9 - healed / 1e9)
                    break
                time.sleep(0.1)
            time.sleep(1.5)
            print(f"trial {i + 1:2d}: {link}: {len(affected)} paths, all down events after "
                  f"{per_trial[-1]:.3f} s", flush=True)
    finally:
        mesh.down()

    ok = [t for t in per_trial if t != float("inf")]
    print(f"\nlink down -> PathEvent, {trials} trials, down_after {threshold:g} s, 10 exchanges/s per path")
    print(f"  per path   (n={len(per_path)}): detection p50 {pct(per_path, 50):.3f} s, p99 {pct(per_path, 99):.3f} s,"
          f" max {max(per_path):.3f} s; visible at the service p99 {pct(visible, 99):.3f} s")
    print(f"  per trial (all affected paths): p50 {pct(per_trial, 50):.3f} s, p99 {pct(per_trial, 99):.3f} s, "
          f"max {max(per_trial):.3f} s ({len(ok)}/{trials} trials complete)")
    print(f"  fault injection (start_ns -> carrier surely gone): p50 {pct(inject_s, 50) * 1e3:.1f} ms, max "
          f"{max(inject_s) * 1e3:.1f} ms; per trial from its end (a lower bound): p99 {pct(lower, 99):.3f} s")
    print(f"  ratio to down_after (p99 per trial): {pct(per_trial, 99) / threshold:.2f}")
    print(f"  false alarms (paths not crossing the link): {false_alarms}")
    if recover:
        print(f"  recovery (heal -> last up event): p50 {pct(recover, 50):.3f} s, max {max(recover):.3f} s")
    print(f"  target p99 <= 1 s: {'met' if pct(per_trial, 99) <= 1.0 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--down-after", default=None, help="the agents' probe.down_after (default: theirs, 900ms)")
    args = parser.parse_args()
    from lab.sh import require_root

    require_root()
    run(args.trials, args.down_after)


if __name__ == "__main__":
    main()
