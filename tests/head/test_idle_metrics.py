"""The head's idle-GPU Prometheus series on its real control loop and store, with a fake
clock and GPU samples of known utilisation (tests/head/test_usage_loop.py's rig):
`phalanx_gpus_allocated_idle` follows the flags, `phalanx_gpu_idle_seconds_total` the
rollup's idle GPU-seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.head.metrics import HeadMetrics
from tests.head.test_metrics import Scrape
from tests.head.test_usage_loop import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path / "head")
    r.node("n1", gpus=2)
    return r


def test_flagged_gpus_are_a_gauge_and_their_idle_seconds_a_counter(rig: Rig) -> None:
    metrics = HeadMetrics(rig.loop.mirror, rig.loop.control.lock)
    metrics.usage = rig.usage
    rig.util[("n1", 0)] = 100.0
    job, _ = rig.start(launcher="node", gpus_per_node=2)
    team = rig.loop.job(job).team
    rig.run(1790.0)  # GPU 1 idle, not for the window yet
    scrape = Scrape(metrics)
    assert scrape.get("phalanx_gpus_allocated_idle", team=team) == 0.0
    rig.run(10.0)
    scrape = Scrape(metrics)
    assert scrape.get("phalanx_gpus_allocated_idle", team=team) == 1.0
    assert scrape.get("phalanx_gpus", state="allocated") == 2.0  # still allocated
    # The counter moves when the rollup is written: the whole flagged stretch at once.
    assert scrape.get("phalanx_gpu_idle_seconds_total", team=team) == 0.0
    rig.usage.flush()
    assert Scrape(metrics).get("phalanx_gpu_idle_seconds_total", team=team) == 1800.0
    rig.run(600.0)
    rig.usage.flush()
    assert Scrape(metrics).get("phalanx_gpu_idle_seconds_total", team=team) == 2400.0
    rig.util[("n1", 1)] = 50.0  # busy again: no longer flagged; the counter keeps its count
    rig.run(10.0)
    rig.usage.flush()
    scrape = Scrape(metrics)
    assert scrape.get("phalanx_gpus_allocated_idle", team=team) == 0.0
    assert scrape.get("phalanx_gpu_idle_seconds_total", team=team) == 2400.0
    (row,) = rig.report()
    assert row["idle_gpu_hours"] == pytest.approx(2400.0 / 3600, rel=1e-12)


def test_a_head_without_usage_writes_the_families_empty(rig: Rig) -> None:
    metrics = HeadMetrics(rig.loop.mirror, rig.loop.control.lock)
    text = metrics.exposition().decode()
    assert "# TYPE phalanx_gpus_allocated_idle gauge" in text
    assert "# TYPE phalanx_gpu_idle_seconds_total counter" in text
