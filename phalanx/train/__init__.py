"""phalanx.train: run a training script on many GPUs (or CPU processes) and survive restarts.

    import phalanx.train as pt
    rt = pt.init(pt.ParallelConfig(dp=1, fsdp=-1))     # process group, device, DeviceMesh
    torch.manual_seed(0); model = pt.GPT(pt.preset("small"))
    data = pt.ByteDataset.generated(seq_len=256)
    pt.Trainer(model, rt, data, pt.TrainConfig(steps=1000, checkpoint_dir="ckpt")).fit()

Needs the `train` extra (torch). Names load on first use, so `phalanx.train.env`,
`phalanx.train.errors` and `phalanx.train.preempt` (REQUEUE_EXIT_CODE) import without
torch; `import phalanx` never imports it. See docs/train.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.train.checkpoint import Checkpointer, ModelOptimizerState, RNGState
    from phalanx.train.data import BatchLoader, ByteDataset, generate_text
    from phalanx.train.env import DistEnv
    from phalanx.train.errors import TrainConfigError
    from phalanx.train.metrics import (
        PEAK_BF16_TFLOPS,
        ThroughputMeter,
        flops_per_token,
        measured_cpu_tflops,
        peak_tflops,
        peak_tflops_for,
    )
    from phalanx.train.model import GPT, PRESETS, GPTConfig, preset
    from phalanx.train.parallel import Parallelized, cross_entropy_loss, parallelize
    from phalanx.train.preempt import REQUEUE_EXIT_CODE, Preempted, PreemptionWatcher
    from phalanx.train.report import Progress, Reporter
    from phalanx.train.runtime import ParallelConfig, Runtime, init
    from phalanx.train.trainer import TrainConfig, Trainer, TrainResult

_WHERE = {
    "checkpoint": ["Checkpointer", "ModelOptimizerState", "RNGState"],
    "data": ["BatchLoader", "ByteDataset", "generate_text"],
    "env": ["DistEnv"],
    "errors": ["TrainConfigError"],
    "metrics": [
        "PEAK_BF16_TFLOPS",
        "ThroughputMeter",
        "flops_per_token",
        "measured_cpu_tflops",
        "peak_tflops",
        "peak_tflops_for",
    ],
    "model": ["GPT", "PRESETS", "GPTConfig", "preset"],
    "parallel": ["Parallelized", "cross_entropy_loss", "parallelize"],
    "preempt": ["REQUEUE_EXIT_CODE", "Preempted", "PreemptionWatcher"],
    "report": ["Progress", "Reporter"],
    "runtime": ["ParallelConfig", "Runtime", "init"],
    "trainer": ["TrainConfig", "Trainer", "TrainResult"],
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [
    "GPT",
    "PEAK_BF16_TFLOPS",
    "PRESETS",
    "REQUEUE_EXIT_CODE",
    "BatchLoader",
    "ByteDataset",
    "Checkpointer",
    "DistEnv",
    "GPTConfig",
    "ModelOptimizerState",
    "ParallelConfig",
    "Parallelized",
    "Preempted",
    "PreemptionWatcher",
    "Progress",
    "RNGState",
    "Reporter",
    "Runtime",
    "ThroughputMeter",
    "TrainConfig",
    "TrainConfigError",
    "TrainResult",
    "Trainer",
    "cross_entropy_loss",
    "flops_per_token",
    "generate_text",
    "init",
    "measured_cpu_tflops",
    "parallelize",
    "peak_tflops",
    "peak_tflops_for",
    "preset",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'phalanx.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"phalanx.train.{module}"), name)
    globals()[name] = value
    return value
