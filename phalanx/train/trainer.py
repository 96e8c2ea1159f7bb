"""`Trainer`: the training loop that ties parallelism, checkpoints, preemption and metrics."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phalanx.train.checkpoint import Checkpointer, ModelOptimizerState, RNGState
from phalanx.train.data import BatchLoader, ByteDataset
from phalanx.train.errors import TrainConfigError
from phalanx.train.metrics import StepStats, ThroughputMeter, peak_tflops
from phalanx.train.parallel import LossFn, Parallelized, cross_entropy_loss, parallelize
from phalanx.train.preempt import Preempted, PreemptionWatcher
from phalanx.train.report import Progress, Reporter
from phalanx.train.runtime import Runtime

log = logging.getLogger(__name__)

CHECKPOINT_DIR_ENV = "PHALANX_CHECKPOINT_DIR"
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class TrainConfig:
    """What to train for and how often to log and checkpoint.

    global_batch is in sequences per step over the whole job (each data-parallel rank
    reads global_batch / (dp × fsdp) of them). checkpoint_dir None means
    $PHALANX_CHECKPOINT_DIR, and no checkpoints when that is unset too.
    """

    steps: int
    global_batch: int = 8
    lr: float = 3e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # cosine decay ends at lr × this
    weight_decay: float = 0.1
    max_grad_norm: float | None = 1.0
    seed: int = 0
    log_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    async_checkpoint: bool = True
    rescue: bool = True  # a survivor of a peer's death saves the last finished step
    resume: bool = True


@dataclass
class TrainResult:
    """What fit() did: the step it began from (0 or the resumed one), the step it reached,
    and the global mean loss of every logged step."""

    start_step: int
    final_step: int
    losses: dict[int, float] = field(default_factory=dict)
    last_stats: StepStats | None = None
    checkpoint_failures: int = 0


@contextlib.contextmanager
def _sigterm_deferred() -> Iterator[None]:
    """Ignore SIGTERM inside (main thread only; elsewhere nothing changes): the agent's
    SIGTERM of a torn-down gang must not cut a rescue short, its SIGKILL still does."""
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Fixed:
    """A DCP Stateful that saves a state taken earlier (a rescue's step-start values)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:  # never loaded into
        raise NotImplementedError


class _StepCounter:
    """The trainer's step as a DCP Stateful."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.trainer.current_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.current_step = int(state["step"])


def cosine_schedule(cfg: TrainConfig) -> Callable[[int], float]:
    """LR multiplier: linear warm-up, then cosine down to min_lr_ratio at cfg.steps."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(cfg.steps - cfg.warmup_steps, 1)
        progress = min((step - cfg.warmup_steps) / span, 1.0)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def default_optimizer(cfg: TrainConfig) -> OptimizerFactory:
    """AdamW(β = 0.9, 0.95); weight decay on matrices only (not biases, norms)."""

    def build(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        plist = list(params)
        groups = [
            {"params": [p for p in plist if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in plist if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))

    return build


class Trainer:
    """Train `model` on `data` as `rt` lays it out.

        rt = phalanx.train.init(ParallelConfig(fsdp=2, tp=2, dp=1))
        torch.manual_seed(0); model = GPT(preset("small"))
        Trainer(model, rt, ByteDataset.generated(256), TrainConfig(steps=1000)).fit()

    fit() resumes from the newest complete checkpoint, then each step: next batch,
    forward + backward, clip, optimizer and LR step; it logs every log_every steps (the
    global mean loss, tokens/s, TFLOP/s per device, MFU), checkpoints every
    checkpoint_every steps and at the end, and on a preemption notice checkpoints and
    raises Preempted (exit code 75). Under pure data parallelism a rank whose step fails
    (a peer died: its collective errors at once) writes a rescue checkpoint of the last
    finished step on its own before the error propagates (see phalanx.train.checkpoint).
    """

    def __init__(
        self,
        model: nn.Module,
        rt: Runtime,
        data: ByteDataset,
        config: TrainConfig,
        *,
        optimizer: OptimizerFactory | None = None,
        lr_lambda: Callable[[int], float] | None = None,
        loss_fn: LossFn = cross_entropy_loss,
    ) -> None:
        if config.steps < 0 or config.log_every < 1 or config.checkpoint_every < 1:
            raise TrainConfigError("steps must be ≥ 0, log_every and checkpoint_every ≥ 1")
        model_cfg = getattr(model, "cfg", None)
        max_len = getattr(model_cfg, "seq_len", None)
        if isinstance(max_len, int) and data.seq_len > max_len:
            raise TrainConfigError(
                f"the data's sequences ({data.seq_len} tokens) are longer than the model's "
                f"context ({max_len})"
            )
        micro = rt.config.pp_microbatches or rt.config.pp
        if rt.config.pp > 1 and (config.global_batch // max(rt.dp_size, 1)) % micro:
            raise TrainConfigError(
                f"global batch {config.global_batch} over {rt.dp_size} data-parallel ranks "
                f"does not split into {micro} pipeline microbatches per rank"
            )
        self.rt = rt
        self.config = config
        self.current_step = 0
        fpt_fn = getattr(model, "flops_per_token", None)
        flops: float | None = float(fpt_fn(data.seq_len)) if callable(fpt_fn) else None
        self.model: Parallelized = parallelize(model, rt, loss_fn)
        self.optimizer = (optimizer or default_optimizer(config))(self.model.parameters())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda or cosine_schedule(config)
        )
        self.loader = BatchLoader(
            data, config.global_batch, rt.dp_rank, rt.dp_size, config.seed, rt.device
        )
        # Training randomness (dropout): one stream per data-parallel rank and stage,
        # shared by the tensor-parallel ranks, which must drop the same activations.
        seed = config.seed + 7919 * rt.dp_rank + 104729 * rt.coordinate("pp")
        torch.manual_seed(seed)
        random.seed(seed)
        directory = config.checkpoint_dir or os.environ.get(CHECKPOINT_DIR_ENV) or None
        self.checkpointer = (
            Checkpointer(
                directory, rt, keep=config.keep_checkpoints, async_save=config.async_checkpoint
            )
            if directory
            else None
        )
        self.state: dict[str, Any] = {
            "model": ModelOptimizerState(self.model.module, self.optimizer),
            "lr_scheduler": self.scheduler,
            "data": self.loader,
            "rng": RNGState(rt.rank, cuda=rt.device.type == "cuda"),
            "trainer": _StepCounter(self),
        }
        # Every rank holds the whole model and optimizer: a survivor alone can save them.
        # Not on CUDA yet: NCCL reports a failed collective asynchronously, so a survivor
        # cannot tell that its last optimizer step used fully reduced gradients (gloo
        # raises in the collective itself); enabling it there needs a GPU test.
        degrees = rt.config.degrees()
        self.rescuable = (
            config.rescue
            and self.checkpointer is not None
            and rt.world_size > 1
            and rt.device.type == "cpu"
            and degrees["fsdp"] == degrees["tp"] == degrees["pp"] == 1
        )
        self.watcher = PreemptionWatcher(rt.control_group if rt.world_size > 1 else None)
        self.reporter = Reporter(rt.rank, rt.env.local_rank)
        self.meter = ThroughputMeter(
            config.global_batch * data.seq_len, rt.world_size, flops, peak_tflops(rt.device)
        )
        self.result = TrainResult(start_step=0, final_step=0)
        self._last_loss: torch.Tensor | None = None
        # The last checkpoint saved: (step, seconds its save held training), for reports.
        self._last_checkpoint: tuple[int, float] | None = None

    # ------------------------------------------------------------------ loop
    def resume(self) -> int:
        """Load the newest complete checkpoint if there is one; the step to start from."""
        if self.checkpointer is not None and self.config.resume:
            step = self.checkpointer.resume(self.state)
            if step is not None and self.rt.is_main:
                print(f"resumed from step {step} ({self.checkpointer.directory})", flush=True)
        self.result = TrainResult(start_step=self.current_step, final_step=self.current_step)
        return self.current_step

    def fit(self) -> TrainResult:
        """Resume, train to config.steps, save a final checkpoint; see the class docstring."""
        self.watcher.install()
        try:
            self.resume()
            self.meter.restart()
            while self.current_step < self.config.steps:
                self.train_step()
            self.watcher.drain()
            self.save()
        finally:
            self.close()
        return self.result

    def train_step(self) -> None:
        """One optimizer step with its bookkeeping (log, checkpoint, preemption check)."""
        start = self._step_start() if self.rescuable else None
        try:
            self._compute()
        except RuntimeError as exc:  # torch.distributed's errors are RuntimeErrors
            if start is not None:  # the model and optimizer are still at the step's start
                self._rescue(start, exc)
            raise
        try:
            self._bookkeeping()
        except RuntimeError as exc:
            if self.rescuable:  # the step finished: rescue the state as it is now
                self._rescue(self._step_start(), exc)
            raise

    def _compute(self) -> None:
        cfg = self.config
        inputs, targets = self.loader.next_batch()
        self.optimizer.zero_grad(set_to_none=True)
        self._last_loss = self.model.forward_backward(inputs, targets)
        if cfg.max_grad_norm is not None:
            self.model.clip_grad_norm_(cfg.max_grad_norm)
        self.optimizer.step()  # no collective under data parallelism: it cannot fail halfway
        self.scheduler.step()
        self.current_step += 1
        self.result.final_step = self.current_step

    def _step_start(self) -> dict[str, Any]:
        """What the model and optimizer do not hold of the state at a step boundary."""
        return {
            "data": _Fixed(dict(self.loader.state_dict())),
            "rng": _Fixed(self.state["rng"].state_dict()),
            "trainer": _Fixed({"step": self.current_step}),
        }

    def _rescue(self, start: dict[str, Any], exc: BaseException) -> None:
        assert self.checkpointer is not None
        step = start["trainer"].state["step"]
        if step == self.result.start_step or not self.optimizer.state:
            return  # nothing trained since this run began: its restart starts there anyway
        state = {**self.state, **start}
        with _sigterm_deferred():  # the gang's teardown waits the kill grace for it
            path = self.checkpointer.rescue(step, state)
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        what = f"rank {self.rt.rank}: step {step + 1} failed ({type(exc).__name__}: {reason})"
        if path is not None:
            print(f"{what}; rescued step {step} to {path}", flush=True)

    def _bookkeeping(self) -> None:
        cfg = self.config
        self.meter.step()
        if self.checkpointer is not None:
            self.checkpointer.poll()
        stop = self.watcher.should_stop()
        step = self.current_step
        if step % cfg.log_every == 0 or step == cfg.steps or stop:
            self._log()
        if stop and step < cfg.steps:  # a notice at the last step: just finish normally
            self._preempt()
        if step % cfg.checkpoint_every == 0 and step < cfg.steps:
            self.save()

    def global_loss(self) -> float | None:
        """The last step's loss averaged over data-parallel ranks (a collective)."""
        mine = 0.0 if self._last_loss is None else float(self._last_loss) * self.model.loss_weight
        if self.rt.world_size == 1:
            return None if self._last_loss is None else mine
        total = torch.tensor([mine], dtype=torch.float64)
        dist.all_reduce(total, group=self.rt.control_group)
        return float(total.item())

    def _log(self) -> None:
        loss = self.global_loss()
        stats = self.meter.read()
        self.result.last_stats = stats
        if loss is not None:
            self.result.losses[self.current_step] = loss
        progress = Progress(
            rank=self.rt.rank,
            step=self.current_step,
            loss=loss,
            tokens_per_s=stats.tokens_per_s if stats else None,
            mfu=stats.mfu if stats else None,
            time=time.time(),
            checkpoint_step=None if self._last_checkpoint is None else self._last_checkpoint[0],
            checkpoint_s=None if self._last_checkpoint is None else self._last_checkpoint[1],
        )
        self.reporter.report(
            progress,
            step_time_s=stats.step_time_s if stats else None,
            tflops=stats.tflops_per_device if stats else None,
        )

    def save(self) -> None:
        """Checkpoint the current step now (no-op without a checkpoint directory)."""
        if self.checkpointer is None:
            return
        failures = self.checkpointer.failures
        self.checkpointer.save(self.current_step, self.state)
        if self.checkpointer.failures == failures:
            self._last_checkpoint = (self.current_step, self.checkpointer.last_blocking_s)
        self.result.checkpoint_failures = self.checkpointer.failures
        self.meter.restart()  # a blocking save is not part of step time

    def _preempt(self) -> None:
        left = self.watcher.seconds_left()
        if self.rt.is_main:
            note = "" if left is None else f", {left:.0f} s before the deadline"
            print(f"preemption notice: checkpointing step {self.current_step}{note}", flush=True)
        if self.checkpointer is None:
            log.warning("preempted without a checkpoint directory: the requeued job restarts")
        else:
            self.watcher.drain()
            self.save()
            self.checkpointer.wait()
        raise Preempted(self.current_step)

    def close(self) -> None:
        """Wait for the last checkpoint, stop the reporter, restore the signal handler."""
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
                self.result.checkpoint_failures = self.checkpointer.failures
        finally:
            self.watcher.uninstall()
            self.reporter.close()
