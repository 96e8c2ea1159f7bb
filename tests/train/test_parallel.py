"""Every parallel layout trains the same model to the same losses as one process, and a
checkpoint of one layout resumes on another number of processes.

Real processes on gloo (CPU), one per rank; the tiny GPT (2 blocks, d=32), the same
initial weights (seed 0), the same global batch of 8 sequences per step, 4 AdamW steps
with gradient clipping. Per-step global mean losses are compared with the one-process
run at rtol 1e-5 (fp32: only the order of floating-point reductions differs; the
observed differences are ~1e-7). bf16 mixed precision is compared at rtol 2e-2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from phalanx.train.checkpoint import complete_steps, read_marker, step_dir
from tests.train import launch, worker

WORKER = str(Path(worker.__file__).resolve())
RTOL = 1e-5


def _spec(tmp: Path, name: str, runs: list[dict[str, Any]]) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"out": str(tmp / f"{name}-out.json"), "runs": runs}))
    return path


def _results(tmp: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp / f"{name}-out.json").read_text())
    return data


def reference(tmp: Path, model: dict[str, Any] | None = None) -> list[float]:
    """The one-process losses, trained in this process (world size 1, no launcher)."""
    worker.main(str(_spec(tmp, "ref", [{"name": "ref", "model": model or {}}])))
    losses = _results(tmp, "ref")["ref"]["losses"]
    return [losses[k] for k in sorted(losses, key=int)]


def run_layouts(tmp: Path, world: int, runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    codes, output = launch.run(world, [WORKER, str(_spec(tmp, "job", runs))], tmp / "logs")
    assert codes == [0] * world, output
    out = _results(tmp, "job")
    return {name: [r["losses"][k] for k in sorted(r["losses"], key=int)] for name, r in out.items()}


def test_ddp_fsdp_tp_and_pp_on_two_processes_match_one_process(tmp_path: Path) -> None:
    runs = [
        {"name": "ddp", "parallel": {"dp": 2}},
        {"name": "fsdp", "parallel": {"dp": 1, "fsdp": 2}},
        {"name": "tp", "parallel": {"dp": 1, "tp": 2}},
        {"name": "pp 1F1B", "parallel": {"dp": 1, "pp": 2, "pp_schedule": "1F1B"}},
        {
            "name": "pp GPipe, 4 microbatches",
            "parallel": {"dp": 1, "pp": 2, "pp_schedule": "GPipe", "pp_microbatches": 4},
        },
        {
            "name": "fsdp + activation checkpointing + compile",
            "parallel": {
                "dp": 1,
                "fsdp": 2,
                "activation_checkpointing": True,
                "compile": "aot_eager",  # torch.compile's graph capture without a C++ build
            },
        },
        {"name": "fsdp bf16", "parallel": {"dp": 1, "fsdp": 2, "mixed_precision": "bf16"}},
    ]
    got = run_layouts(tmp_path, 2, runs)
    ref = reference(tmp_path)
    assert len(ref) == 4 and ref[-1] < ref[0]
    for name, losses in got.items():
        rtol = 2e-2 if "bf16" in name else RTOL
        assert losses == pytest.approx(ref, rel=rtol), f"{name}: {losses} vs {ref}"


def test_four_processes_2d_meshes_match_one_process_and_resume_on_two(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with_checkpoints = {"checkpoint_dir": str(ckpt), "checkpoint_every": 2, "keep_checkpoints": 5}
    runs = [
        {"name": "fsdp × tp", "parallel": {"dp": 1, "fsdp": 2, "tp": 2}, "train": with_checkpoints},
        {"name": "hsdp: dp × fsdp", "parallel": {"dp": 2, "fsdp": 2}},
        {"name": "dp × tp", "parallel": {"dp": 2, "tp": 2}},
        {"name": "pp × fsdp", "parallel": {"dp": 1, "pp": 2, "fsdp": 2}},
        {"name": "pp × tp", "parallel": {"dp": 1, "pp": 2, "tp": 2}},
    ]
    got = run_layouts(tmp_path, 4, runs)
    ref = reference(tmp_path)
    for name, losses in got.items():
        assert losses == pytest.approx(ref, rel=RTOL), f"{name}: {losses} vs {ref}"

    # The FSDP × TP checkpoint of step 2, resumed on two processes as plain FSDP: DCP
    # reshards the 2-D DTensors (and the optimizer state) to the new layout.
    assert complete_steps(ckpt) == [2, 4]
    marker = read_marker(ckpt, 2)
    assert marker["world_size"] == 4 and marker["parallel"]["tp"] == 2
    shutil.rmtree(step_dir(ckpt, 4))
    resume = [{"name": "resumed", "parallel": {"dp": 1, "fsdp": 2}, "train": with_checkpoints}]
    codes, output = launch.run(2, [WORKER, str(_spec(tmp_path, "two", resume))], tmp_path / "logs")
    assert codes == [0, 0], output
    resumed = _results(tmp_path, "two")["resumed"]
    assert resumed["start_step"] == 2 and sorted(resumed["losses"], key=int) == ["3", "4"]
    assert [resumed["losses"]["3"], resumed["losses"]["4"]] == pytest.approx(ref[2:], rel=RTOL)
