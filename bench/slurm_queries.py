"""What Slurm's query commands cost on Phalanx: `squeue` and `sacct --parsable2` at 10,000 jobs.

    python bench/slurm_queries.py --phalanx-only [--live 10000] [--ended 10000] [--runs 5]
    python bench/slurm_queries.py --slurm-bin /usr/bin [...]   # also the real tools

A real head (SQLite, its real ASGI app under uvicorn, real HTTP) holding bench/dashboard.py's
synthetic state: 1,000 nodes × 8 GPUs, `--live` queued and running jobs in the mirror (one
running per node) and `--ended` ended ones in the database, 100 users in 10 teams. Each
command runs as a user would run it: a fresh `python -m phalanx.slurmcli TOOL …` process
as the admin (it sees every job), its output thrown away; p50 / max seconds of `--runs`.

Measured: `squeue` (default columns, the `--live` jobs), `squeue --json`, `sacct
--parsable2 -a -S now-1hour -s CD,F` (the `--ended` jobs), `sacct --parsable2 -a` (every
job, live and ended). Baselines in the same run: `phalanx queue --limit N` (Phalanx's own
listing of the same live jobs: its CLI, the same head call) and the bare REST calls the
tools make (`GET /v1/jobs?format=table`, live jobs; with `&active=true&ended=true`, live
and ended, as sacct asks: the head's share of sacct's time), from this process.
Ratios: command / `phalanx queue` and command / bare REST.

`--slurm-bin DIR` also times DIR/squeue and DIR/sacct with the same arguments, against the
slurmctld and slurmdbd they are configured for (the real-Slurm fixture seeds those with as
many jobs; this script does not): `measure_commands()` is the function to call for that.

Prints one JSON object (with the host's CPU steal over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from dashboard import free_port, populate  # bench/dashboard.py
from observability import steal_pct  # bench/observability.py

from phalanx.head.app import create_app
from phalanx.head.mirror import Settings
from phalanx.head.server import ADMIN_TOKEN_FILE, build
from phalanx.head.server import _tune_gc as tune_gc

COMMANDS: dict[str, list[str]] = {
    "squeue": ["squeue"],
    "squeue_json": ["squeue", "--json"],
    "sacct_parsable2_ended": [
        "sacct", "--parsable2", "-a", "-S", "now-1hour", "-s", "CD,F", "-o",
        "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode",
    ],
    "sacct_parsable2_all": ["sacct", "--parsable2", "-a"],
}  # fmt: skip


def _stats(times: Sequence[float], lines: int) -> dict[str, Any]:
    return {
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "lines": lines,
    }


def measure_commands(
    prefix: Sequence[str], env: Mapping[str, str], runs: int, commands: Mapping[str, list[str]]
) -> dict[str, Any]:
    """Time each command (`prefix` + its argv) `runs` times as a fresh process; its exit code
    must be 0. For the real Slurm: `prefix` is empty and argv[0] a path to the tool."""
    out: dict[str, Any] = {}
    for label, argv in commands.items():
        times = []
        lines = 0
        for _ in range(runs):
            start = time.perf_counter()
            done = subprocess.run(
                [*prefix, *argv], env=dict(env), capture_output=True, timeout=600, check=False
            )
            times.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode()[-500:]}")
            lines = done.stdout.count(b"\n")
        out[label] = _stats(times, lines)
    return out


def _rest(url: str, token: str, runs: int, ended: bool = False) -> dict[str, Any]:
    times = []
    rows = 0
    params: dict[str, str | int] = {"format": "table", "limit": 100_000}
    if ended:
        params.update(active="true", ended="true")  # what sacct asks for
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
        for _ in range(runs):
            start = time.perf_counter()
            r = c.get("/v1/jobs", params=params)
            r.raise_for_status()
            times.append(time.perf_counter() - start)
            rows = len(r.json()["rows"])
    return _stats(times, rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "head"
        state.mkdir(mode=0o700)
        head = build(state, None, Settings(max_queued_per_user=0))
        populate(head, 1000, args.live, args.ended)
        tune_gc()
        token = (state / ADMIN_TOKEN_FILE).read_text().strip()
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(head), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PHALANX_HEAD": url, "PHALANX_TOKEN": token}
        py = [sys.executable, "-m", "phalanx.slurmcli"]
        try:
            started = time.perf_counter()
            ours = measure_commands(py, env, args.runs, COMMANDS)
            queue = [sys.executable, "-m", "phalanx", "queue", "--limit", str(args.live)]
            baseline = measure_commands([], env, args.runs, {"phalanx_queue": queue})
            baseline["rest_table"] = _rest(url, token, args.runs)
            baseline["rest_table_live_and_ended"] = _rest(url, token, args.runs, ended=True)
            elapsed = time.perf_counter() - started
            slurm = None
            if args.slurm_bin:
                real = {k: [str(Path(args.slurm_bin) / v[0]), *v[1:]] for k, v in COMMANDS.items()}
                slurm = measure_commands([], os.environ, args.runs, real)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    steal = steal_pct(1.0)

    def ratio(label: str, base: str) -> float:
        return round(float(ours[label]["p50_s"]) / float(baseline[base]["p50_s"]), 2)

    return {
        "live_jobs": args.live,
        "ended_jobs": args.ended,
        "runs": args.runs,
        "phalanx": ours,
        "baseline": baseline,
        "slurm": slurm if slurm is not None else "not measured (--phalanx-only)",
        "ratios_vs_phalanx_queue": {k: ratio(k, "phalanx_queue") for k in ours},
        "ratios_vs_rest_table": {k: ratio(k, "rest_table") for k in ours},
        "bench_wall_s": round(elapsed, 1),
        "host_steal_pct": steal,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--phalanx-only", action="store_true", help="time Phalanx's tools only")
    p.add_argument("--slurm-bin", default=None, help="a real Slurm's bin folder, to time too")
    p.add_argument("--live", type=int, default=10_000)
    p.add_argument("--ended", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    if not args.phalanx_only and not args.slurm_bin:
        p.error("give --phalanx-only, or --slurm-bin DIR of a real Slurm seeded with the jobs")
    if args.phalanx_only:
        args.slurm_bin = None
    json.dump(run(args), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
