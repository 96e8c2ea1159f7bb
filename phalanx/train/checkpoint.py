"""Distributed checkpoints on torch.distributed.checkpoint: async save, complete marker, keep K,
resume from the newest complete one (resharded to the current layout by DCP).

Layout (a directory every rank can reach: shared storage on multi-node jobs):

    DIR/step_00000100/          one DCP checkpoint: every rank's *.distcp shards + .metadata
    DIR/step_00000100/COMPLETE  JSON {step, world_size, parallel, saved_at}; written last,
                                atomically (temp file + rename), by rank 0, only after
                                DCP's save returned on rank 0 — which happens only after
                                every rank's shards were written, fsynced and reported.

A directory without COMPLETE is a save that never finished; it is never loaded and is
deleted at the next start. After each completed save the oldest complete checkpoints
beyond `keep` are deleted, their marker first (so a half-deleted one is never loaded).

Rescue checkpoints: when a peer dies mid-step (its node crashed), the collective fails on
the survivors at once. Where every rank holds the whole model and optimizer (pure data
parallel), a survivor writes the state as of its last finished step on its own, with no
collective (DCP `no_dist`), into DIR/.rescue-STEP-rankR-PID with its COMPLETE marker
(`"rescue": true`, `"rng_ranks": [R]`), then renames it to DIR/step_STEP: the rename is
atomic and fails if that step exists, so the first survivor wins and a half-written rescue
is never seen. The restarted job resumes from it like from any checkpoint, so a node crash
loses the step in flight instead of everything since the last periodic save. Only the
rescuing rank's RNG streams are in it; the other ranks keep freshly seeded ones (logged).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from phalanx.train.errors import TrainConfigError
from phalanx.train.runtime import Runtime

log = logging.getLogger(__name__)

COMPLETE = "COMPLETE"
_PREFIX = "step_"
_RESCUE_PREFIX = ".rescue-"


class CheckpointError(RuntimeError):
    """A save failed and the Checkpointer was told to fail on errors."""


# DCP reports a failure on any rank as a CheckpointException, a BaseException.
_SAVE_ERRORS = (Exception, CheckpointException)


def step_dir(directory: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives."""
    return directory / f"{_PREFIX}{step:08d}"


def _step_of(path: Path) -> int | None:
    if not path.name.startswith(_PREFIX) or not path.is_dir():
        return None
    try:
        return int(path.name[len(_PREFIX) :])
    except ValueError:
        return None


def complete_steps(directory: Path) -> list[int]:
    """Steps with a COMPLETE marker, oldest first."""
    if not directory.is_dir():
        return []
    steps = [s for p in directory.iterdir() if (s := _step_of(p)) is not None]
    return sorted(s for s in steps if (step_dir(directory, s) / COMPLETE).is_file())


def read_marker(directory: Path, step: int) -> dict[str, Any]:
    """The COMPLETE marker of a step's checkpoint."""
    data: dict[str, Any] = json.loads((step_dir(directory, step) / COMPLETE).read_text())
    return data


