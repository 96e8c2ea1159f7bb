"""The SLO autoscaler live, through a 3× step in load and back (bench/serve_autoscale_sim.py
on real parts): a local cluster (fake GPUs), real llama-server replicas of SmolLM2-135M,
the real router (`phalanx serve router`, with `--autoscale` for the autoscaled pool), and
the bench client sending Poisson traffic: `--low` req/s for `--seconds`, 3× that for as
long, then `--low` again.

Side by side in one invocation, over the same requests (same seed), one after the other on
the same cluster: a deployment autoscaled within [--low-replicas, --high-replicas], one
fixed at --low-replicas and one fixed at --high-replicas. For each: SLO attainment (a
request is good when it succeeded with TTFT <= --ttft-ms and TPOT <= --tpot-ms; a failed
one counts as missed) over the whole run and per phase, replica-seconds (running replica
jobs, sampled from the head every 0.5 s), and for the autoscaled pool its decisions (the
head's event log). Ratios: attainment and replica-seconds of the autoscaled pool against
the fixed-high one. Prints one JSON object, with the host's CPU steal and load average.

    .venv/bin/python bench/serve_autoscale.py          # ~9 minutes with the defaults

The defaults are sized for a 2-core machine: one-slot replicas (`-np 1 -t 1`), so one
replica serves one request at a time; 16-token prompts, 12-token answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from phalanx.api.models import TeamSpec, UserCreate
from phalanx.api.serving import SLO, DeploymentSpec, PoolSpec
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.local.cluster import free_port
from phalanx.serve.bench import BenchConfig, Goodput, WorkloadSpec, build, run_async
from phalanx.serve.bench.metrics import RequestRecord
from phalanx.testing import engines

T = TypeVar("T")


def steal() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().split("\n")[0].split()
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def good(r: RequestRecord, ttft_ms: float, tpot_ms: float) -> bool:
    if not (r.success and r.chunk_times):
        return False
    n = r.output_len
    tpot = (r.latency - r.ttft) / (n - 1) if n > 1 else 0.0
    return r.ttft * 1000 <= ttft_ms and tpot * 1000 <= tpot_ms


def requests(args: argparse.Namespace) -> tuple[list[Any], list[int]]:
    """The phases' requests (Poisson within each), and where each phase starts."""
    out: list[Any] = []
    starts = []
    offset = 0.0
    for i, rate in enumerate((args.low, 3 * args.low, args.low)):
        num = max(1, round(rate * args.seconds))
        spec = WorkloadSpec(
            name="random", num=num, seed=args.seed + i, rate=rate,
            input_len=args.input_len, output_len=args.output_len,
        )  # fmt: skip
        starts.append(len(out))
        out.extend(replace(r, arrival_s=offset + r.arrival_s) for r in build(spec))
        offset += args.seconds
    return out, starts


