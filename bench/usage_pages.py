"""What the idle-GPU marks cost the dashboard, and the accounting and idle pages at scale.

    python bench/usage_pages.py [--nodes 1000] [--active 10000] [--flagged-pct 25] [--runs 30]

A real head (SQLite, its real ASGI app under uvicorn, real HTTP) with bench/dashboard.py's
synthetic state: `--nodes` nodes × 8 GPUs, one running 8-GPU job per node (100 users in
10 teams), the rest of `--active` queued. Its idle-GPU detector is fed real samples (the
head's own `GpuSamples.record` → `IdleDetector.on_sample`) so that `--flagged-pct` of the
allocated GPUs are flagged idle (a 10 s window), and the usage rollup is written.

Measured (p50 / p95 ms and bytes of `--runs` GETs by a signed-in admin): the GPU grid of
every GPU and the overview, each with the flags (ours) and, side by side in the same run,
with none flagged (baseline: the same pages before this work marked anything); the idle
page listing every flagged GPU; the accounting page by user per day against the REST JSON
report of the same query (its baseline). Ratios: ours / baseline (≥ 1: slower).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from dashboard import GPUS, free_port, populate, signed_in, timed  # bench/dashboard.py

from phalanx.api.models import GpuTelemetry
from phalanx.core.idle import IdleAction, IdlePolicy
from phalanx.head.app import create_app
from phalanx.head.mirror import Settings
from phalanx.head.server import ADMIN_TOKEN_FILE, build
from phalanx.head.server import _tune_gc as tune_gc
from phalanx.head.service import Head

WINDOW_S = 10.0


def flag(head: Head, pct: float, now: float) -> int:
    """Samples two windows apart: `pct`% of every node's GPUs at 0% (flagged), the rest
    at 97%; then the rollup is written. The number of flagged GPUs."""
    usage = head.usage
    with head.control.lock:
        running = [r for r in head.mirror.jobs.values() if r.state.holds_gpus]
        teams = {r.team for r in running}
    for team in teams:
        usage.idle.set_policy(team, IdlePolicy(IdleAction.NOTIFY, WINDOW_S, 600.0, 1.0))
    for rec in running:
        usage.idle.place(rec, now - 3 * WINDOW_S)
    idle = round(GPUS * pct / 100)
    for t in (now - 2 * WINDOW_S, now - WINDOW_S, now):
        for rec in running:
            for node, gpus in rec.placement:
                readings = [
                    GpuTelemetry(index=g, utilization_pct=0.0 if g < idle else 97.0) for g in gpus
                ]
                head.samples.record(node, readings, t)
    usage.idle.tick(now)
    usage.flush()
    return usage.idle.idle_gpus()


def unflag(head: Head, now: float) -> None:
    """Every GPU busy again (the flags clear): the baseline's state."""
    with head.control.lock:
        running = [r for r in head.mirror.jobs.values() if r.state.holds_gpus]
    for rec in running:
        for node, gpus in rec.placement:
            head.samples.record(
                node, [GpuTelemetry(index=g, utilization_pct=97.0) for g in gpus], now
            )
    assert head.usage.idle.idle_gpus() == 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--active", type=int, default=10_000)
    p.add_argument("--flagged-pct", type=float, default=25.0)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "head"
        state.mkdir(mode=0o700)
        head = build(state, None, Settings())
        populate(head, args.nodes, args.active, 0)
        tune_gc()
        now = time.time()
        flagged = flag(head, args.flagged_pct, now)
        admin = (state / ADMIN_TOKEN_FILE).read_text().strip()
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(head), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        report = "by=user&per=day"
        try:
            with signed_in(url, admin) as a:
                ours = {
                    "gpu_grid_all": timed(a, "/ui/nodes?per=1000", args.runs),
                    "overview": timed(a, "/ui/", args.runs),
                    "idle_page": timed(a, "/ui/idle", args.runs),
                    "accounting_page": timed(a, f"/ui/accounting?{report}", args.runs),
                }
                grid = a.get("/ui/nodes?per=1000").text
                assert grid.count('data-idle="1"') == flagged, "every flag drawn"
                unflag(head, now + 1.0)
                baseline = {
                    "gpu_grid_all": timed(a, "/ui/nodes?per=1000", args.runs),
                    "overview": timed(a, "/ui/", args.runs),
                }
                assert 'data-idle="1"' not in a.get("/ui/nodes?per=1000").text
            auth = {"Authorization": f"Bearer {admin}"}
            with httpx.Client(base_url=url, timeout=120, headers=auth) as b:
                baseline["accounting_rest_json"] = timed(
                    b, f"/v1/reports/usage?{report}", args.runs
                )
        finally:
            server.should_exit = True
            thread.join(timeout=10)

    def ratio(page: str, base: str | None = None) -> float:
        return round(ours[page]["p95_ms"] / baseline[base or page]["p95_ms"], 2)

    out = {
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "flagged_gpus": flagged,
        "ours": ours,
        "baseline": baseline,
        "ratio_grid_p95_flagged_vs_none": ratio("gpu_grid_all"),
        "ratio_overview_p95_flagged_vs_none": ratio("overview"),
        "ratio_accounting_page_vs_rest_json_p95": ratio("accounting_page", "accounting_rest_json"),
        "targets": {"gpu_grid_8000_p95_le_200ms": ours["gpu_grid_all"]["p95_ms"] <= 200},
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