class ModelOptimizerState:
    """Model and optimizer as one DCP Stateful, through DCP's state_dict helpers, which
    give names of the unwrapped model (no DDP/FSDP/compile prefixes) and sharded DTensors
    under FSDP/TP, so a checkpoint loads into any other layout of the same model."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module = module
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        """{"model": ..., "optim": ...}."""
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load both in place."""
        set_state_dict(
            self.module,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


class RNGState:
    """Every rank's random generators (torch CPU, CUDA of this device, Python's), stored
    under the rank's own key. After a resume on fewer ranks each rank takes its own
    rank's state; a rank new to the job, or one whose state a rescue checkpoint lacks,
    keeps its freshly seeded one (logged)."""

    def __init__(self, rank: int, cuda: bool = False) -> None:
        self.rank = rank
        self.cuda = cuda  # this rank trains on a CUDA device: save its generator too
        self.saved_ranks: frozenset[int] | None = None  # set before a load: which keys exist

    def _key(self) -> str:
        return f"rank{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        """{"rank<r>": {...}} for this rank, or {} if the checkpoint has no such rank."""
        if self.saved_ranks is not None and self.rank not in self.saved_ranks:
            return {}
        state: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate()}
        if self.cuda:
            state["cuda"] = torch.cuda.get_rng_state()
        return {self._key(): state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's generators."""
        mine = state.get(self._key())
        if mine is None:
            log.warning(
                "rank %d: no saved RNG state for this rank; keeping the seeded one", self.rank
            )
            return
        torch.set_rng_state(mine["cpu"])
        random.setstate(mine["python"])
        if "cuda" in mine and self.cuda:
            torch.cuda.set_rng_state(mine["cuda"])


class Checkpointer:
    """Saves and restores a dict of DCP Statefuls (model+optimizer, LR scheduler, RNG,
    data position, ...) under `directory`.

    With `async_save` the training loop blocks only while the state is staged (copied to
    CPU memory); DCP writes it from a background thread. One save is in flight at a time:
    a save that finds the previous one still writing waits for it. A failed save is
    logged and counted (`failures`) and training goes on, unless `fail_on_error`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rt: Runtime,
        *,
        keep: int = 3,
        async_save: bool = True,
        fail_on_error: bool = False,
    ) -> None:
        if keep < 1:
            raise TrainConfigError(f"keep must be ≥ 1 checkpoint, got {keep}")
        self.directory = Path(directory)
        self.rt = rt
        self.keep = keep
        self.async_save = async_save
        self.fail_on_error = fail_on_error
        self.failures = 0
        self.last_blocking_s = 0.0  # how long the last save() held the caller
        self.saved_steps: set[int] = set()
        self._pending: tuple[int, Future[Any]] | None = None
        self._stager: DefaultStager | None = None
        if rt.is_main:
            self.directory.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: Mapping[str, Any]) -> None:
        """Checkpoint `state` as of `step` (every rank calls this at the same step)."""
        start = time.perf_counter()
        self.wait()
        if step in self.saved_steps:
            return
        self.saved_steps.add(step)
        path = step_dir(self.directory, step)
        try:
            if self.async_save:
                future = dcp_async_save(
                    dict(state),
                    checkpoint_id=path,
                    process_group=self.rt.checkpoint_group,
                    async_stager=self._staging(),
                )
                assert isinstance(future, Future)  # the thread executor's answer
                self._pending = (step, future)
            else:
                dcp_save(dict(state), checkpoint_id=path, process_group=self.rt.checkpoint_group)
                self._complete(step)
        except _SAVE_ERRORS as exc:  # any storage error: report it, train on
            self._failed(step, exc)
        self.last_blocking_s = time.perf_counter() - start

    def _staging(self) -> DefaultStager:
        if self._stager is None:
            # Reused across saves: its CPU (pinned, on CUDA) buffers are allocated once.
            pinned = self.rt.device.type == "cuda"
            self._stager = DefaultStager(StagingOptions(pinned, False, False, False))
        return self._stager

    def poll(self) -> None:
        """Finish the in-flight save if it is done (marker, pruning); never blocks."""
        if self._pending is not None and self._pending[1].done():
            self.wait()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and marked complete."""
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        try:
            future.result()
        except _SAVE_ERRORS as exc:  # reported; see fail_on_error
            self._failed(step, exc)
            return
        self._complete(step)

    def _failed(self, step: int, exc: BaseException) -> None:
        self.failures += 1
        log.error("checkpoint of step %d failed: %s: %s", step, type(exc).__name__, exc)
        if self.fail_on_error:
            raise CheckpointError(f"checkpoint of step {step} failed: {exc}") from exc

    def _complete(self, step: int) -> None:
        if not self.rt.is_main:
            return
        try:
            self._write_marker(step_dir(self.directory, step), step)
            self._prune()
        except OSError as exc:
            self._failed(step, exc)

    def _write_marker(self, path: Path, step: int, **extra: Any) -> None:
        marker = {
            "step": step,
            "world_size": self.rt.world_size,
            "parallel": self.rt.config.degrees(),
            "saved_at": time.time(),
            **extra,
        }
        final = path / COMPLETE
        tmp = final.with_name(COMPLETE + ".tmp")
        tmp.write_text(json.dumps(marker))
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)

    def rescue(self, step: int, state: Mapping[str, Any]) -> Path | None:
        """Save `state` as `step`'s checkpoint from this rank alone, with no collective
        (see the module docstring): for a survivor whose peers died. Only sound where
        this rank's state is the whole job's (pure data parallel). The checkpoint's path,
        or None if `step` already has a complete one or the save failed (logged)."""
        final = step_dir(self.directory, step)
        if (final / COMPLETE).is_file():
            log.info("step %d already has a complete checkpoint: no rescue needed", step)
            return None
        tmp = self.directory / f"{_RESCUE_PREFIX}{step:08d}-rank{self.rt.rank}-{os.getpid()}"
        try:
            with warnings.catch_warnings():  # one process on purpose: no_dist says so
                warnings.filterwarnings("ignore", "torch.distributed is disabled")
                dcp_save(dict(state), checkpoint_id=tmp, no_dist=True)
            self._write_marker(tmp, step, rescue=True, rng_ranks=[self.rt.rank])
            if final.exists() and not (final / COMPLETE).is_file():
                # A periodic save of this step that the peer's death broke: move it aside
                # (atomically; removed at the next start) rather than delete it, so a
                # complete rescue another survivor just renamed there is never lost.
                with contextlib.suppress(OSError):
                    os.rename(final, tmp.with_name(tmp.name + "-broken"))
            os.rename(tmp, final)  # atomic; refused if another survivor was first
        except _SAVE_ERRORS as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if (final / COMPLETE).is_file():
                return None  # another rank rescued the same step first
            log.error("rescue checkpoint of step %d failed: %s: %s", step, type(exc).__name__, exc)
            return None
        return final

    def _prune(self) -> None:
        steps = complete_steps(self.directory)
        for old in steps[: max(len(steps) - self.keep, 0)]:
            path = step_dir(self.directory, old)
            (path / COMPLETE).unlink(missing_ok=True)  # unloadable first, then gone
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Wait for the in-flight save and release the staging buffers."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    # ---------------------------------------------------------------- resume
    def latest_step(self) -> int | None:
        """The newest complete step, agreed by all ranks (rank 0 looks, then broadcasts).
        Rank 0 also deletes unfinished saves left by an earlier run."""
        found = torch.tensor([-1], dtype=torch.long)
        if self.rt.is_main:
            self._remove_unfinished()
            steps = complete_steps(self.directory)
            if steps:
                found[0] = steps[-1]
        if self.rt.world_size > 1:
            dist.broadcast(found, src=0, group=self.rt.control_group)
        return None if found.item() < 0 else int(found.item())

    def _remove_unfinished(self) -> None:
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            unfinished = _step_of(path) is not None and not (path / COMPLETE).is_file()
            if unfinished or path.name.startswith(_RESCUE_PREFIX):
                log.warning("removing unfinished checkpoint %s", path)
                shutil.rmtree(path, ignore_errors=True)

    def load(self, step: int, state: Mapping[str, Any]) -> None:
        """Load `step`'s checkpoint into `state` in place (resharding as needed)."""
        path = step_dir(self.directory, step)
        marker = read_marker(self.directory, step)
        saved = frozenset(marker.get("rng_ranks", range(int(marker["world_size"]))))
        for value in state.values():
            if isinstance(value, RNGState):
                value.saved_ranks = saved
        try:
            dcp_load(dict(state), checkpoint_id=path, process_group=self.rt.checkpoint_group)
        except _SAVE_ERRORS as exc:  # DCP's CheckpointException is a BaseException
            raise TrainConfigError(f"cannot load checkpoint {path}: {exc}") from exc
        finally:
            for value in state.values():
                if isinstance(value, RNGState):
                    value.saved_ranks = None
        self.saved_steps.add(step)

    def resume(self, state: Mapping[str, Any]) -> int | None:
        """Load the newest complete checkpoint into `state`; its step, or None if none."""
        step = self.latest_step()
        if step is not None:
            self.load(step, state)
        return step
