"""The overview's utilisation chart: per-minute means of every GPU and of allocated GPUs."""

from __future__ import annotations

from phalanx.api.models import GpuTelemetry
from phalanx.head.utilhistory import UtilHistory


def _gpus(*utils: float | None) -> list[GpuTelemetry]:
    return [GpuTelemetry(index=i, utilization_pct=u) for i, u in enumerate(utils)]


def test_minutes_average_all_gpus_and_the_allocated_ones() -> None:
    held = {"n1": frozenset({0}), "n2": frozenset({0, 1})}
    history = UtilHistory(lambda node: held.get(node, frozenset()))
    history.add("n1", _gpus(90, 0), 600.0)  # minute 10
    history.add("n2", _gpus(50, 30), 630.0)
    history.add("n1", _gpus(None, 10), 661.0)  # minute 11: a GPU with no reading is skipped
    history.add("n1", _gpus(100, 100), 725.0)  # minute 12: still filling at now=730
    assert history.series(0, 730) == {
        "t": [600.0, 660.0],
        "all": [42.5, 10.0],  # (90+0+50+30)/4, 10/1
        "allocated": [round((90 + 50 + 30) / 3, 1), None],  # GPU 1 of n1 is not held
    }
    assert history.series(660, 790)["t"] == [660.0, 720.0]


def test_only_the_newest_minutes_are_kept() -> None:
    history = UtilHistory(lambda node: frozenset(), keep_minutes=3)
    for minute in range(10):
        history.add("n1", _gpus(minute), minute * 60.0)
    assert history.series(0, 10 * 60)["t"] == [420.0, 480.0, 540.0]
