"""examples/train_gpt.py, unchanged, three ways: one process, torchrun, a Phalanx job
(its environment, a head receiving progress, a preemption notice and the requeued run)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.train.checkpoint import complete_steps
from phalanx.train.preempt import REQUEUE_EXIT_CODE
from tests.train import launch
from tests.train.fakehead import FakeHead

EXAMPLE = str(launch.REPO / "examples" / "train_gpt.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ARGS = ["--preset", "tiny", "--steps", "6", "--log-every", "3"]


def _losses(output: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"^step (\d+) \| loss (\S+)", output, re.M)}


def test_one_process_and_torchrun_give_the_same_losses(tmp_path: Path) -> None:
    single = subprocess.Popen(
        [sys.executable, EXAMPLE, *ARGS, "--checkpoint-dir", str(tmp_path / "ckpt")],
        env=launch.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    torchrun = subprocess.Popen(
        [*TORCHRUN, EXAMPLE, *ARGS, "--dp", "1", "--fsdp", "2"],
        env=launch.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        single_out, _ = single.communicate(timeout=120)
        torchrun_out, _ = torchrun.communicate(timeout=120)
    finally:
        for proc in (single, torchrun):
            if proc.poll() is None:
                proc.kill()
    assert single.returncode == 0, single_out
    assert torchrun.returncode == 0, torchrun_out
    assert "1 process(es) on cpu" in single_out and "2 process(es) on cpu" in torchrun_out
    assert "done: step 6" in single_out and "done: step 6" in torchrun_out
    assert _losses(single_out).keys() == {3, 6}
    assert _losses(single_out) == _losses(torchrun_out)  # printed to 4 decimals
    assert complete_steps(tmp_path / "ckpt") == [6]


@pytest.fixture
def head() -> Iterator[FakeHead]:
    server = FakeHead()
    yield server
    server.close()


def test_phalanx_job_reports_progress_checkpoints_on_notice_and_resumes(
    tmp_path: Path, head: FakeHead
) -> None:
    ckpt = tmp_path / "ckpt"
    phalanx_env = {
        "PHALANX_JOB_ID": "3",
        "PHALANX_HEAD": head.url,
        "PHALANX_STEP_TOKEN": "step-token",
        "PHALANX_CHECKPOINT_DIR": str(ckpt),
        "PHALANX_PREEMPT_DEADLINE": "300",  # seconds from the notice to the kill
    }
    argv = [EXAMPLE, "--preset", "tiny", "--steps", "500", "--log-every", "2"]
    job = launch.start(2, argv, tmp_path / "logs", phalanx_env)
    deadline = time.monotonic() + 120
    # The log file appears when the rank starts: until then, nothing to read.
    while not re.search(r"^step 4 \|", _text(job.logs[0]), re.M):
        assert job.running(), job.output()
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.02)
    job.signal(1, signal.SIGUSR1)  # the notice may reach only some ranks
    codes = job.wait(60)
    output = job.output()
    assert codes == [REQUEUE_EXIT_CODE] * 2, output
    stopped = re.search(r"preemption notice: checkpointing step (\d+), \d+ s before", output)
    assert stopped is not None, output
    step = int(stopped.group(1))
    assert complete_steps(ckpt) == [step] and 4 <= step < 500

    posted = [body for path, auth, body in head.requests]
    assert {path for path, _, _ in head.requests} == {"/v1/jobs/3/progress"}
    assert {auth for _, auth, _ in head.requests} == {"Bearer step-token"}
    assert {b["rank"] for b in posted} == {0}  # one reporter per node: local rank 0
    assert set(posted[0]) == {"rank", "step", "loss", "tokens_per_s", "mfu", "time"}
    assert [b["step"] for b in posted][:2] == [2, 4]

    requeued = launch.start(
        2, [*argv[:3], "--steps", str(step + 2)], tmp_path / "logs", phalanx_env
    )
    assert requeued.wait(120) == [0, 0], requeued.output()
    output = requeued.output()
    assert f"resumed from step {step}" in output and f"done: step {step + 2}" in output
    assert complete_steps(ckpt)[-1] == step + 2


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
