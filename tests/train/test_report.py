"""Progress reports: printed by rank 0, POSTed to a real HTTP head, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from phalanx.local.cluster import free_port
from phalanx.train.report import Progress, Reporter
from tests.train.fakehead import FakeHead


@pytest.fixture
def head() -> Iterator[FakeHead]:
    server = FakeHead()
    yield server
    server.close()


def _env(url: str) -> dict[str, str]:
    return {"PHALANX_HEAD": url, "PHALANX_JOB_ID": "7", "PHALANX_STEP_TOKEN": "tok-123"}


def _progress(step: int) -> Progress:
    return Progress(rank=0, step=step, loss=2.5, tokens_per_s=1000.0, mfu=0.4, time=1.7e9)


def test_progress_is_printed_and_posted_to_the_head(head: FakeHead) -> None:
    lines: list[str] = []
    reporter = Reporter(0, 0, environ=_env(head.url), printer=lines.append)
    reporter.report(_progress(10), step_time_s=0.5, tflops=123.0)
    reporter.report(_progress(20))
    reporter.close()
    assert [r[0] for r in head.requests] == ["/v1/jobs/7/progress"] * 2
    assert {r[1] for r in head.requests} == {"Bearer tok-123"}
    assert head.requests[0][2] == {
        "rank": 0,
        "step": 10,
        "loss": 2.5,
        "tokens_per_s": 1000.0,
        "mfu": 0.4,
        "time": 1.7e9,
    }
    assert reporter.sent == 2 and reporter.failures == 0
    assert (
        lines[0]
        == "step 10 | loss 2.5000 | step 500.0 ms | 1,000 tok/s | 123 TFLOP/s/dev | MFU 40.0%"
    )


def test_progress_posts_leave_no_httpx_lines_in_a_script_logging_at_info(
    head: FakeHead, caplog: pytest.LogCaptureFixture
) -> None:
    # As examples/train_gpt.py's basicConfig(INFO); httpx's own level too, which other code
    # in this process (the client, the CLI) may have raised to WARNING.
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="httpx"):
        reporter = Reporter(0, 0, environ=_env(head.url), printer=lambda _: None)
        reporter.report(_progress(10))
        reporter.close()
        logging.getLogger("httpx").info("the script's own httpx line")
    assert reporter.sent == 1
    httpx_lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert httpx_lines == ["the script's own httpx line"]


def test_a_head_without_the_endpoint_is_logged_once_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = FakeHead(status=404)
    try:
        with caplog.at_level(logging.WARNING, logger="phalanx.train.report"):
            reporter = Reporter(0, 0, environ=_env(missing.url), printer=lambda _: None)
            for step in range(3):
                reporter.report(_progress(step))
            reporter.close()
    finally:
        missing.close()
    assert len(missing.requests) == 3
    assert reporter.failures == 3 and reporter.sent == 0
    assert len([r for r in caplog.records if "progress report" in r.getMessage()]) == 1


def test_an_unreachable_head_never_raises() -> None:
    reporter = Reporter(0, 0, environ=_env(f"http://127.0.0.1:{free_port()}"), printer=print)
    reporter.report(_progress(1))
    reporter.close()
    assert reporter.failures == 1


def test_without_phalanx_only_rank_zero_prints(head: FakeHead) -> None:
    lines: list[str] = []
    alone = Reporter(0, 0, environ={}, printer=lines.append)
    other = Reporter(1, 1, environ=_env(head.url), printer=lines.append)  # not local rank 0
    alone.report(_progress(5))
    other.report(_progress(5))
    alone.close()
    other.close()
    assert alone.url is None and other.url is None
    assert len(lines) == 1 and head.requests == []
