"""A progress report carries the last checkpoint's save time and step once there is one,
and the head's wire model takes it (what phalanx_job_checkpoint_duration_seconds observes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from phalanx.api.models import JobProgress
from phalanx.train.report import Progress, Reporter
from tests.train.fakehead import FakeHead


@pytest.fixture
def head() -> Iterator[FakeHead]:
    server = FakeHead()
    yield server
    server.close()


def test_the_last_checkpoint_is_reported_once_saved(head: FakeHead) -> None:
    env = {"PHALANX_HEAD": head.url, "PHALANX_JOB_ID": "7", "PHALANX_STEP_TOKEN": "tok-123"}
    reporter = Reporter(0, 0, environ=env, printer=lambda line: None)
    reporter.report(Progress(rank=0, step=10, loss=1.0, tokens_per_s=None, mfu=None, time=1.7e9))
    reporter.report(
        Progress(
            rank=0,
            step=20,
            loss=0.9,
            tokens_per_s=None,
            mfu=None,
            time=1.7e9,
            checkpoint_s=2.25,
            checkpoint_step=20,
        )
    )
    reporter.close()
    first, second = (r[2] for r in head.requests)
    assert "checkpoint_s" not in first and "checkpoint_step" not in first
    assert second["checkpoint_s"] == 2.25 and second["checkpoint_step"] == 20
    parsed = JobProgress.model_validate(second)
    assert (parsed.checkpoint_s, parsed.checkpoint_step) == (2.25, 20)
    with pytest.raises(ValueError, match="checkpoint_s"):
        JobProgress.model_validate({**second, "checkpoint_s": -1.0})
