"""GPU check of the NCCL plugin on a real NCCL (issue 25), for a machine the `device` tool lends.

Two ranks on one GPU made two hosts for NCCL (NCCL_HOSTID=fakehost0/1), talking over NET/Socket on
lo so that NCCL runs its proxy (docs/nccl_plugin.md, /work/shared/REFERENCE.md "Real NCCL on a lent
GPU"); `torch.distributed` with the nccl backend issues all-reduces. The real plugin ships to a real
`nms-agent` (its Unix socket), which reports to a real `nms serve` (embedded store). Checked:

1. the job appears by itself (`GET /jobs/<id>`) with both ranks, its collectives with busbw;
2. rank 1 sleeping `--slow-ms` before each all-reduce of a phase opens the job's slowdown
   (`GET /jobs/<id>/slowdowns`), and it clears after;
3. records per rank per second the agent hands on, and what they would be with every proxy step
   shipped (its `nccl_steps`: steps folded into per-second stats);
4. the plugin's cost: all-reduce time with / without it, interleaved runs in the same session.

    python3 bench/nccl_real.py [--sizes 4096,262144,4194304] [--iters 30] [--slow-ms 20] [--rounds 3]
                               [--mps] [--out DIR]

Needs: PyTorch with CUDA and one GPU; the project's Python dependencies (on the device, carried as
wheels: docs/nccl_plugin.md); the plugin built (`pip install -e .`) or a C compiler (built here
into the work directory). Prints one JSON summary and writes it to DIR/nccl_real.json (DIR: --out,
else $OUT when set). Exit 0 when every check passed, 1 when one failed, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = "nccl-real-1"
ADMIN = "nccl-real-admin-token-0123456789"
AGENT = "nccl-real-agent-token-0123456789"
SLOW_RANK = 1
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
            "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


# --- a rank (run as `nccl_real.py --worker`) ---------------------------------------------------------

def worker(sizes: list[int], iters: int, warmup: int, phases: list[tuple[str, float]]) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    results: dict[str, list[float]] = {}
    for size in sizes:
        x = torch.ones(size // 4, device="cuda", dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        for phase, slow_ms in phases:
            times = results.setdefault(f"{phase}/{size}", [])
            for _ in range(iters):
                if slow_ms and rank == SLOW_RANK:
                    time.sleep(slow_ms / 1000)  # the other rank waits inside the all-reduce: a straggler
                t0 = time.perf_counter()
                dist.all_reduce(x)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "results": results}), flush=True)


# --- the stack: nms serve + nms-agent ----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.25)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} not seen within {timeout:.0f} s\n{tail}")


def start_stack(work: Path, procs: list) -> tuple[str, Path]:
    import yaml

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (work / "nms.yaml").write_text(yaml.safe_dump({
        "data_dir": str(work / "data"), "log_level": "warning",
        "fabric": {"hosts": [{"name": "h1", "nics": [{"name": "lo", "address": "127.0.0.1"}]}]},
        "api": {"port": port, "tokens": [{"name": "admin", "scopes": ["admin"], "token": ADMIN},
                                         {"name": "agent-h1", "scopes": ["ingest"], "token": AGENT, "host": "h1"}]}}))
    (work / "h1.yaml").write_text(yaml.safe_dump({
        "host": "h1", "service": {"url": url, "token": AGENT, "timeout": "30s"},
        "nics": [{"name": "lo", "address": "127.0.0.1"}],
        "probe": {"key": "nccl-real-probe-key-0123456789", "port": free_port(), "sports": 1},
        "report": {"buffer_dir": str(work / "h1"), "interval": "0.2s", "stats_interval": "0.5s"}}))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name, args in (("serve", ["-m", "nms", "serve", "--config", str(work / "nms.yaml")]),
                       ("agent", ["-m", "hostprobe.agent", "--config", str(work / "h1.yaml")])):
        procs.append(subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stderr=subprocess.STDOUT,
                                      stdout=open(work / f"{name}.log", "ab")))
        if name == "serve":
            wait_for(lambda: get(url, "/health") is not None, 60, "nms serve", work / "serve.log")
    sock = work / "h1" / "nccl.sock"
    wait_for(lambda: sock.exists() and (work / "h1" / "status.json").exists(), 60, "the agent's NCCL socket",
             work / "agent.log")
    return url, sock


def get(url: str, path: str):
    import httpx

    r = httpx.get(url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    return r.json() if r.status_code == 200 else None


def agent_stats(work: Path) -> dict:
    return json.loads((work / "h1" / "status.json").read_text())["stats"]


# --- runs of the two ranks ---------------------------------------------------------------------------

def plugin_path(work: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from nccl_plugin import library_path

    try:
        return library_path()
    except FileNotFoundError:
        out = work / "libnms-profiler.so"
        sources = [str(p) for p in sorted((REPO / "nccl_plugin" / "src").glob("*.c"))]
        subprocess.run(["cc", "-O2", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread", "-o",
                        str(out), *sources], check=True)
        return out


def run_ranks(work: Path, tag: str, plugin: Path | None, sock: Path, args, phases: str) -> dict:
    """Both ranks, to the end; {rank: {phase/size: [seconds]}}, and whether NCCL loaded the plugin."""
    port = free_port()
    procs, logs = [], []
    for rank in (0, 1):
        env = {**os.environ, **NCCL_ENV, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_HOSTID": f"fakehost{rank}",
               "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"), "SLURM_JOB_ID": JOB,
               "NMS_NCCL_SOCKET": str(sock)}
        env.pop("NCCL_PROFILER_PLUGIN", None)
        if plugin is not None:
            env["NCCL_PROFILER_PLUGIN"] = str(plugin)
        log = work / f"{tag}-rank{rank}.log"
        logs.append(log)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes", args.sizes, "--iters",
               str(args.iters), "--warmup", str(args.warmup), "--phases", phases]
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + args.rank_timeout
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise TimeoutError(f"{tag}: the ranks ran past {args.rank_timeout} s (logs in {work})") from None
    out: dict = {"loaded": [], "results": {}}
    for rank, (p, log) in enumerate(zip(procs, logs)):
        text = log.read_text()
        if p.returncode != 0:
            raise RuntimeError(f"{tag}: rank {rank} exited {p.returncode}:\n{text[-3000:]}")
        out["loaded"].append("PROFILER/Plugin: Loaded nms" in text)
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        out["results"][rank] = json.loads(line[7:])["results"]
    return out


def per_iteration(results: dict, key: str) -> list[float]:
    """The slower rank's time of each iteration (a collective lasts until its last rank is done)."""
    return [max(pair) for pair in zip(results[0][key], results[1][key])]


