"""The usage rollup survives a job that was counted open, then requeued and started again
before the next flush (a node that died, a head restart whose agents came back late): the
stored open allocation is replaced, not inserted twice (which failed every flush after it,
so accounting stopped for good). Found by bench/fleet.py's head restart at 1,000 nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.head.test_usage_loop import Rig


def test_a_stored_open_job_requeued_and_restarted_in_one_flush(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "head")
    rig.node("n1", gpus=2)
    rig.node("n2", gpus=2)
    job, _ = rig.start(gpus_per_node=2)
    rig.run(60.0)
    rig.usage.flush()  # its allocation is stored open
    node = rig.loop.job(job).placement[0][0]
    rig.loop.silence(node)
    for _ in range(200):
        if [m for m in rig.loop.moves(job) if m == ("PD", "R")][1:]:
            break
        rig.loop.advance(1.0)
    assert rig.loop.moves(job).count(("PD", "R")) == 2  # started again, elsewhere
    assert rig.loop.job(job).placement[0][0] != node
    rows = rig.report()  # flushes: the close and the new start in one replay
    hours = sum(float(str(r["alloc_gpu_hours"])) for r in rows)
    assert hours > 0
    rig.run(3600.0)
    rig.usage.flush()  # and the next flushes still work
    later = sum(float(str(r["alloc_gpu_hours"])) for r in rig.report())
    assert later == pytest.approx(hours + 2.0, rel=0.02)  # 2 GPUs for the hour since
