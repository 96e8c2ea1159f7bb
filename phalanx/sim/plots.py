"""PNG plots of a simulation: JCT CDF per policy, utilisation and queue length over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from phalanx.sim.engine import SimResult
from phalanx.sim.metrics import timeline

MAX_POINTS = 4000


def _jct(results: Sequence[SimResult]) -> np.ndarray:
    finish = np.concatenate([np.frombuffer(r.finish, dtype=float) for r in results])
    submit = np.concatenate([np.frombuffer(r.submit, dtype=float) for r in results])
    done = finish >= 0
    return np.sort(finish[done] - submit[done])


def plot_all(runs: Mapping[str, Sequence[SimResult]], out_dir: Path) -> list[Path]:
    """Write jct_cdf.png, utilization.png and queue.png comparing the runs; return paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "jct_cdf.png", out_dir / "utilization.png", out_dir / "queue.png"]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, results in runs.items():
        jct = _jct(results) / 3600.0
        if jct.size:
            ax.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    for path, which, ylabel in (
        (paths[1], 1, "GPU utilisation"),
        (paths[2], 2, "queued jobs"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        for label, results in runs.items():
            series = timeline(results)
            t, y = series[0], series[which]
            if not t.size:
                continue
            if which == 1:
                y = y / max(sum(r.gpus for r in results), 1)
            step = max(1, t.size // MAX_POINTS)
            ax.step((t[::step] - t[0]) / 86400.0, y[::step], where="post", label=label, lw=0.9)
        ax.set_xlabel("days since the first submission")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths
