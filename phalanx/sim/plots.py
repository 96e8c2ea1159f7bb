"""PNG plots of a simulation: JCT and queueing-delay CDFs per policy, utilisation and queue
length over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from phalanx.sim.engine import SimResult
from phalanx.sim.metrics import timeline

MAX_POINTS = 4000
# Policies often give identical curves (fifo and las on a trace whose jobs never reach the
# second LAS level): a later line drawn over an earlier one hides it, so each run gets its
# own dash pattern and marker, and a run identical to an earlier one says so in the legend.
STYLES: tuple[tuple[str, str], ...] = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))
QUEUE_FLOOR_H = 1 / 60  # queueing delays below a minute sit on the linear part of the axis


def _done(results: Sequence[SimResult]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    finish = np.concatenate([np.frombuffer(r.finish, dtype=float) for r in results])
    submit = np.concatenate([np.frombuffer(r.submit, dtype=float) for r in results])
    start = np.concatenate([np.frombuffer(r.start, dtype=float) for r in results])
    done = finish >= 0
    return submit[done], start[done], finish[done]


def _jct(results: Sequence[SimResult]) -> np.ndarray:
    submit, _, finish = _done(results)
    return np.sort(finish - submit)


def _queueing(results: Sequence[SimResult]) -> np.ndarray:
    submit, start, _ = _done(results)
    return np.sort(start - submit)


def curve_labels(curves: Mapping[str, npt.NDArray[np.float64]]) -> dict[str, str]:
    """Each run's legend label: its name, plus `= NAME` when its values equal an earlier
    run's (its line lies under that one)."""
    labels: dict[str, str] = {}
    seen: list[tuple[str, npt.NDArray[np.float64]]] = []
    for name, values in curves.items():
        same = next((other for other, v in seen if np.array_equal(v, values)), None)
        labels[name] = name if same is None else f"{name} (= {same})"
        seen.append((name, values))
    return labels


def _style(i: int) -> tuple[str, str, float]:
    """Run i's dash pattern, marker and line width: thicker lines first, so a coinciding
    later line stays visible on top of them."""
    dash, marker = STYLES[i % len(STYLES)]
    return dash, marker, 2.4 - 0.5 * (i % len(STYLES))


def _cdf(ax: Axes, curves: Mapping[str, npt.NDArray[np.float64]]) -> None:
    labels = curve_labels(curves)
    for i, (name, values) in enumerate(curves.items()):
        if values.size:
            y = np.arange(1, values.size + 1) / values.size
            dash, marker, width = _style(i)
            ax.plot(values, y, label=labels[name], ls=dash, marker=marker, markevery=0.1, lw=width)
    ax.set_ylabel("fraction of jobs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def plot_all(runs: Mapping[str, Sequence[SimResult]], out_dir: Path) -> list[Path]:
    """Write jct_cdf.png, queue_cdf.png, utilization.png and queue.png comparing the runs;
    return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        out_dir / "jct_cdf.png",
        out_dir / "queue_cdf.png",
        out_dir / "utilization.png",
        out_dir / "queue.png",
    ]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    _cdf(ax, {label: _jct(results) / 3600.0 for label, results in runs.items()})
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_title("JCT CDF")
    _save(fig, paths[0])

    # Queueing delay is where policies differ most; many jobs wait 0 s, which a log axis
    # cannot show, so the axis is linear below a minute and logarithmic above.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _cdf(ax, {label: _queueing(results) / 3600.0 for label, results in runs.items()})
    ax.set_xscale("symlog", linthresh=QUEUE_FLOOR_H)
    ax.set_xlim(left=0)
    ax.set_xlabel("queueing delay (hours; linear below 1 min, log above)")
    ax.set_title("Queueing delay CDF")
    _save(fig, paths[1])

    for path, which, ylabel in (
        (paths[2], 1, "GPU utilisation"),
        (paths[3], 2, "queued jobs"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        series = {label: timeline(results) for label, results in runs.items()}
        labels = curve_labels({label: s[which] for label, s in series.items()})
        for i, (label, results) in enumerate(runs.items()):
            t, y = series[label][0], series[label][which]
            if not t.size:
                continue
            if which == 1:
                y = y / max(sum(r.gpus for r in results), 1)
            step = max(1, t.size // MAX_POINTS)
            dash, _, width = _style(i)
            days = (t[::step] - t[0]) / 86400.0
            ax.step(days, y[::step], where="post", label=labels[label], ls=dash, lw=width / 2)
        ax.set_xlabel("days since the first submission")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
        _save(fig, path)
    return paths
