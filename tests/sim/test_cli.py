"""`phalanx sim` as a user runs it: a real process, real trace files, JSON and plots out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
PHILLY = TRACES / "philly_pollux" / "philly.csv"
POLLUX = TRACES / "philly_pollux" / "workloads" / "workloads" / "workload-1.csv"

pytestmark = pytest.mark.skipif(not PHILLY.is_file(), reason="shared/traces is not beside the repo")


def _phalanx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _json(*args: str) -> dict[str, Any]:
    proc = _phalanx(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_pollux_workload_replays_with_required_keys() -> None:
    data = _json("sim", "--trace", str(POLLUX), "--nodes", "16", "--gpus-per-node", "4")
    for key in ("jobs", "avg_jct_s", "avg_queue_s", "p99_jct_s", "utilization", "wall_s"):
        assert key in data
    assert data["jobs"] == 160 and data["unfinished"] == 0
    assert 0 < data["utilization"] <= 1
    assert data["p99_jct_s"] >= data["p50_jct_s"] > 0


def test_philly_window_per_vc_compares_policies_and_writes_plots(tmp_path: Path) -> None:
    data = _json(
        "sim",
        "--trace", str(PHILLY),
        "--start", "2017-10-01", "--end", "2017-10-08",
        "--vc-nodes", "11cb48=4,103959=2",
        "--policy", "fifo,sjf",
        "--no-backfill",
        "--plots", str(tmp_path),
    )  # fmt: skip
    fifo, sjf = data["policies"]["fifo"], data["policies"]["sjf"]
    assert fifo["jobs"] == sjf["jobs"] > 100
    assert fifo["cluster"] == "11cb48,103959"
    assert fifo["avg_queue_s"] > sjf["avg_queue_s"]  # head-of-line blocking under FIFO
    for name in ("jct_cdf.png", "queue_cdf.png", "utilization.png", "queue.png"):
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failures_report_goodput_and_young_daly() -> None:
    data = _json(
        "sim", "--synthetic", "300", "--nodes", "8", "--load", "0.7", "--seed", "2",
        "--mtbf-gpu-hours", "200", "--checkpoint-interval", "600", "--checkpoint-cost", "20",
    )  # fmt: skip
    assert data["jobs"] == 300
    assert data["failures"] > 0 and 0 < data["goodput"] < 1
    assert data["young_daly_s_8gpu"] == pytest.approx((2 * 20 * 200 * 3600 / 8) ** 0.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vc-nodes", "6214e9"], "NAME=NODES"),
        (["--policy", "lottery"], "unknown policy"),
        (["--start", "last tuesday"], "not a date"),
        (["--start", "2030-01-01"], "no jobs"),
    ],
)
def test_bad_input_gives_a_clear_error_not_a_traceback(args: list[str], message: str) -> None:
    proc = _phalanx("sim", "--trace", str(PHILLY), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_workload_is_explained() -> None:
    proc = _phalanx("sim")
    assert proc.returncode == 2
    assert "--trace" in proc.stderr and "Traceback" not in proc.stderr
