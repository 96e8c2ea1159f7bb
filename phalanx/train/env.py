"""Where a training process runs, read from the environment (torchrun's, Phalanx's, Slurm's)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.train.errors import TrainConfigError


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return value
    return None


def _int(environ: Mapping[str, str], *names: str, default: int) -> int:
    value = _first(environ, *names)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise TrainConfigError(f"{names[0]}={value!r} is not an integer") from None


@dataclass(frozen=True)
class DistEnv:
    """One process's place in the job.

    torchrun's variables win (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT); Phalanx's agent sets those too for its `torchrun` launcher. When they are
    absent, PHALANX_PROCID / PHALANX_NTASKS / PHALANX_LOCALID, then Slurm's SLURM_PROCID /
    SLURM_NTASKS / SLURM_LOCALID are read (an `srun` step), still with MASTER_ADDR/PORT.
    Nothing set at all means one process.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None  # PHALANX_JOB_ID (or SLURM_JOB_ID)
    restart_count: int = 0  # PHALANX_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT
    under_phalanx: bool = False  # launched by a Phalanx agent

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        """Read the environment; raise TrainConfigError when it is inconsistent."""
        env = os.environ if environ is None else environ
        world = _int(env, "WORLD_SIZE", "PHALANX_NTASKS", "SLURM_NTASKS", default=1)
        rank = _int(env, "RANK", "PHALANX_PROCID", "SLURM_PROCID", default=0)
        local_rank = _int(env, "LOCAL_RANK", "PHALANX_LOCALID", "SLURM_LOCALID", default=0)
        local_world = _int(
            env, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=min(world, 1 + local_rank)
        )
        if world < 1:
            raise TrainConfigError(f"WORLD_SIZE must be ≥ 1, got {world}")
        if not 0 <= rank < world:
            raise TrainConfigError(f"RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world})")
        addr = _first(env, "MASTER_ADDR")
        port_text = _first(env, "MASTER_PORT")
        port = _int(env, "MASTER_PORT", default=0) if port_text is not None else None
        if world > 1 and (addr is None or port is None):
            raise TrainConfigError(
                f"WORLD_SIZE={world} but MASTER_ADDR/MASTER_PORT are not set: launch with "
                "torchrun (python -m torch.distributed.run) or `phalanx submit`"
            )
        return cls(
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=max(local_world, 1),
            master_addr=addr,
            master_port=port,
            job_id=_first(env, "PHALANX_JOB_ID", "SLURM_JOB_ID"),
            restart_count=_int(
                env, "PHALANX_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", default=0
            ),
            under_phalanx=_first(env, "PHALANX_JOB_ID") is not None,
        )
