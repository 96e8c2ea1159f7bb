"""Usage accounting and idle-GPU detection at scale.

    python bench/accounting.py [--jobs 1000000] [--users 500] [--teams 50] [--db sqlite|postgresql]

Reports: a year (2025) of `--jobs` synthetic jobs (start uniform over the year, run time
exponential with a 3 h mean capped at 3 days, 1–64 GPUs, one of three QOS, 10% failed, 3%
preempted once). Each job is a row of the real `jobs` table and its state moves are rows of
the real `events` table, in time order; the real rollup (head/accounting.py) replays that
log once (the back-fill a first start does) with per-job utilisation sums, then:
- the year's report by team per month and by user per day, as the route computes it (query
  + rows), median of 5 runs;
- baseline, side by side: the naive GROUP BY over the jobs table (GPUs from the spec JSON ×
  run time, grouped by the start's month or day: it cannot even split a job at midnight),
  median of 5 runs; the ratio baseline / rollup.

Detector: 1,000 nodes × 8 GPUs held by 1,000 running jobs, every node sampled once per
round (one 10 s telemetry interval), a third of the GPUs idle: the head's GpuSamples.record
with the usage service subscribed (allocation lookup, utilisation and idle sums, idle
judgement) against GpuSamples.record alone (baseline); per round and as a share of one core
at 10 s; plus a tick (every 5 s) and a rollup flush of the sums (every 60 s).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phalanx.api.models import GpuTelemetry, JobSpec
from phalanx.core import JobState
from phalanx.core.idle import split_days
from phalanx.head import accounting, db
from phalanx.head.accounting import Rollup
from phalanx.head.idle import IdleDetector
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Mirror, Settings
from phalanx.head.records import JobRecord
from phalanx.head.telemetry import GpuSamples

YEAR_START = 1735689600.0  # 2025-01-01 00:00 UTC
YEAR_S = 365 * 86400.0
GPU_CHOICES = [1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 32, 64]


def median_time(fn: Any, runs: int = 5) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


# ---------------------------------------------------------------------------- reports
def populate(engine: sa.Engine, n: int, users: int, teams: int, seed: int = 1) -> dict[str, Any]:
    """Jobs and their state moves in the real tables; the per-job utilisation sums."""
    rng = random.Random(seed)
    team_of = {f"u{u:04d}": f"t{u % teams:03d}" for u in range(users)}
    names = sorted(team_of)
    jobs, moves = [], []
    sums: dict[tuple[str, str, str, str], list[float]] = {}
    for i in range(1, n + 1):
        user = names[rng.randrange(users)]
        qos = rng.choice(("normal", "normal", "low", "high"))
        gpus = rng.choice(GPU_CHOICES)
        start = YEAR_START + rng.random() * YEAR_S
        end = min(start + min(rng.expovariate(1 / 10800.0), 3 * 86400.0), YEAR_START + YEAR_S)
        spec = json.dumps({"command": ["train"], "workdir": "/w", "gpus_per_node": gpus})
        final = "F" if rng.random() < 0.10 else "CD"
        jobs.append(
            {
                "id": i,
                "name": "job",
                "user": user,
                "team": team_of[user],
                "qos": qos,
                "priority": 0,
                "state": final,
                "spec_json": spec,
                "submit_time": start,
                "start_time": start,
                "end_time": end,
            }
        )
        moves.append((start, i, "PD", "R", "started"))
        if rng.random() < 0.03:
            mid = (start + end) / 2
            moves.append((mid, i, "R", "PR", "preempted for job 0"))
            moves.append((mid, i, "PR", "CG", "stopping"))
            moves.append((mid, i, "CG", "PD", "requeued"))
            moves.append((mid, i, "PD", "R", "started"))
        moves.append((end, i, "R", "CG", "stopping"))
        moves.append((end, i, "CG", final, "ended"))
        util = rng.random() * 100.0
        for day, seconds in split_days(start, end):
            row = sums.setdefault((day, user, team_of[user], qos), [0.0, 0.0])
            row[0] += util / 100.0 * gpus * seconds
    moves.sort()
    t0 = time.perf_counter()
    with engine.begin() as conn:
        for k in range(0, len(jobs), 20_000):
            conn.execute(sa.insert(db.jobs), jobs[k : k + 20_000])
        for k in range(0, len(moves), 50_000):
            conn.execute(
                sa.insert(db.events),
                [
                    {
                        "time": t,
                        "job_id": j,
                        "kind": "k",
                        "message": m,
                        "from_state": a,
                        "to_state": b,
                    }
                    for t, j, a, b, m in moves[k : k + 50_000]
                ],
            )
    loaded = time.perf_counter() - t0
    return {"sums": sums, "events": len(moves), "insert_s": loaded}


BASELINE_MONTH = """
SELECT team, strftime('%Y-%m', start_time, 'unixepoch') AS period,
       SUM(json_extract(spec_json, '$.gpus_per_node') * (end_time - start_time)) / 3600.0,
       COUNT(*), SUM(state = 'F')
