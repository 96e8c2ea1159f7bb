"""`parallelize()`: lay a model over the mesh with torch.distributed's own APIs, in one order.

The order, each step only when the config asks for it:

1. pipeline split (pp > 1): keep this rank's stage of the model (`model.keep_only`);
2. tensor parallelism (tp > 1): `parallelize_module(model, mesh["tp"], model.tp_plan())`;
3. activation checkpointing: the composable `checkpoint()` on every block of
   `model.layers` (parameter names do not change, so checkpoints stay interchangeable);
4. torch.compile of every block (`Module.compile`, names unchanged too);
5. data parallelism: FSDP2 `fully_shard` on every block then on the root, over mesh
   ["fsdp"] (or ["dp", "fsdp"]: HSDP) when fsdp > 1; `DistributedDataParallel` over
   mesh["dp"] when the layout is only dp; replicas combined with tp or pp use FSDP2's
   HSDP with a shard group of one instead (DDP cannot hold TP's DTensor parameters, and
   its reducer fails on a pipeline's several forwards before a backward);
6. pipeline schedule (pp > 1): a `PipelineStage` and `Schedule1F1B` or `ScheduleGPipe`.

TP before FSDP so that FSDP shards the DTensors TP made (2-D parameters); AC and compile
before FSDP so that FSDP's hooks wrap the recomputed, compiled blocks (torchtitan's order).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from phalanx.train.errors import TrainConfigError
from phalanx.train.runtime import Runtime

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (batch, seq, vocab), targets (batch, seq)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleDict | nn.ModuleList):
        return list(layers.values() if isinstance(layers, nn.ModuleDict) else layers)
    return []


class Parallelized:
    """A model laid out over the mesh, with the step that differs by layout.

    `module` is this rank's part (the whole model, or its pipeline stage), wrapped by FSDP
    or DDP as configured; give `parameters()` to the optimizer and checkpoint `module`.
    """

    def __init__(
        self,
        module: nn.Module,
        rt: Runtime,
        loss_fn: LossFn,
        schedule: Any | None,
        autocast: bool,
        tied: list[nn.Parameter] | None = None,
        tie_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.module = module
        # Pipeline stages at both ends holding one tied weight (GPT's embedding and head):
        # their gradients are summed so both copies take the same optimizer steps.
        self.tied = tied or []
        self.tie_group = tie_group
        self.rt = rt
        self.loss_fn = loss_fn
        self.schedule = schedule
        self._autocast = autocast
        pp = rt.config.pp
        self.first_stage = pp == 1 or rt.coordinate("pp") == 0
        self.last_stage = pp == 1 or rt.coordinate("pp") == pp - 1
        # The global loss is the mean over data-parallel ranks of the losses held by the
        # last pipeline stage; tensor-parallel ranks hold copies, so only tp rank 0 counts.
        owns_loss = self.last_stage and rt.coordinate("tp") == 0
        self.loss_weight = 1.0 / rt.dp_size if owns_loss else 0.0
        # The parameters the optimizer holds (FSDP's sharded ones, registered between
        # steps), listed once: walking the module tree every step costs real time.
        self._params = list(module.parameters())
        self._plain = pp == 1 and not any(isinstance(p, DTensor) for p in self._params)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (shards or DTensors under FSDP/TP)."""
        return iter(self._params)

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self._autocast:
            return torch.autocast(self.rt.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of one batch; gradients are left in `.grad`.

        Returns this rank's mean loss (detached), or None on a pipeline stage without the
        loss. Under pp the batch is cut into microbatches run by the schedule; their mean
        losses are averaged, which equals the whole batch's mean (equal microbatches).
        """
        if self.schedule is None:
            with self._precision():
                loss = self.loss_fn(self.module(inputs), targets)
            torch.autograd.backward(loss)
            return loss.detach()
        micro = self.rt.config.pp_microbatches or self.rt.config.pp
        if inputs.shape[0] % micro:
            raise TrainConfigError(
                f"the per-rank batch of {inputs.shape[0]} sequences does not split into "
                f"{micro} pipeline microbatches"
            )
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first_stage else ()
        with self._precision():
            if self.last_stage:
                self.schedule.step(*args, target=targets, losses=losses)
            else:
                self.schedule.step(*args)
        for p in self.tied:
            if p.grad is not None:
                grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(grad, group=self.tie_group)
        if not self.last_stage:
            return None
        return torch.stack([loss.detach() for loss in losses]).mean()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale gradients so their global L2 norm is at most max_norm; return the norm.

        torch's clip_grad_norm_ cannot mix DTensors on different meshes (FSDP × TP gives
        2-D and 1-D ones) with plain tensors, so norms are taken per mesh, combined, summed
        over pipeline stages (which hold disjoint parameters), and the local shards scaled.
        A layout of plain tensors on one stage (DDP, one process) takes torch's own path.
        """
        if self._plain:
            return torch.nn.utils.clip_grad_norm_(self._params, max_norm)
        # A tied weight's copy on the last stage is counted once, on the first stage.
        skip = {id(p) for p in self.tied} if not self.first_stage else set()
        groups: dict[Any, list[torch.Tensor]] = {}
        grads: list[torch.Tensor] = []
        for p in self._params:
            g = p.grad
            if g is None:
                continue
            grads.append(g.to_local() if isinstance(g, DTensor) else g)
            if id(p) not in skip:
                groups.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
        total_sq = torch.zeros((), device=self.rt.device, dtype=torch.float32)
        for gs in groups.values():
            norm = torch.nn.utils.get_total_norm(gs, 2.0)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            total_sq += norm.float() ** 2
        if self.rt.config.pp > 1:
            dist.all_reduce(total_sq, group=self.rt.mesh["pp"].get_group())
        total = total_sq.sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if grads:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        return total


def parallelize(
    model: nn.Module, rt: Runtime, loss_fn: LossFn = cross_entropy_loss
) -> Parallelized:
    """Lay `model` over `rt.mesh` as `rt.config` says (order in the module docstring).

    The model is expected whole and identical on every rank (build it after the same
    seed). It may offer `layers` (ModuleDict/ModuleList of blocks: the units of AC,
    compile and FSDP), `tp_plan()` (needed for tp > 1) and `keep_only(names, first,
    last)` (needed for pp > 1); phalanx.train.model.GPT has all three.
    """
    cfg = rt.config
    if cfg.pp > 1:
        from phalanx.train.pipeline import keep_stage

        keep_stage(model, rt)
    model.to(rt.device)
    if cfg.tp > 1:
        _apply_tp(model, rt)
    blocks = _blocks(model)
    if cfg.activation_checkpointing:
        from torch.distributed._composable.checkpoint_activation import checkpoint

        for block in blocks or [model]:
            checkpoint(block)
    if cfg.compile:
        backend = cfg.compile if isinstance(cfg.compile, str) else "inductor"
        for block in blocks or [model]:
            block.compile(backend=backend)
    module: nn.Module = model
    use_fsdp = cfg.fsdp > 1 or (cfg.dp > 1 and (cfg.tp > 1 or cfg.pp > 1))
    if use_fsdp:
        _apply_fsdp(model, blocks, rt)
    elif cfg.dp > 1:
        module = _apply_ddp(model, rt)
    schedule = None
    tied: list[nn.Parameter] = []
    group = None
    if cfg.pp > 1:
        from phalanx.train.pipeline import build_schedule, tie_group

        schedule = build_schedule(module, rt, loss_fn)
        names_fn = getattr(model, "pipeline_tied_parameters", None)
        names: list[str] = names_fn() if names_fn is not None else []
        tied = [model.get_parameter(name) for name in names]
        group = tie_group(rt)
    bf16 = cfg.mixed_precision == "bf16"
    return Parallelized(
        module, rt, loss_fn, schedule, autocast=bf16 and not use_fsdp, tied=tied, tie_group=group
    )


def _apply_tp(model: nn.Module, rt: Runtime) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    plan_fn = getattr(model, "tp_plan", None)
    if plan_fn is None:
        raise TrainConfigError(f"tp={rt.config.tp} needs a model with a tp_plan() method")
    check = getattr(model, "check_tp", None)
    if check is not None:
        check(rt.config.tp)
    parallelize_module(model, rt.mesh["tp"], plan_fn())


def _apply_fsdp(model: nn.Module, blocks: list[nn.Module], rt: Runtime) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = rt.config
    mesh = rt.mesh["dp", "fsdp"] if cfg.dp > 1 else rt.mesh["fsdp"]
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.mixed_precision == "bf16"
        else MixedPrecisionPolicy()
    )
    # Under pp each block runs once per microbatch: keep its parameters gathered between
    # forward and backward instead of re-gathering them every microbatch (torchtitan).
    reshard = cfg.pp == 1
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def _apply_ddp(model: nn.Module, rt: Runtime) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [rt.device.index] if rt.device.type == "cuda" else None
    return DistributedDataParallel(
        model, process_group=rt.mesh["dp"].get_group(), device_ids=device_ids
    )