def start_router(
    cluster: LocalCluster, name: str, token_file: Path, logs: Path, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    assert cluster.ca_file is not None
    argv = [
        sys.executable, "-m", "phalanx.cli.main", "serve", "router",
        "--listen", f"127.0.0.1:{port}", "--head", cluster.url, "--deployment", name,
        "--token-file", str(token_file), "--ca-file", str(cluster.ca_file),
        "--policy", "least-load", *extra,
    ]  # fmt: skip
    log = (logs / f"router-{name}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the router exited: see {log.name}")
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for("the router", healthy, 60)
    return proc, url


def one_pool(
    cluster: LocalCluster,
    serve: ServeClient,
    token: str,
    token_file: Path,
    logs: Path,
    args: argparse.Namespace,
    name: str,
    pool: PoolSpec,
    extra: list[str],
) -> dict[str, Any]:
    spec = DeploymentSpec(
        name=name, engine="llama.cpp", model=str(engines.smollm2()),
        engine_path=str(engines.llama_server()), pools=[pool],
    )  # fmt: skip
    serve.apply(spec)
    wait_for(
        f"{name}'s replicas", lambda: len(serve.endpoints(name).endpoints) == pool.replicas, 180
    )
    router, url = start_router(cluster, name, token_file, logs, extra)
    samples: list[tuple[float, int, int]] = []  # (time, running replica jobs, desired)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                info = serve.get(name)
            except Exception:  # a sample missed: the next one counts
                pass
            else:
                running = sum(1 for r in info.replicas if r.state == "R")
                samples.append((time.monotonic(), running, info.pools[0].desired))
            stop.wait(0.5)

    reqs, starts = requests(args)
    config = BenchConfig(
        url=url, model=name, token=token,
        slo=Goodput(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms), timeout_s=300,
    )  # fmt: skip
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        result = asyncio.run(run_async(config, reqs))
    finally:
        end = time.monotonic()
        stop.set()
        sampler.join()
        router.terminate()
        router.wait(timeout=30)
        serve.delete(name)
    records = result.records
    phases = {}
    bounds = [*starts, len(records)]
    for label, a, b in zip(("low", "high", "low_again"), bounds, bounds[1:], strict=False):
        part = records[a:b]
        phases[label] = {
            "requests": len(part),
            "attainment": round(sum(good(r, args.ttft_ms, args.tpot_ms) for r in part)
                                / max(1, len(part)), 4),
            "ttft_p90_ms": round(_pct([r.ttft * 1000 for r in part if r.success], 90), 1),
        }  # fmt: skip
    replica_s = 0.0
    for (t_a, n, _), (t_b, _, _) in zip(samples, [*samples[1:], (end, 0, 0)], strict=False):
        replica_s += (min(t_b, end) - max(t_a, t0)) * n if t_b > t0 else 0.0
    m = result.metrics
    return {
        "attainment": round(
            sum(good(r, args.ttft_ms, args.tpot_ms) for r in records) / len(records), 4
        ),
        "phases": phases,
        "failed": m.failed,
        "ttft_mean_ms": round(m.ttft_ms.mean, 1),
        "ttft_p99_ms": round(m.ttft_ms.p99, 1),
        "tpot_mean_ms": round(m.tpot_ms.mean, 1),
        "replica_seconds": round(replica_s, 1),
        "run_s": round(end - t0, 1),
        "replicas_max": max((n for _, n, _ in samples), default=0),
        "desired_path": _path([d for _, _, d in samples]),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def _path(values: list[int]) -> list[int]:
    out: list[int] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--low", type=float, default=2.0, help="req/s before and after the step")
    ap.add_argument("--seconds", type=float, default=60.0, help="each phase's length")
    ap.add_argument("--ttft-ms", type=float, default=600.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=12)
    ap.add_argument("--slots", type=int, default=1, help="slots per replica (-np)")
    ap.add_argument("--low-replicas", type=int, default=1)
    ap.add_argument("--high-replicas", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("autoscaled", "fixed_low", "fixed_high"), action="append")
    args = ap.parse_args()
    random.seed(args.seed)
    s0, t0 = steal()
    wall = time.perf_counter()
    slo = SLO(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, attainment=0.9)
    engine_args = ["-t", "1", "-c", "1024"]
    base = PoolSpec(slots=args.slots, args=engine_args, slo=slo)
    # The policy's defaults compressed to the benchmark's minute-long phases.
    auto_flags = [
        "--autoscale", "--autoscale-interval", "0.5", "--autoscale-window", "5",
        "--autoscale-up-cooldown", "2", "--autoscale-miss-cooldown", "5",
        "--autoscale-down-cooldown", "10", "--autoscale-down-stable", "8",
    ]  # fmt: skip
    pools = {
        "autoscaled": (
            replace_pool(base, args.low_replicas, args.low_replicas, args.high_replicas),
            auto_flags,
        ),
        "fixed_low": (replace_pool(base, args.low_replicas), []),
        "fixed_high": (replace_pool(base, args.high_replicas), []),
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="serve-autoscale-") as state:
        logs = Path(state) / "logs"
        logs.mkdir()
        with LocalCluster(Path(state) / "cluster", nodes=1, gpus_per_node=8) as cluster:
            admin = cluster.client()
            admin.set_team(TeamSpec(name="bench"))
            admin.create_user(UserCreate(name="bench", teams=["bench"], default_team="bench"))
            token = admin.create_token("bench").token
            token_file = Path(state) / "token"
            token_file.write_text(token)
            serve = ServeClient(cluster.client(token))
            for label, (pool, extra) in pools.items():
                if args.only and label not in args.only:
                    continue
                name = label.replace("_", "-")
                out[label] = one_pool(
                    cluster, serve, token, token_file, logs, args, name, pool, extra
                )
                print(f"{label}: {json.dumps(out[label])}", file=sys.stderr, flush=True)
            if "autoscaled" in out:
                out["autoscaled"]["decisions"] = decisions(cluster.head_dir / "phalanx.db")
    s1, t1 = steal()
    result: dict[str, Any] = {
        "bench": "serve_autoscale",
        "model": f"SmolLM2-135M-Instruct Q4_1 (llama-server -t 1 -np {args.slots})",
        "phases": {"low_rps": args.low, "high_rps": 3 * args.low, "seconds_each": args.seconds},
        "slo": {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms, "target_attainment": 0.9},
        "pools": out,
        "steal_pct": round(100 * (s1 - s0) / max(1, t1 - t0), 2),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - wall, 1),
    }
    if "autoscaled" in out and "fixed_high" in out:
        a, h = out["autoscaled"], out["fixed_high"]
        result["ratio_attainment_autoscaled_vs_fixed_high"] = round(
            a["attainment"] / max(1e-9, h["attainment"]), 3
        )
        result["ratio_replica_seconds_autoscaled_vs_fixed_high"] = round(
            a["replica_seconds"] / max(1e-9, h["replica_seconds"]), 3
        )
    print(json.dumps(result))


def replace_pool(
    base: PoolSpec, replicas: int, lo: int | None = None, hi: int | None = None
) -> PoolSpec:
    return base.model_copy(update={"replicas": replicas, "min_replicas": lo, "max_replicas": hi})


def decisions(db_path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT message FROM events WHERE kind = 'serve' AND message LIKE "
            "'deployment autoscaled pool %scaled % by autoscaler%' ORDER BY id"
        )
        return [str(r[0]) for r in rows]
    finally:
        db.close()


if __name__ == "__main__":
    main()
