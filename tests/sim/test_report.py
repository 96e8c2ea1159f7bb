"""What a simulation reports beyond the raw run: the steady-state utilisation beside the
whole run's, and plots where every policy's line can be told apart."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from rich.console import Console

from phalanx.sim.engine import SimConfig, simulate
from phalanx.sim.layout import uniform
from phalanx.sim.metrics import busy_gpu_s, summarize
from phalanx.sim.plots import curve_labels, plot_all
from phalanx.sim.report import summary_table
from phalanx.sim.workload import TraceJob, Workload


def _workload(*jobs: tuple[float, float, int]) -> Workload:
    """Jobs as (submit, duration, GPUs), one team."""
    return Workload(
        tuple(TraceJob(i, s, d, g, "t", 0) for i, (s, d, g) in enumerate(jobs)), "hand-made"
    )


def test_busy_gpu_seconds_between_two_times() -> None:
    grid = np.array([0.0, 10.0, 20.0, 30.0])
    busy = np.array([4.0, 2.0, 0.0, 0.0])
    assert busy_gpu_s(grid, busy, 0.0, 30.0) == 60.0
    assert busy_gpu_s(grid, busy, 5.0, 15.0) == 4 * 5 + 2 * 5
    assert busy_gpu_s(grid, busy, 20.0, 20.0) == 0.0


def test_a_drain_tail_lowers_the_whole_run_figure_not_the_steady_one() -> None:
    # 4 GPUs: back-to-back 4-GPU jobs keep the cluster full while jobs arrive (t 0..300);
    # the last one runs alone 300..1300 on 1 GPU: the drain after the last arrival.
    wl = _workload((0, 100, 4), (100, 100, 4), (200, 100, 4), (300, 1000, 1))
    result = simulate(uniform(1, gpus_per_node=4), wl, SimConfig(policy="fifo"))
    summary = summarize([result])
    assert summary["utilization_while_arriving"] == 1.0
    assert summary["utilization"] == (3 * 400 + 1000) / (4 * 1300)
    out = Console(file=io.StringIO(), width=200)
    out.print(summary_table({"fifo": summary}, "t"))
    printed = out.file.getvalue()  # type: ignore[attr-defined]
    assert re.search(r"GPU utilisation, whole run +│ +42\.3%", printed), printed
    assert re.search(r"GPU utilisation, while jobs arrive +│ +100\.0%", printed), printed


def test_identical_runs_are_named_in_the_legend() -> None:
    same = np.array([1.0, 2.0, 3.0])
    labels = curve_labels({"fifo": same, "las": same.copy(), "sjf": np.array([1.0, 2.0])})
    assert labels == {"fifo": "fifo", "las": "las (= fifo)", "sjf": "sjf"}


def test_plots_include_a_queueing_delay_cdf(tmp_path: Path) -> None:
    wl = _workload((0, 100, 4), (0, 100, 4), (50, 10, 1))
    runs = {
        policy: [simulate(uniform(1, gpus_per_node=4), wl, SimConfig(policy=policy))]
        for policy in ("fifo", "las")
    }
    paths = plot_all(runs, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "jct_cdf.png",
        "queue_cdf.png",
        "utilization.png",
        "queue.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
