"""The observability scale test, on one head: pages, scrapes and reports while telemetry flows.

    python bench/observability.py [--nodes 1000] [--active 10000] [--historical 1000000]
                                  [--runs 30] [--warm-s 30]

One real head (SQLite; its real ASGI app under uvicorn, real HTTP) holding:
- `--historical` ended jobs over a year, with their state moves in the event log
  (bench/accounting.py's generator: 3 % preempted and requeued, 10 % failed), and the
  accounting rollup back-filled from them as a head upgraded onto that database does;
- `--nodes` nodes × 8 GPUs and `--active` live jobs (one running 8-GPU job per node, the
  rest queued; bench/dashboard.py's generator), after one scheduling cycle;
- telemetry for every node every 10 s (8 GPUs, half held busy, half idle), parsed from JSON
  as `POST /v1/telemetry` gets it and handed to the head's store, whose thread ingests it
  and feeds idle detection, accounting and the overview's chart.

Measured twice, side by side: with the telemetry flowing (after `--warm-s` of it) and with
none (the baseline), so what ingest costs the pages shows: the dashboard's jobs pages (live,
ended), the GPU grid of every GPU, the overview, the head's /metrics, the full per-GPU
scrape, and a year's usage report by team per month and by user per day; and the ingest's
own CPU (the store's thread + the JSON parsing) as % of one core. Beside them, the REST
API's whole lists (what a browser-side dashboard fetches) and the naive GROUP BY over the
jobs table (what accounting without a rollup runs). Change → visible in an open page is
bench/dashboard.py's part 2 (a real cluster); storage per GPU per day and submits/s with
ingest on vs off are bench/telemetry.py's. Prints one JSON object with the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import accounting  # bench/accounting.py
import dashboard  # bench/dashboard.py
import httpx
import sqlalchemy as sa
import uvicorn

from phalanx.api.models import GpuTelemetry
from phalanx.api.telemetry import TelemetryBatch
from phalanx.head.app import create_app
from phalanx.head.mirror import Settings
from phalanx.head.server import ADMIN_TOKEN_FILE, build
from phalanx.head.server import _tune_gc as tune_gc
from phalanx.head.service import Head

GPUS = dashboard.GPUS
TICK = os.sysconf("SC_CLK_TCK")


def bodies(head: Head, t: float) -> list[bytes]:
    """One `POST /v1/telemetry` body per node: a sample of its 8 GPUs at `t`, the first half
    held busy by the job running there (if any), the rest idle."""
    out = []
    with head.control.lock:
        nodes = sorted(head.mirror.nodes)
        holder = {n: min(head.mirror.node_jobs.get(n, {0})) for n in nodes}
    half = GPUS // 2
    for k, name in enumerate(nodes):
        job = holder[name] or None
        util = [93.0 + (k * 7 + g) % 5 if g < half else 0.0 for g in range(GPUS)]
        body = {
            "node": name,
            "sent_at": t,
            "gpus": list(range(GPUS)),
            "times": [t],
            "utilization_pct": util,
            "memory_used_mb": [60_000 if g < half else 0 for g in range(GPUS)],
            "power_w": [650.0 if g < half else 65.0 for g in range(GPUS)],
            "temperature_c": [70.0 if g < half else 32.0 for g in range(GPUS)],
            "energy_j": [1e6 + 650.0 * t for _ in range(GPUS)],
            "job_id": [job] * GPUS,
            "epoch": [1 if job is not None else None for _ in range(GPUS)],
        }
        out.append(json.dumps(body).encode())
    return out


class Feeder:
    """Every node's telemetry every 10 s, parsed and handed to the store; the parse time
    is summed (the head's HTTP work per batch, besides the store's thread)."""

    def __init__(self, head: Head) -> None:
        self.head = head
        self.stop = threading.Event()
        self.parse_s = 0.0
        self.batches = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        latest: dict[str, list[GpuTelemetry]] = {}
        while not self.stop.is_set():
            began = time.time()
            for body in bodies(self.head, began):
                t0 = time.thread_time()
                batch = TelemetryBatch.model_validate_json(body)
                self.parse_s += time.thread_time() - t0
                self.head.tsdb.submit(batch)
                self.batches += 1
                # What each node's heartbeat carries besides (its latest reading, which the
                # pages and scrapes show): not part of the ingest's cost.
                gpus = latest.get(batch.node)
                if gpus is None:
                    gpus = latest[batch.node] = [
                        GpuTelemetry(
                            index=g,
                            utilization_pct=batch.utilization_pct[k],
                            memory_used_mb=batch.memory_used_mb[k],
                            temperature_c=batch.temperature_c[k],
                            power_w=batch.power_w[k],
                            energy_j=batch.energy_j[k],
                        )
                        for k, g in enumerate(batch.gpus)
                    ]
                self.head.samples.observe(batch.node, gpus, began)
            self.stop.wait(max(0.0, 10.0 - (time.time() - began)))


def thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's thread named `name` (its utime + stime)."""
    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1]
            parts = fields.split()
            return (int(parts[11]) + int(parts[12])) / TICK
    return 0.0


def steal_pct(seconds: float) -> float:
    """The share of CPU time the host took away over `seconds` (/proc/stat's steal)."""

    def read() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(values), values[7]

    (t0, s0) = read()
    time.sleep(seconds)
    (t1, s1) = read()
    return round(100.0 * (s1 - s0) / max(1, t1 - t0), 1)


