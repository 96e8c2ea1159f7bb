"""Pipeline parallelism: cut the model into contiguous stages and run a 1F1B or GPipe schedule."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from phalanx.train.errors import TrainConfigError
from phalanx.train.runtime import Runtime


def stage_layers(names: list[str], stages: int, stage: int) -> list[str]:
    """The blocks of one stage: contiguous, as even as possible, earlier stages one more."""
    if len(names) < stages:
        raise TrainConfigError(
            f"pp={stages} stages need at least {stages} blocks, got {len(names)}"
        )
    per, extra = divmod(len(names), stages)
    start = stage * per + min(stage, extra)
    return names[start : start + per + (1 if stage < extra else 0)]


def keep_stage(model: nn.Module, rt: Runtime) -> None:
    """Prune `model` in place to this rank's stage (its blocks, plus the embeddings on the
    first stage and the head on the last), through the model's own `keep_only`."""
    layers = getattr(model, "layers", None)
    keep_only = getattr(model, "keep_only", None)
    if not isinstance(layers, nn.ModuleDict) or keep_only is None:
        raise TrainConfigError(
            "pp > 1 needs a model with `layers` (an nn.ModuleDict of blocks) and "
            "`keep_only(layer_names, first, last)`, like phalanx.train.model.GPT"
        )
    pp, stage = rt.config.pp, rt.coordinate("pp")
    keep_only(stage_layers(list(layers.keys()), pp, stage), stage == 0, stage == pp - 1)


def build_schedule(module: nn.Module, rt: Runtime, loss_fn: Any) -> Any:
    """A PipelineStage for this rank's module and its schedule over mesh["pp"].

    Microbatches default to pp, the fewest that let 1F1B keep every stage busy in steady
    state; more shrink the pipeline bubble ((pp − 1) / (microbatches + pp − 1) of a step).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    cfg = rt.config
    micro = cfg.pp_microbatches or cfg.pp
    if micro < 1:
        raise TrainConfigError(f"pp_microbatches must be ≥ 1, got {micro}")
    stage = PipelineStage(
        module,
        stage_index=rt.coordinate("pp"),
        num_stages=cfg.pp,
        device=rt.device,
        group=rt.mesh["pp"].get_group(),
    )
    schedule_cls = Schedule1F1B if cfg.pp_schedule == "1F1B" else ScheduleGPipe
    return schedule_cls(stage, n_microbatches=micro, loss_fn=loss_fn)


def tie_group(rt: Runtime) -> dist.ProcessGroup | None:
    """The group of this rank and its peer on the other end of the pipeline (same dp,
    fsdp and tp coordinates), over which tied parameters' gradients are summed; None on
    middle stages. Every rank creates every pair's group, as new_group requires."""
    pp = rt.config.pp
    columns = rt.mesh.mesh.reshape(pp, -1)
    mine: dist.ProcessGroup | None = None
    for col in range(columns.shape[1]):
        ranks = [int(columns[0, col]), int(columns[pp - 1, col])]
        group = dist.new_group(ranks)
        if rt.rank in ranks:
            mine = group
    return mine
