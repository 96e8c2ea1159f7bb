"""Checkpoints: kill -9 and resume to the same loss curve, resharding 4 → 2 processes, the
directory layout (complete marker, keep K, unfinished saves), async snapshots, failed saves."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import phalanx.train as pt
from phalanx.train.checkpoint import (
    COMPLETE,
    CheckpointError,
    complete_steps,
    read_marker,
    step_dir,
)
from tests.train import launch, worker

WORKER = str(Path(worker.__file__).resolve())


def _write_spec(path: Path, out: Path, run: dict[str, Any], step_sleep: float = 0.0) -> Path:
    path.write_text(json.dumps({"out": str(out), "step_sleep": step_sleep, "runs": [run]}))
    return path


def _losses(out: Path) -> tuple[int, dict[int, float]]:
    result = json.loads(out.read_text())["r"]
    return result["start_step"], {int(k): v for k, v in result["losses"].items()}


def _wait_while_running(job: launch.Ranks, done: Callable[[], bool]) -> None:
    """Until `done()`, failing if the job ends first or after 120 s."""
    deadline = time.monotonic() + 120
    while not done():
        assert job.running(), job.output()
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.02)


def _resume_matches(spec: Path, full: launch.Ranks, tmp_path: Path, step: int) -> None:
    """Run `spec` again on 2 ranks: it resumes from `step` and its losses from there equal
    those of the uninterrupted run `full` (out files as _write_spec names them)."""
    codes, output = launch.run(2, [WORKER, str(spec)], tmp_path / "logs")
    assert codes == [0, 0], output
    assert f"resumed from step {step}" in output
    assert full.wait(120) == [0, 0], full.output()
    start, resumed = _losses(tmp_path / "ck-out.json")
    _, uninterrupted = _losses(tmp_path / "full-out.json")
    assert start == step and sorted(resumed) == list(range(step + 1, 9))
    for n, loss in resumed.items():  # same world, data order and model state: bitwise equal
        assert loss == pytest.approx(uninterrupted[n], rel=1e-6, abs=0), n


def test_kill_9_mid_run_resumes_from_the_last_complete_checkpoint_on_the_same_curve(
    tmp_path: Path,
) -> None:
    # Dropout on: the resumed curve matches only if every rank's RNG state is restored too.
    model = {"dropout": 0.1}
    train = {"steps": 8}
    ckpt = tmp_path / "ckpt"
    checkpointed = {**train, "checkpoint_dir": str(ckpt), "checkpoint_every": 2}
    full_spec = _write_spec(
        tmp_path / "full.json",
        tmp_path / "full-out.json",
        {"name": "r", "model": model, "train": train},
    )
    spec = _write_spec(
        tmp_path / "ck.json",
        tmp_path / "ck-out.json",
        {"name": "r", "model": model, "train": {**checkpointed, "keep_checkpoints": 2}},
        step_sleep=0.15,  # slow steps, so the kill lands mid-run
    )
    full = launch.start(2, [WORKER, str(full_spec)], tmp_path / "logs")
    job = launch.start(2, [WORKER, str(spec)], tmp_path / "logs")
    _wait_while_running(job, lambda: (step_dir(ckpt, 4) / COMPLETE).is_file())
    job.kill()  # SIGKILL to every rank: no handler, no cleanup
    assert not (tmp_path / "ck-out.json").exists()
    newest = complete_steps(ckpt)[-1]
    assert 4 <= newest < 8

    _resume_matches(spec, full, tmp_path, newest)  # every rank's RNG restored too
    assert complete_steps(ckpt) == [6, 8]  # keep 2
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000006", "step_00000008"]


def test_a_survivor_rescues_the_last_finished_step_when_its_peer_dies(tmp_path: Path) -> None:
    # No periodic checkpoint before the end: only the rescue can save the finished steps.
    train = {"steps": 8}
    ckpt = tmp_path / "ckpt"
    full_spec = _write_spec(
        tmp_path / "full.json", tmp_path / "full-out.json", {"name": "r", "train": train}
    )
    spec = _write_spec(
        tmp_path / "ck.json",
        tmp_path / "ck-out.json",
        {"name": "r", "train": {**train, "checkpoint_dir": str(ckpt), "checkpoint_every": 100}},
        step_sleep=0.15,
    )
    full = launch.start(2, [WORKER, str(full_spec)], tmp_path / "logs")
    job = launch.start(2, [WORKER, str(spec)], tmp_path / "logs")
    _wait_while_running(job, lambda: "step 3 " in job.logs[0].read_text())
    job.signal(1, 9)  # rank 1's node "crashes": rank 0's next collective fails at once
    codes = job.wait(60)
    assert codes[1] == -9 and codes[0] not in (0, -9), (codes, job.output())
    rescued = complete_steps(ckpt)
    assert len(rescued) == 1 and 3 <= rescued[0] < 8, (rescued, job.output())
    step = rescued[0]
    marker = read_marker(ckpt, step)
    assert marker["rescue"] is True and marker["rng_ranks"] == [0]
    assert f"rescued step {step} to {step_dir(ckpt, step)}" in job.logs[0].read_text()
    assert [p.name for p in ckpt.iterdir()] == [step_dir(ckpt, step).name]  # no temp left

    _resume_matches(spec, full, tmp_path, step)  # model, optimizer, LR, data position


def test_no_rescue_where_a_rank_holds_only_a_shard(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    spec = _write_spec(
        tmp_path / "ck.json",
        tmp_path / "ck-out.json",
        {
            "name": "r",
            "parallel": {"dp": 1, "fsdp": 2},
            "train": {"steps": 8, "checkpoint_dir": str(ckpt), "checkpoint_every": 100},
        },
        step_sleep=0.15,
    )
    job = launch.start(2, [WORKER, str(spec)], tmp_path / "logs")
    _wait_while_running(job, lambda: "step 3 " in job.logs[0].read_text())
    job.signal(1, 9)
    codes = job.wait(60)
    assert codes[0] not in (0, -9), (codes, job.output())
    assert complete_steps(ckpt) == [], job.output()  # half a model is no checkpoint
    assert "rescued" not in job.output()


@pytest.fixture
def one_process() -> Iterator[pt.Runtime]:
    """A world of one in this process (an in-memory store: no port, no launcher)."""
    rt = pt.init(environ={})
    yield rt
    rt.shutdown()


def _state(seed: int) -> tuple[torch.nn.Linear, dict[str, Any]]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return model, {"model": pt.ModelOptimizerState(model, opt), "rng": pt.RNGState(0)}


def test_layout_markers_keep_k_and_unfinished_saves(
    one_process: pt.Runtime, tmp_path: Path
) -> None:
    ckpt = pt.Checkpointer(tmp_path, one_process, keep=2)
    _, state = _state(0)
    for step in range(1, 6):
        ckpt.save(step, state)
    ckpt.close()
    assert complete_steps(tmp_path) == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000005"]
    files = sorted(p.name for p in step_dir(tmp_path, 5).iterdir())
    assert files == [".metadata", COMPLETE, "__0_0.distcp"]
    assert read_marker(tmp_path, 5)["step"] == 5 and read_marker(tmp_path, 5)["world_size"] == 1
    # A save that died before its marker: never loaded, removed at the next start.
    unfinished = step_dir(tmp_path, 9)
    unfinished.mkdir()
    (unfinished / "__0_0.distcp").write_bytes(b"half")
    assert pt.Checkpointer(tmp_path, one_process).latest_step() == 5
    assert not unfinished.exists()


def test_a_rescue_replaces_a_broken_save_of_its_step_but_not_a_complete_one(
    one_process: pt.Runtime, tmp_path: Path
) -> None:
    ckpt = pt.Checkpointer(tmp_path, one_process)
    model, state = _state(0)
    broken = step_dir(tmp_path, 7)  # a periodic save the peer's death cut short
    broken.mkdir()
    (broken / "__0_0.distcp").write_bytes(b"half")
    assert ckpt.rescue(7, state) == broken
    assert read_marker(tmp_path, 7)["rescue"] is True
    ckpt.save(8, state)
    ckpt.close()
    assert ckpt.rescue(8, state) is None  # already complete: left as it is
    assert "rescue" not in read_marker(tmp_path, 8)
    # The broken save was moved aside, and goes at the next start like any leftover.
    assert pt.Checkpointer(tmp_path, one_process).latest_step() == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000007", "step_00000008"]
    torch.manual_seed(1)
    fresh, loaded = _state(1)
    pt.Checkpointer(tmp_path, one_process).load(7, loaded)
    assert torch.equal(fresh.weight, model.weight)


def test_async_save_snapshots_the_state_when_it_returns(
    one_process: pt.Runtime, tmp_path: Path
) -> None:
    model, state = _state(0)
    expected = model.weight.detach().clone()
    ckpt = pt.Checkpointer(tmp_path, one_process)
    ckpt.save(1, state)  # returns once staged; written in the background
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on and changes the weights
    ckpt.close()
    fresh, fresh_state = _state(1)
    assert not torch.equal(fresh.weight, expected)
    assert pt.Checkpointer(tmp_path, one_process).resume(fresh_state) == 1
    assert torch.equal(fresh.weight, expected)


def test_a_failed_save_is_logged_and_training_goes_on(
    one_process: pt.Runtime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "step_00000002").write_text("a file where the checkpoint directory should go")
    torch.manual_seed(0)
    model = pt.GPT(pt.preset("tiny"))
    data = pt.ByteDataset.generated(seq_len=64, n_bytes=1 << 14)
    config = pt.TrainConfig(steps=4, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with caplog.at_level(logging.ERROR, logger="phalanx.train.checkpoint"):
        result = pt.Trainer(model, one_process, data, config).fit()
    assert result.final_step == 4 and result.checkpoint_failures == 1
    assert complete_steps(tmp_path) == [4]
    assert any("checkpoint of step 2 failed" in r.getMessage() for r in caplog.records)
    strict = pt.Checkpointer(tmp_path, one_process, fail_on_error=True, async_save=False)
    _, state = _state(0)
    (tmp_path / "step_00000007").write_text("in the way")
    with pytest.raises(CheckpointError, match="checkpoint of step 7 failed"):
        strict.save(7, state)