FROM jobs WHERE start_time >= :a AND start_time < :b GROUP BY team, period ORDER BY period, team
"""
BASELINE_DAY = """
SELECT user, strftime('%Y-%m-%d', start_time, 'unixepoch') AS period,
       SUM(json_extract(spec_json, '$.gpus_per_node') * (end_time - start_time)) / 3600.0,
       COUNT(*), SUM(state = 'F')
FROM jobs WHERE start_time >= :a AND start_time < :b GROUP BY user, period ORDER BY period, user
"""
PG_GPUS = "(spec_json::json->>'gpus_per_node')::int"
PG_BASELINE = {
    "month": BASELINE_MONTH.replace(
        "strftime('%Y-%m', start_time, 'unixepoch')", "to_char(to_timestamp(start_time), 'YYYY-MM')"
    )
    .replace(
        "json_extract(spec_json, '$.gpus_per_node')", "(spec_json::json->>'gpus_per_node')::int"
    )
    .replace("SUM(state = 'F')", "SUM((state = 'F')::int)")
    .replace("user", '"user"'),
    "day": BASELINE_DAY.replace(
        "strftime('%Y-%m-%d', start_time, 'unixepoch')",
        "to_char(to_timestamp(start_time), 'YYYY-MM-DD')",
    )
    .replace(
        "json_extract(spec_json, '$.gpus_per_node')", "(spec_json::json->>'gpus_per_node')::int"
    )
    .replace("SUM(state = 'F')", "SUM((state = 'F')::int)")
    .replace("user", '"user"'),
}


def bench_reports(engine: sa.Engine, args: argparse.Namespace) -> dict[str, Any]:
    from phalanx.head.usage_routes import report_json

    with engine.connect() as conn:
        have = conn.execute(sa.select(sa.func.count()).select_from(db.jobs)).scalar()
    if have:  # --state of an earlier run: measure the reports again
        made: dict[str, Any] = {"events": None, "insert_s": 0.0}
        applied, backfill = 0, 0.0
    else:
        made = populate(engine, args.jobs, args.users, args.teams)
        rollup = Rollup(engine)
        rollup.load()
        t0 = time.perf_counter()
        applied = rollup.flush(YEAR_START + YEAR_S, made["sums"])
        backfill = time.perf_counter() - t0
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(db.usage_daily)).scalar()

    def ours(by: str, per: str) -> Any:
        def run() -> int:
            with engine.connect() as conn:
                got = accounting.report(conn, by, per, "2025-01-01", "2026-01-01", None)  # type: ignore[arg-type]
            return len(report_json(by, per, "2025-01-01", "2026-01-01", got))

        return run

    def naive(per: str) -> Any:
        sql = BASELINE_MONTH if per == "month" else BASELINE_DAY
        if engine.dialect.name == "postgresql":
            sql = PG_BASELINE[per]

        def run() -> int:
            with engine.connect() as conn:
                return len(
                    conn.execute(sa.text(sql), {"a": YEAR_START, "b": YEAR_START + YEAR_S}).all()
                )

        return run

    out: dict[str, Any] = {
        "jobs": args.jobs,
        "events": made["events"],
        "users": args.users,
        "teams": args.teams,
        "rollup_rows": rows,
        "insert_jobs_and_events_s": round(made["insert_s"], 2),
        "rollup_backfill_s": round(backfill, 2),
        "rollup_backfill_events_per_s": round(applied / backfill) if backfill else None,
    }
    for name, by, per in (("team_per_month", "team", "month"), ("user_per_day", "user", "day")):
        t_ours, size = median_time(ours(by, per))
        t_base, base_rows = median_time(naive(per))
        out[name] = {
            "rollup_s": round(t_ours, 4),
            "answer_bytes": size,
            "baseline_naive_group_by_s": round(t_base, 4),
            "baseline_rows": base_rows,
            "ratio_baseline_over_rollup": round(t_base / t_ours, 1),
        }
    return out


# ---------------------------------------------------------------------------- detector
def bench_detector(rounds: int) -> dict[str, Any]:
    nodes, per_node = 1000, 8
    mirror = Mirror(Settings())
    detector = IdleDetector(mirror, lambda fn: None)  # flags' effects: not this measure
    now = YEAR_START
    for j in range(nodes):
        rec = JobRecord(
            id=j + 1,
            name="job",
            user=f"u{j % 500:04d}",
            team=f"t{j % 50:03d}",
            account=None,
            qos="normal",
            priority=0,
            state=JobState.RUNNING,
            spec=JobSpec(command=["x"], workdir="/w", gpus_per_node=per_node),
            submit_time=now,
            start_time=now,
            epoch=1,
            placement=[(f"node{j:04d}", list(range(per_node)))],
        )
        detector.place(rec)
    rng = random.Random(2)
    readings = {
        f"node{j:04d}": [
            GpuTelemetry(
                index=i,
                utilization_pct=0.0 if rng.random() < 0.33 else rng.uniform(20, 100),
                memory_used_mb=1000,
                temperature_c=50.0,
                power_w=300.0,
            )
            for i in range(per_node)
        ]
        for j in range(nodes)
    }

    def round_of(samples: GpuSamples, t: float) -> float:
        t0 = time.perf_counter()
        for node, gpus in readings.items():
            samples.record(node, gpus, t)
        return time.perf_counter() - t0

    plain, watched = GpuSamples(), GpuSamples()
    watched.subscribe(detector.on_sample)
    base_times, our_times = [], []
    for r in range(1, rounds + 1):
        t = now + 10.0 * r
        base_times.append(round_of(plain, t))
        our_times.append(round_of(watched, t))
    t0 = time.perf_counter()
    detector.tick(now + 10.0 * rounds + 1)
    tick_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        engine = db.make_engine(f"sqlite:///{Path(d) / 'x.db'}")
        upgrade(engine)
        rollup = Rollup(engine)
        rollup.load()
        sums = detector.take_sums()
        t0 = time.perf_counter()
        rollup.flush(now + 10.0 * rounds, sums)
        flush_s = time.perf_counter() - t0
        engine.dispose()
    base, ours = statistics.median(base_times), statistics.median(our_times)
    added = ours - base
    # Per 60 s: 6 rounds, 12 ticks, 1 flush.
    per_minute = 6 * added + 12 * tick_s + flush_s
    return {
        "gpus": nodes * per_node,
        "rounds": rounds,
        "flagged_idle_gpus": detector.idle_gpus(),
        "round_s_baseline_record_only": round(base, 5),
        "round_s_with_usage": round(ours, 5),
        "ratio_with_usage_over_baseline": round(ours / base, 2),
        "usage_added_per_round_s": round(added, 5),
        "usage_added_per_node_sample_us": round(added / nodes * 1e6, 2),
        "tick_s": round(tick_s, 5),
        "flush_of_sums_s": round(flush_s, 5),
        "share_of_one_core_at_10s_interval_pct": round(100.0 * per_minute / 60.0, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200, help="detector rounds (10 s each)")
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--state", help="SQLite: keep the database in this directory (and reuse it next time)"
    )
    parser.add_argument("--no-detector", action="store_true", help="reports only")
    args = parser.parse_args()
    out: dict[str, Any] = {} if args.no_detector else {"detector": bench_detector(args.rounds)}
    with tempfile.TemporaryDirectory() as tmp:
        d = args.state or tmp
        Path(d).mkdir(parents=True, exist_ok=True)
        if args.db == "postgresql":
            from phalanx.testing.postgres import PostgresServer

            with PostgresServer() as pg:
                engine = db.make_engine(pg.url)
                upgrade(engine)
                out["reports"] = {"db": "postgresql", **bench_reports(engine, args)}
                engine.dispose()
        else:
            engine = db.make_engine(f"sqlite:///{Path(d) / 'phalanx.db'}")
            upgrade(engine)
            out["reports"] = {"db": "sqlite", **bench_reports(engine, args)}
            engine.dispose()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
