"""Dashboard pages at scale, and how fast a change reaches an open page.

    python bench/dashboard.py [--nodes 1000] [--active 10000] [--historical 1000000] [--runs 40]

Part 1, pages at scale: a real head (SQLite, its real ASGI app under uvicorn, real HTTP,
one scheduling cycle run) whose state is synthetic: `--nodes` nodes × 8 GPUs with a
telemetry reading each, `--active` live jobs (one running 8-GPU job per node, the rest
queued) and `--historical` ended jobs in the database. Each page is fetched `--runs` times
by a signed-in admin (and the ended-jobs page by a plain user too, whose visibility filter
runs in SQL): p50 / p95 milliseconds and bytes. Baseline, side by side: what a dashboard
that filters in the browser (the Ray dashboard's way) fetches for the same view: the REST
API's whole live-job list (`GET /v1/jobs?active=true`) and whole node list (`GET
/v1/nodes`); the ratios are baseline / dashboard.

Part 2, change → visible: a real local cluster (head + 2 agents with fake GPUs, processes);
an open jobs page's SSE stream (`/ui/live/jobs`) while jobs are submitted one at a time
through the API; the time from the submit's answer to the fragment naming the job, p50 /
p95 (target ≤ 1 s). Baseline: a browser that polls every 4 s (the Ray dashboard's period)
sees a change after 2 s on average, 3.8 s at p95.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

from phalanx.api.models import GpuInfo, GpuTelemetry, JobSpec, TeamSpec
from phalanx.core import JobState, NodeState
from phalanx.head import auth, db, store
from phalanx.head.app import create_app
from phalanx.head.mirror import Settings
from phalanx.head.records import JobRecord, NodeRecord
from phalanx.head.server import ADMIN_TOKEN_FILE, build
from phalanx.head.server import _tune_gc as tune_gc
from phalanx.head.service import Head
from phalanx.local.cluster import LocalCluster

GPUS = 8
TEAMS = 10
USERS = 100


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _spec(i: int) -> JobSpec:
    return JobSpec(
        command=["python", "train.py"], workdir=f"/home/u{i % USERS}", gpus_per_node=GPUS
    )


def _record(i: int, state: JobState, now: float) -> JobRecord:
    return JobRecord(
        id=i,
        name=f"train-{i}",
        user=f"u{i % USERS}",
        team=f"t{i % USERS % TEAMS}",
        account=None,
        qos="normal",
        priority=100,
        state=state,
        spec=_spec(i),
        submit_time=now - 3600,
        start_time=None if state is JobState.PENDING else now - 1800,
        end_time=now - 60 if state.terminal else None,
        exit_code="0:0" if state.terminal else None,
    )


def populate(
    head: Head, nodes: int, active: int, historical: int, first_live_id: int | None = None
) -> None:
    """Synthetic state: nodes with readings in the mirror, live jobs in the mirror (the
    running ones placed; ids from `first_live_id`, default after the ended ones), ended
    jobs in the database."""
    first = historical + 1 if first_live_id is None else first_live_id
    now = time.time()
    rng = random.Random(1)
    spec_json = _spec(0).model_dump_json()
    batch = 50_000
    with head.control.engine.begin() as conn:
        for start in range(0, historical, batch):
            rows = []
            for i in range(start + 1, min(historical, start + batch) + 1):
                rec = _record(i, JobState.COMPLETED if i % 7 else JobState.FAILED, now)
                row = rec.row()
                row["spec_json"] = spec_json
                rows.append(row)
            store.insert_rows(conn, db.jobs, rows)
    mirror = head.mirror
    with head.control.lock:
        for n in range(nodes):
            name = f"gpu{n:04d}"
            mirror.nodes[name] = NodeRecord(
                name=name,
                address=f"10.{n // 250}.{n % 250}.1",
                agent_url=f"https://10.{n // 250}.{n % 250}.1:8266",
                agent_secret="x" * 32,
                cpus=128,
                memory_mb=2_000_000,
                gpus=[
                    GpuInfo(index=g, uuid=f"GPU-{n}-{g}", model="H100", memory_mb=81559)
                    for g in range(GPUS)
                ],
                labels={"rack": f"r{n // 32}"},
                state=NodeState.UP,
                last_heartbeat=now,
                heard_at=now,
            )
            readings = [
                GpuTelemetry(
                    index=g, utilization_pct=rng.choice([0.0, 35.0, 97.0]), memory_used_mb=40_000
                )
                for g in range(GPUS)
            ]
            head.samples.record(name, readings, now)
        for k in range(active):
            job_id = first + k
            running = k < nodes
            rec = _record(job_id, JobState.RUNNING if running else JobState.PENDING, now)
            if running:
                node = f"gpu{k:04d}"
                rec.placement = [(node, list(range(GPUS)))]
                mirror.node_jobs.setdefault(node, set()).add(job_id)
            rec.in_core = True  # queued (and running) jobs are in the scheduler's state
            mirror.jobs[job_id] = rec
        mirror.next_job_id = first + active
        mirror.core_dirty = True
    # One scheduling cycle (the control thread is not started: this thread runs it), so the
    # queue page walks the scheduler's real order and shows its reasons and reservation.
    head.control.run_now()


def plain_user(head: Head) -> str:
    """A user of team t7 with an API token (sees ~1/10 of the jobs)."""
    now = time.time()
    token = auth.new_token("api")
    with head.control.engine.begin() as conn:
        store.put_team(conn, TeamSpec(name="t7"), now)
        store.add_user(conn, "u7", False, ["t7"], [], "t7", now)
        store.add_token(conn, auth.token_hash(token), "api", "u7", None, "bench", now)
    return token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def timed(client: httpx.Client, path: str, runs: int) -> dict[str, float]:
    """p50/p95 ms of `runs` GETs; `bytes` as sent (gzipped where the head gzips), and
    `html_bytes` as the browser gets it."""
    times, size, wire = [], 0, 0
    client.get(path)  # warm
    for _ in range(runs):
        t0 = time.perf_counter()
        r = client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        size, wire = len(r.content), r.num_bytes_downloaded
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(percentile(times, 0.95), 1),
        "bytes": wire,
        "html_bytes": size,
    }


@contextmanager
def signed_in(url: str, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as client:
        r = client.post("/ui/login", data={"token": token})
        assert r.status_code == 303, r.text
        yield client


def pages(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "head"
        state.mkdir(mode=0o700)
        head = build(state, None, Settings())
        t0 = time.perf_counter()
        populate(head, args.nodes, args.active, args.historical)
        setup_s = time.perf_counter() - t0
        tune_gc()  # as `phalanx head` does once its state is loaded
        admin = (state / ADMIN_TOKEN_FILE).read_text().strip()
        user = plain_user(head)
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(head), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        try:
            with signed_in(url, admin) as a, signed_in(url, user) as u:
                deep = args.historical // 2
                ours = {
                    "jobs_live_page": timed(a, "/ui/jobs", args.runs),
                    "jobs_ended_page": timed(a, "/ui/jobs?scope=ended", args.runs),
                    "jobs_ended_deep_page": timed(
                        a, f"/ui/jobs?scope=ended&before={deep}", args.runs
                    ),
                    "jobs_ended_filtered": timed(
                        a, "/ui/jobs?scope=ended&user=u42&state=F", args.runs
                    ),
                    "jobs_ended_plain_user": timed(u, "/ui/jobs?scope=ended", args.runs),
                    "queue_page": timed(a, "/ui/queue", args.runs),
                    "gpu_grid_all": timed(a, "/ui/nodes?per=1000", args.runs),
                    "overview": timed(a, "/ui/", args.runs),
                }
                api = {"Authorization": f"Bearer {admin}"}
                with httpx.Client(base_url=url, timeout=120, headers=api) as b:
                    baseline = {
                        "api_all_live_jobs": timed(
                            b, "/v1/jobs?active=true", max(5, args.runs // 4)
                        ),
                        "api_all_nodes": timed(b, "/v1/nodes", max(5, args.runs // 4)),
                    }
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    jobs, grid = ours["jobs_live_page"], ours["gpu_grid_all"]
    return {
        "setup_s": round(setup_s, 1),
        "dashboard": ours,
        "baseline": baseline,
        "ratio_jobs_bytes": round(baseline["api_all_live_jobs"]["bytes"] / jobs["bytes"], 1),
        "ratio_jobs_p95": round(baseline["api_all_live_jobs"]["p95_ms"] / jobs["p95_ms"], 1),
        "ratio_grid_p95": round(baseline["api_all_nodes"]["p95_ms"] / grid["p95_ms"], 2),
        "targets": {
            "jobs_page_p95_le_150ms": jobs["p95_ms"] <= 150
            and ours["jobs_ended_page"]["p95_ms"] <= 150,
            "jobs_page_le_150kB": jobs["bytes"] <= 150_000,
            "gpu_grid_8000_p95_le_200ms": grid["p95_ms"] <= 200,
        },
    }


def live(runs: int) -> dict[str, object]:
    """Submit → the job's row in an open jobs page's SSE stream."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), nodes=2, gpus_per_node=2, tls=False) as c,
    ):
        token = c.admin_token
        seen: queue.Queue[tuple[str, float]] = queue.Queue()
        stop = threading.Event()

        def follow() -> None:
            try:
                with (
                    signed_in(c.url, token) as client,
                    client.stream("GET", "/ui/live/jobs?per=20", timeout=None) as s,
                ):
                    buf: list[str] = []
                    for line in s.iter_lines():
                        if stop.is_set():
                            return
                        if line.startswith("data: "):
                            buf.append(line[6:])
                        elif line == "" and buf:
                            seen.put(("\n".join(buf), time.perf_counter()))
                            buf = []
            except httpx.HTTPError:
                if not stop.is_set():  # the cluster stopping ends the stream; else a failure
                    raise

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        seen.get(timeout=30)  # the first fragment: the page as it is
        delays = []
        with c.client() as api:
            for i in range(runs):
                spec = JobSpec(
                    command=["sleep", "600"], workdir=tmp, name=f"live-{i}", gpus_per_node=1
                )
                job_id = api.submit(spec).job_ids[0]
                t0 = time.perf_counter()
                while True:
                    html, at = seen.get(timeout=30)
                    if f'id="job-{job_id}"' in html:
                        delays.append(max(0.0, at - t0) * 1000)
                        break
                api.cancel(job_id)
                time.sleep(0.3)
        stop.set()
    return {
        "runs": len(delays),
        "change_to_page_p50_ms": round(statistics.median(delays), 1),
        "change_to_page_p95_ms": round(percentile(delays, 0.95), 1),
        "baseline_poll_4s_p50_ms": 2000.0,
        "baseline_poll_4s_p95_ms": 3800.0,
        "ratio_p95": round(3800.0 / max(1.0, percentile(delays, 0.95)), 1),
        "target_p95_le_1s": percentile(delays, 0.95) <= 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--active", type=int, default=10_000)
    p.add_argument("--historical", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--live-runs", type=int, default=20)
    p.add_argument("--no-live", action="store_true", help="skip part 2 (the local cluster)")
    args = p.parse_args()
    out: dict[str, object] = {
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "active_jobs": args.active,
        "historical_jobs": args.historical,
        "pages": pages(args),
    }
    if not args.no_live:
        out["live"] = live(args.live_runs)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
