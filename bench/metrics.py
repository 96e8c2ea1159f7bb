"""Prometheus scrapes at scale: the head's `/metrics` and the full per-GPU scrape.

    python bench/metrics.py [--nodes 1000] [--gpus 8] [--jobs 10000] [--scrapes 30]

A real head (its control thread, SQLite store and HTTP API under uvicorn, in this process)
holding `--nodes` nodes × `--gpus` GPUs, each node with a fresh reading of every GPU (as its
heartbeat leaves them), and `--jobs` live jobs of one GPU each: as many running as there
are GPUs (~7/8 of them), the rest pending. Over real HTTP from another process (as
Prometheus scrapes), with an admin token:
- `GET /metrics` (counters, histograms and the gauges computed from the mirror per scrape);
- `GET /v1/metrics/gpus`: every GPU, and one of 4 shards (`?shard=0&of=4`);
- `GET /v1/nodes`, the JSON listing of the same nodes and readings, for scale.
Baseline side by side: the same scrapes of an idle head (no node, no job) in the same run.
Prints one JSON object: p50/p95 milliseconds and bytes per endpoint, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from phalanx.api.models import GpuInfo, GpuTelemetry, JobSpec, RegisterRequest
from phalanx.head import db, jobs, nodestates
from phalanx.head.app import create_app
from phalanx.head.auth import Principal
from phalanx.head.control import ControlThread
from phalanx.head.mirror import Settings, Tx
from phalanx.head.server import _take_over, _tune_gc
from phalanx.head.service import Head

ADMIN = Principal(kind="api", token_id=0, user="admin", admin=True, teams=frozenset({"default"}))
# Nothing times out while the bench runs: no heartbeats arrive, no rank reports.
SETTINGS = Settings(lease_s=86400.0, hang_timeout_s=0.0, max_queued_per_user=0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def start_head(state_dir: Path) -> tuple[Head, uvicorn.Server, str]:
    head = Head(ControlThread(db.make_engine(db.default_url(state_dir)), SETTINGS))
    _take_over(head, state_dir)
    head.control.start()
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(head), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return head, server, f"http://127.0.0.1:{port}"


def populate(head: Head, nodes: int, gpus: int, count: int) -> dict[str, int]:
    """Register the nodes, give each a reading of every GPU, submit `count` 1-GPU jobs."""
    for n in range(nodes):
        name = f"gpu-{n:04d}"
        req = RegisterRequest(
            name=name,
            address=f"10.{n // 250}.{n % 250}.1",
            agent_url=f"https://10.{n // 250}.{n % 250}.1:9000",
            agent_secret="s" * 32,
            cpus=128,
            memory_mb=1_048_576,
            gpus=[
                GpuInfo(index=i, uuid=f"GPU-{n:04d}-{i}", model="H100", memory_mb=81559)
                for i in range(gpus)
            ],
            labels={"rack": f"r{n // 32}"},
        )

        def join(tx: Tx, r: RegisterRequest = req) -> None:
            nodestates.register(head.mirror, tx, r, tx.now)

        head.control.call(join)
    spec = JobSpec(command=["train"], workdir="/work", gpus_per_node=1)
    left = count
    while left:
        batch = min(left, 1000)

        def op(tx: Tx, n: int = batch) -> None:
            for _ in range(n):
                jobs.submit(head.mirror, tx, ADMIN, spec)

        head.control.call(op)
        left -= batch
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the scheduler starts what fits
        with head.control.lock:
            running = sum(1 for r in head.mirror.jobs.values() if r.state.holds_gpus)
        if running >= min(count, nodes * gpus):
            break
        time.sleep(0.2)
    now = head.now()
    for n in range(nodes):
        readings = [
            GpuTelemetry(
                index=i,
                utilization_pct=float((n * 7 + i * 13) % 101),
                memory_used_mb=40_000 + i,
                temperature_c=55.0 + i,
                power_w=400.0 + i,
            )
            for i in range(gpus)
        ]
        head.samples.record(f"gpu-{n:04d}", readings, now)
    with head.control.lock:
        states: dict[str, int] = {}
        for r in head.mirror.jobs.values():
            states[r.state.value] = states.get(r.state.value, 0) + 1
    return states


SCRAPER = """
import json, sys, time, httpx
url, token, path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
times, size = [], 0
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}) as c:
    c.get(path).raise_for_status()
    for _ in range(n):
        began = time.perf_counter()
        r = c.get(path)
        times.append((time.perf_counter() - began) * 1000)
        r.raise_for_status()
        size = len(r.content)
print(json.dumps({"times": times, "size": size}))
"""


def measure(url: str, token: str, path: str, scrapes: int) -> dict[str, Any]:
    """`scrapes` sequential GETs from another process, as Prometheus scrapes: the client's
    reading and parsing does not share the head's interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", SCRAPER, url, token, path, str(scrapes)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result = json.loads(done.stdout)
    times = result["times"]
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(percentile(times, 0.95), 2),
        "bytes": result["size"],
    }


PATHS = {
    "metrics": "/metrics",
    "gpus_all": "/v1/metrics/gpus",
    "gpus_shard_1_of_4": "/v1/metrics/gpus?shard=0&of=4",
    "nodes_json": "/v1/nodes",
}


def run(nodes: int, gpus: int, count: int, scrapes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, (n, c) in (("idle", (0, 0)), ("loaded", (nodes, count))):
        with tempfile.TemporaryDirectory(prefix=f"bench-metrics-{label}-") as tmp:
            state = Path(tmp)
            head, server, url = start_head(state)
            try:
                began = time.monotonic()
                states = populate(head, n, gpus, c)
                _tune_gc()  # as `phalanx head` does once it has loaded (head/server.py)
                token = (state / "admin.token").read_text().strip()
                out[label] = {
                    "nodes": n,
                    "gpus": n * gpus,
                    "jobs_by_state": states,
                    "setup_s": round(time.monotonic() - began, 1),
                    **{k: measure(url, token, p, scrapes) for k, p in PATHS.items()},
                }
            finally:
                server.should_exit = True
                head.control.stop()
    loaded, idle = out["loaded"], out["idle"]
    out["ratio_loaded_to_idle_p50"] = {
        k: round(loaded[k]["p50_ms"] / max(idle[k]["p50_ms"], 1e-6), 1) for k in PATHS
    }
    out["targets"] = {
        "metrics_p95_ms_le_50": loaded["metrics"]["p95_ms"] <= 50,
        "gpus_all_p95_ms_le_100": loaded["gpus_all"]["p95_ms"] <= 100,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(run(args.nodes, args.gpus, args.jobs, args.scrapes), indent=2))


if __name__ == "__main__":
    main()