def measure(url: str, admin: str, runs: int) -> dict[str, Any]:
    api = {"Authorization": f"Bearer {admin}"}
    year = "since=2025-01-01&until=2026-01-01"
    out: dict[str, Any] = {}
    with dashboard.signed_in(url, admin) as web:
        out["jobs_live_page"] = dashboard.timed(web, "/ui/jobs", runs)
        out["jobs_ended_page"] = dashboard.timed(web, "/ui/jobs?scope=ended", runs)
        out["gpu_grid_all"] = dashboard.timed(web, "/ui/nodes?per=1000", runs)
        out["overview"] = dashboard.timed(web, "/ui/", runs)
    with httpx.Client(base_url=url, timeout=120, headers=api) as client:
        out["head_metrics"] = dashboard.timed(client, "/metrics", runs)
        out["per_gpu_scrape_all"] = dashboard.timed(client, "/v1/metrics/gpus", runs)
        few = max(3, runs // 6)
        out["report_team_per_month"] = dashboard.timed(
            client, f"/v1/reports/usage?by=team&per=month&{year}", few
        )
        out["report_user_per_day"] = dashboard.timed(
            client, f"/v1/reports/usage?by=user&per=day&{year}", few
        )
    return out


def baselines(url: str, admin: str, engine: sa.Engine, runs: int) -> dict[str, Any]:
    api = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, timeout=120, headers=api) as client:
        out: dict[str, Any] = {
            "api_all_live_jobs": dashboard.timed(client, "/v1/jobs?active=true", runs),
            "api_all_nodes": dashboard.timed(client, "/v1/nodes", runs),
        }
    for per, sql in (("month", accounting.BASELINE_MONTH), ("day", accounting.BASELINE_DAY)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            with engine.connect() as conn:
                conn.execute(
                    sa.text(sql),
                    {"a": accounting.YEAR_START, "b": accounting.YEAR_START + accounting.YEAR_S},
                ).all()
            times.append((time.perf_counter() - t0) * 1000)
        out[f"naive_group_by_per_{per}"] = {"p50_ms": round(statistics.median(times), 1)}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "head"
        state.mkdir(mode=0o700)
        head = build(state, None, Settings())
        engine = head.control.engine
        t0 = time.perf_counter()
        made = accounting.populate(engine, args.historical, users=200, teams=20)
        history_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dashboard.populate(head, args.nodes, args.active, 0, first_live_id=args.historical + 1)
        live_s = time.perf_counter() - t0
        # The head's accounting back-fills its rollup from the event log, as on a database
        # it was upgraded onto; the year's utilisation sums come from the generator.
        t0 = time.perf_counter()
        head.usage.load()
        head.usage.rollup.flush(accounting.YEAR_START + accounting.YEAR_S, made["sums"])
        backfill_s = time.perf_counter() - t0
        tune_gc()
        admin = (state / ADMIN_TOKEN_FILE).read_text().strip()
        port = dashboard.free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(head), host="127.0.0.1", port=port, log_level="warning")
        )
        serving = threading.Thread(target=server.run, daemon=True)
        serving.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        head.tsdb.start()
        feeder = Feeder(head)
        try:
            quiet = measure(url, admin, args.runs)
            base = baselines(url, admin, engine, max(5, args.runs // 4))
            feeder.thread.start()
            time.sleep(args.warm_s)
            cpu0, parse0, wall0 = thread_cpu_s("telemetry"), feeder.parse_s, time.monotonic()
            flowing = measure(url, admin, args.runs)
            # Whole 10 s rounds of ingest in the window (at least 30 s), the pages' load in it.
            rest = 30.0 - (time.monotonic() - wall0)
            steal = steal_pct(max(1.0, rest))
            wall = time.monotonic() - wall0
            store_cpu = thread_cpu_s("telemetry") - cpu0
            parse_cpu = feeder.parse_s - parse0
            ingest_cpu = store_cpu + parse_cpu
        finally:
            feeder.stop.set()
            feeder.thread.join(timeout=30)
            head.tsdb.stop()
            server.should_exit = True
            serving.join(timeout=10)
    samples_per_s = args.nodes * GPUS / 10.0
    ingest_pct = 100.0 * ingest_cpu / wall

    def p95(part: dict[str, Any], key: str) -> float:
        return float(part[key]["p95_ms"])

    return {
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "active_jobs": args.active,
        "historical_jobs": args.historical,
        "historical_events": made["events"],
        "setup_s": {
            "history": round(history_s, 1),
            "live_state": round(live_s, 1),
            "rollup_backfill": round(backfill_s, 1),
        },
        "telemetry": {
            "batches": feeder.batches,
            "gpu_samples_per_s": samples_per_s,
            "ingest_cpu_pct_of_one_core": round(ingest_pct, 2),
            "of_which_json_parsing_pct": round(100.0 * parse_cpu / wall, 2),
            "of_which_store_thread_pct": round(100.0 * store_cpu / wall, 2),
            "host_steal_pct": steal,
        },
        "with_telemetry": flowing,
        "baseline_without_telemetry": quiet,
        "baseline_whole_lists_and_naive_sql": base,
        "targets": {
            "jobs_page_p95_le_150ms": p95(flowing, "jobs_live_page") <= 150
            and p95(flowing, "jobs_ended_page") <= 150,
            "jobs_page_le_150kB": flowing["jobs_live_page"]["bytes"] <= 150_000,
            "gpu_grid_8000_p95_le_200ms": p95(flowing, "gpu_grid_all") <= 200,
            "head_metrics_p95_le_50ms": p95(flowing, "head_metrics") <= 50,
            "per_gpu_scrape_8000_p95_le_100ms": p95(flowing, "per_gpu_scrape_all") <= 100,
            "ingest_le_2pct_of_a_core": ingest_pct <= 2.0,
            "year_report_team_per_month_le_1s": p95(flowing, "report_team_per_month") <= 1000,
            "year_report_user_per_day_le_1s": p95(flowing, "report_user_per_day") <= 1000,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--active", type=int, default=10_000)
    parser.add_argument("--historical", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warm-s", type=float, default=30.0)
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