# --- the check ---------------------------------------------------------------------------------------

def check(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nms-nccl-real-"))
    summary: dict = {"work_dir": str(work), "checks": {}}
    procs: list = []
    mps = None
    try:
        if args.mps:
            mps_env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(work / "mps"),
                       "CUDA_MPS_LOG_DIRECTORY": str(work / "mpslog")}
            os.environ.update({k: mps_env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")})
            subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True)
            mps = mps_env
        plugin = plugin_path(work)
        url, sock = start_stack(work, procs)
        sizes = [int(s) for s in args.sizes.split(",")]

        # 1-3: the job, its collectives, a slowdown opened by the straggler and cleared after
        before, t0 = agent_stats(work), time.monotonic()
        main = run_ranks(work, "main", plugin, sock, args, f"baseline:0,slow:{args.slow_ms},recover:0")
        wall = time.monotonic() - t0
        summary["plugin_loaded"] = main["loaded"]
        expected = len(sizes) * 3 * args.iters
        colls = wait_for(lambda: (c := get(url, f"/jobs/{JOB}/collectives?limit=10000")) and len(c) >= expected
                         and c, 60, f"{expected} collectives of job {JOB}", work / "agent.log")
        job = get(url, f"/jobs/{JOB}")
        slowdowns = wait_for(lambda: (s := get(url, f"/jobs/{JOB}/slowdowns")) and (s["active"] or s["cleared"])
                             and s, 30, "a slowdown", work / "serve.log")
        # the last second's step stats go out 1-2 s after it (the agent's grace), the stats file every 0.5 s
        wait_for(lambda: agent_stats(work)["nccl_step_stats"] > before.get("nccl_step_stats", 0), 30,
                 "the agent's step stats", work / "agent.log")
        time.sleep(3.0)
        after = agent_stats(work)
        summary["job"] = {"hosts": job["hosts"], "ranks": [(r["rank"], r["host"], r["comm_id"]) for r in job["ranks"]],
                          "labels": job["labels"]}
        summary["collectives"] = {size: {"busbw_gbps_median": statistics.median(
            [c["busbw_gbps"] for c in colls if c["bytes"] == size and not c["slow"]] or [0.0]),
            "slow": sum(c["slow"] for c in colls if c["bytes"] == size)} for size in sizes}
        summary["slowdowns"] = [{k: s[k] for k in ("op", "size_bucket", "ratio", "slow_collectives", "cleared_ns")}
                                for s in slowdowns["active"] + slowdowns["cleared"]]
        delta = {k: after.get(k, 0) - before.get(k, 0)
                 for k in ("nccl_records", "nccl_steps", "nccl_step_stats", "nccl_raw_steps")}
        summary["records_per_rank_per_s"] = {
            "after": delta["nccl_records"] / 2 / wall,
            "before": (delta["nccl_records"] - delta["nccl_step_stats"] + delta["nccl_steps"]) / 2 / wall,
            "steps": delta["nccl_steps"] / 2 / wall, "step_stats": delta["nccl_step_stats"] / 2 / wall,
            "wall_s": wall}
        summary["checks"].update({
            "plugin loaded by both ranks": all(main["loaded"]),
            "job with both ranks": len({r["rank"] for r in job["ranks"]}) == 2
            and job["labels"].get("source") == "nccl",
            "collectives with busbw": all(v["busbw_gbps_median"] > 0 for v in summary["collectives"].values()),
            "slowdown opened": bool(summary["slowdowns"]),
            "steps folded, none raw": delta["nccl_step_stats"] > 0 and delta["nccl_raw_steps"] == 0})

        # 4: the plugin's cost, runs with and without it interleaved
        timing: dict[str, dict[int, list[float]]] = {"with": {s: [] for s in sizes}, "without": {s: [] for s in sizes}}
        for round_ in range(args.rounds):
            for mode in (("with", "without") if round_ % 2 == 0 else ("without", "with")):
                run = run_ranks(work, f"cost{round_}-{mode}", plugin if mode == "with" else None, sock, args,
                                "timed:0")
                for size in sizes:
                    timing[mode][size] += per_iteration(run["results"], f"timed/{size}")
        summary["plugin_cost"] = {size: {
            "with_us": statistics.median(timing["with"][size]) * 1e6,
            "without_us": statistics.median(timing["without"][size]) * 1e6,
            "ratio": statistics.median(timing["with"][size]) / statistics.median(timing["without"][size])}
            for size in sizes}
        summary["ok"] = all(summary["checks"].values())
        return summary
    finally:
        for p in reversed(procs):  # the agent first, so that it hands its last reports to a live service
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        if mps is not None:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4096,262144,4194304", help="all-reduce sizes in bytes, comma-separated")
    parser.add_argument("--iters", type=int, default=30, help="all-reduces per size and phase")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--slow-ms", type=float, default=20.0, help="rank 1's sleep before each slow-phase call")
    parser.add_argument("--rounds", type=int, default=4, help="with/without-plugin runs each, interleaved")
    parser.add_argument("--rank-timeout", type=float, default=240.0, help="seconds one run of the ranks may take")
    parser.add_argument("--mps", action="store_true", help="run under CUDA MPS (both ranks on the GPU at once)")
    parser.add_argument("--out", help="directory for nccl_real.json (default: $OUT when set)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phases", default="timed:0", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        phases = [(name, float(ms)) for name, ms in (p.split(":") for p in args.phases.split(","))]
        worker([int(s) for s in args.sizes.split(",")], args.iters, args.warmup, phases)
        return 0
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
    except Exception as e:  # noqa: BLE001 - any reason it cannot run is said the same way
        print(f"nccl_real: cannot run here: {e}", file=sys.stderr)
        return 2
    if shutil.which("cc") is None:
        print("nccl_real: note: no C compiler; the plugin must be built already", file=sys.stderr)
    summary = check(args)
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    out = args.out or os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "nccl_real.json").write_text(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
