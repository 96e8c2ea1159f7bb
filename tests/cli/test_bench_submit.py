"""bench/submit.py runs end to end (small numbers): real cluster, real submits, one JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "submit.py"


def test_the_submit_benchmark_stores_every_job_and_prints_its_figures() -> None:
    args = ["--db", "sqlite", "--jobs", "96", "--starts", "2", "--clients", "8"]
    out = subprocess.run(
        [sys.executable, str(BENCH), *args, "--baseline-jobs", "32"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # `queue` lists the live jobs: every submit of the flood and the 4 warm-up submits (the
    # latency jobs have ended; the bench itself checks that all were stored).
    assert result["jobs_listed"] == 96 + 4
    assert result["submits_per_s"] > 0 and result["baseline_one_commit_per_submit_per_s"] > 0
    assert 0 < result["start_p50_s"] <= result["start_p99_s"]
    steal = result["cpu_steal_pct_during_submits"]
    assert steal is None or 0 <= steal <= 100
    # The figures above are over TLS (the default); the same run over plain HTTP beside them.
    plain = result["plain_http"]
    assert plain["submits_per_s"] > 0 and 0 < plain["start_p50_s"] <= plain["start_p99_s"]
    assert plain["tls_submit_rate_ratio"] > 0
