"""A training job for the tests, on phalanx.train's public API: `python worker.py SPEC.json`.

SPEC: {"out": path, "runs": [{"name", "parallel": {...}, "model": {...}, "train": {...}}],
"step_sleep": seconds}. Each run trains the tiny GPT preset (with overrides) in this
process group; rank 0 writes {name: {"losses", "start_step", "final_step",
"checkpoint_failures"}} to `out`. A preemption exits with code 75 before writing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import phalanx.train as pt


class SlowBytes(pt.ByteDataset):
    """The generated dataset, sleeping per batch so a test can signal or kill mid-run."""

    sleep_s = 0.0

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep_s)
        return super().batch(indices)


def main(spec_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    results: dict[str, Any] = {}
    rt: pt.Runtime | None = None
    for run in spec["runs"]:
        rt = pt.init(pt.ParallelConfig(**run.get("parallel", {})))
        torch.manual_seed(0)
        model = pt.GPT(pt.preset("tiny", **run.get("model", {})))
        base = pt.ByteDataset.generated(seq_len=model.cfg.seq_len, n_bytes=1 << 15)
        data = SlowBytes(base.tokens, base.seq_len)
        data.sleep_s = float(spec.get("step_sleep", 0.0))
        train = {"steps": 4, "global_batch": 8, "log_every": 1, "lr": 3e-3, **run.get("train", {})}
        result = pt.Trainer(model, rt, data, pt.TrainConfig(**train)).fit()
        results[run["name"]] = {
            "losses": {str(k): v for k, v in result.losses.items()},
            "start_step": result.start_step,
            "final_step": result.final_step,
            "checkpoint_failures": result.checkpoint_failures,
        }
    if rt is not None and rt.is_main:
        out = Path(spec["out"])
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results))
        tmp.replace(out)
    if rt is not None:
        rt.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
