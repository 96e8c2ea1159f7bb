"""`init()`: the process group, the device and the DeviceMesh of a parallel layout."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from phalanx.train.env import DistEnv
from phalanx.train.errors import TrainConfigError

log = logging.getLogger(__name__)

# Outer to inner. tp is innermost so a tensor-parallel group is a run of consecutive ranks
# (the GPUs of one node, on NVLink); pp is outermost, its point-to-point traffic is light.
MESH_DIMS = ("pp", "dp", "fsdp", "tp")


@dataclass(frozen=True)
class ParallelConfig:
    """How the world is split: dp × fsdp × tp × pp must equal the number of processes.

    dp: replicas (DDP, or HSDP's replicate dimension when fsdp > 1); fsdp: FSDP2 shards;
    tp: tensor-parallel ranks (DTensor); pp: pipeline stages. One degree may be -1, "the
    rest of the world"; dp defaults to -1, so `ParallelConfig()` is plain DDP over all
    processes and `ParallelConfig(dp=1, fsdp=-1)` is FSDP over all of them.
    """

    dp: int = -1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    pp_schedule: Literal["1F1B", "GPipe"] = "1F1B"
    pp_microbatches: int | None = None  # None: pp (the fewest that keep every stage busy)
    activation_checkpointing: bool = False
    compile: bool | str = False  # True: torch.compile's default backend; a str names one
    mixed_precision: Literal["fp32", "bf16"] = "fp32"

    def degrees(self) -> dict[str, int]:
        """The degree of each mesh dimension, outer to inner."""
        return {"pp": self.pp, "dp": self.dp, "fsdp": self.fsdp, "tp": self.tp}

    def resolve(self, world_size: int) -> ParallelConfig:
        """Fill in the -1 degree and check the product; raise TrainConfigError if it fails."""
        degrees = self.degrees()
        bad = {k: v for k, v in degrees.items() if v == 0 or v < -1}
        if bad:
            raise TrainConfigError(f"parallel degrees must be ≥ 1 or -1 (the rest), got {bad}")
        free = [k for k, v in degrees.items() if v == -1]
        if len(free) > 1:
            raise TrainConfigError(
                f"only one parallel degree may be -1, got {free} (dp defaults to -1: "
                "set dp=1 to give the rest of the world to another dimension)"
            )
        fixed = 1
        for v in degrees.values():
            fixed *= v if v > 0 else 1
        if free:
            if world_size % fixed:
                raise TrainConfigError(
                    f"world size {world_size} is not divisible by "
                    f"{' × '.join(f'{k}={v}' for k, v in degrees.items() if v > 0)} = {fixed}"
                )
            degrees[free[0]] = world_size // fixed
        product = degrees["pp"] * degrees["dp"] * degrees["fsdp"] * degrees["tp"]
        if product != world_size:
            layout = " × ".join(f"{k}={v}" for k, v in degrees.items())
            raise TrainConfigError(
                f"{layout} = {product} processes, but the world size is {world_size}: "
                "the product of the parallel degrees must equal the number of processes"
            )
        if self.pp_schedule not in ("1F1B", "GPipe"):
            raise TrainConfigError(
                f"pp_schedule must be '1F1B' or 'GPipe', not {self.pp_schedule!r}"
            )
        if self.mixed_precision not in ("fp32", "bf16"):
            raise TrainConfigError(
                f"mixed_precision must be 'fp32' or 'bf16', not {self.mixed_precision!r}"
            )
        return replace(
            self, pp=degrees["pp"], dp=degrees["dp"], fsdp=degrees["fsdp"], tp=degrees["tp"]
        )


@dataclass
class Runtime:
    """What `init()` set up: use it to parallelize a model and to build a Trainer."""

    env: DistEnv
    config: ParallelConfig  # resolved: no -1 left
    device: torch.device
    backend: str
    mesh: DeviceMesh
    # Two private gloo groups on CPU, so that neither ever runs a collective concurrently
    # with another thread's: the control group (preemption flag, loss reduction, which
    # checkpoint to resume) is used by the training loop, the checkpoint group by DCP,
    # whose async save runs its collectives in a background thread.
    control_group: dist.ProcessGroup
    checkpoint_group: dist.ProcessGroup
    owns_process_group: bool = field(default=False, repr=False)

    @property
    def rank(self) -> int:
        """Global rank."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        """Rank 0: prints, writes markers."""
        return self.env.rank == 0

    def coordinate(self, dim: str) -> int:
        """This rank's index along one mesh dimension ("pp", "dp", "fsdp" or "tp")."""
        return int(self.mesh.get_local_rank(dim))

    @property
    def dp_size(self) -> int:
        """Data-parallel width: how many slices each global batch is cut into (dp × fsdp)."""
        return self.config.dp * self.config.fsdp

    @property
    def dp_rank(self) -> int:
        """Which slice of the global batch this rank reads (its (dp, fsdp) coordinate)."""
        return self.coordinate("dp") * self.config.fsdp + self.coordinate("fsdp")

    def shutdown(self) -> None:
        """Destroy the process group if `init()` created it."""
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_process_group = False


def pick_device(env: DistEnv, device: str | torch.device | None) -> torch.device:
    """The rank's device: the one asked for, else cuda:LOCAL_RANK when CUDA works, else CPU."""
    if device is not None:
        chosen = torch.device(device)
        if chosen.type == "cuda" and chosen.index is None:
            chosen = torch.device("cuda", env.local_rank % max(torch.cuda.device_count(), 1))
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init(
    config: ParallelConfig | None = None,
    *,
    device: str | torch.device | None = None,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> Runtime:
    """Join the job's process group and build its DeviceMesh.

    The environment decides the world (torchrun's or Phalanx's variables; none means one
    process). The backend is nccl for CUDA tensors with gloo beside it for CPU ones (async
    checkpointing needs a CPU backend), and gloo alone on CPU. Calling init() again in a
    process reuses the process group and builds a new mesh for the new config.
    """
    env = DistEnv.from_environ(environ)
    cfg = (config or ParallelConfig()).resolve(env.world_size)
    dev = pick_device(env, device)
    backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if not dist.is_initialized():
        _init_process_group(env, backend, timedelta(seconds=timeout_s), environ)
        owns = True
    elif dist.get_world_size() != env.world_size:
        raise TrainConfigError(
            f"a process group of {dist.get_world_size()} processes already exists, "
            f"but the environment says WORLD_SIZE={env.world_size}"
        )
    degrees = cfg.degrees()
    mesh = init_device_mesh(dev.type, tuple(degrees.values()), mesh_dim_names=MESH_DIMS)
    control = dist.new_group(backend="gloo")
    checkpoint = dist.new_group(backend="gloo")
    assert control is not None and checkpoint is not None  # every rank is a member
    if env.rank == 0:
        layout = " × ".join(f"{k}={v}" for k, v in degrees.items())
        log.info(
            "phalanx.train: %d process(es), %s, %s on %s", env.world_size, layout, backend, dev
        )
    return Runtime(
        env=env,
        config=cfg,
        device=dev,
        backend=backend,
        mesh=mesh,
        control_group=control,
        checkpoint_group=checkpoint,
        owns_process_group=owns,
    )


def _init_process_group(
    env: DistEnv, backend: str, timeout: timedelta, environ: Mapping[str, str] | None
) -> None:
    if env.world_size == 1:
        # One process: an in-memory store, no port to pick, yet DeviceMesh, DDP and DCP
        # run the same code as in a real job.
        dist.init_process_group(
            backend,
            store=dist.HashStore(),  # type: ignore[attr-defined]  # exported without __all__
            rank=0,
            world_size=1,
            timeout=timeout,
        )
        return
    source = os.environ if environ is None else environ
    if all(source.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) and (
        environ is None
    ):
        # torchrun's way: env:// also reuses torchrun's own store when it offers it.
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        return
    dist.init_process_group(
        backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
