"""How a job sets what the fake GPUs it holds report (tests, demos, CPU-only clusters).

Two ways, both only with `phalanx agent --fake-gpus N` (real GPUs report what they do):

- **Declare** it in the job's environment (`env:` in the spec, or `--export`):
  `PHALANX_FAKE_GPU_UTIL=35` sets every GPU the job holds to 35%; a comma-separated list
  (`PHALANX_FAKE_GPU_UTIL=90,90,0,0`) sets each of its GPUs on a node in order (the last
  value repeats). `PHALANX_FAKE_GPU_MEM_PCT=10` sets the memory used, as a % of the GPU's
  (default: follows utilisation).
- **Drive** it at run time: each rank finds the path of a file it owns in
  `$PHALANX_FAKE_GPU_UTIL_FILE` and writes a percentage into it (`echo 20 > "$F"`). The
  file of local rank *i* drives the job's *i*-th GPU on the node; a GPU whose rank wrote
  nothing (a `node` or `batch` job: one process for all GPUs) follows local rank 0's file.
  A driven value wins over a declared one; an empty or unreadable file counts as unset.

A GPU held by a job that does neither shows ~95% busy; a GPU nobody holds shows 0%.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .cgroups import JobCgroup
from .gpus import FakeLoad

UTIL_ENV = "PHALANX_FAKE_GPU_UTIL"
MEM_ENV = "PHALANX_FAKE_GPU_MEM_PCT"
FILE_ENV = "PHALANX_FAKE_GPU_UTIL_FILE"
_MAX_READ = 64  # bytes read from a driven file: a number, not a file's worth


@dataclass(frozen=True)
class Holding:
    """A running job's share of this node, as the telemetry sampler and the fake GPUs see
    it: its GPUs in order, its declared environment, its launch directory, its cgroup
    (None: jobs are not confined here) and its ranks' process ids."""

    job_id: int
    epoch: int
    gpus: tuple[int, ...]
    env: Mapping[str, str]
    job_dir: Path
    cgroup: JobCgroup | None
    pids: tuple[int, ...]
    cpus: int  # CPUs the job may use here (0: unknown)


def util_file(job_dir: Path, local_rank: int) -> Path:
    """The file local rank `local_rank` of a launch writes its GPU's utilisation into."""
    return job_dir / f"fake-gpu-util.{local_rank}"


def declared(value: str | None, n: int) -> list[float | None]:
    """`PHALANX_FAKE_GPU_UTIL`'s value for a job's `n` GPUs on a node (None: not set or
    not a number; values outside 0–100 are clamped)."""
    if not value or n <= 0:
        return [None] * max(n, 0)
    parts = [_number(p) for p in value.split(",")[:n]]
    return [parts[min(i, len(parts) - 1)] for i in range(n)]


def read_driven(path: Path) -> float | None:
    """The percentage a rank wrote into its file; None when there is none (no file, empty,
    not a number, not a regular file). Never follows a symlink: the job owns the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none yet, a symlink (ELOOP), not ours to read
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_READ)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _number(data.decode("ascii", errors="replace"))


def loads(holdings: Iterable[Holding]) -> dict[int, FakeLoad]:
    """GPU index → the FakeLoad its holder declares or drives."""
    out: dict[int, FakeLoad] = {}
    for h in holdings:
        util = declared(h.env.get(UTIL_ENV), len(h.gpus))
        mem = _number(h.env.get(MEM_ENV) or "")
        first = read_driven(util_file(h.job_dir, 0)) if h.gpus else None
        for i, gpu in enumerate(h.gpus):
            driven = first if i == 0 else read_driven(util_file(h.job_dir, i))
            if driven is None:
                driven = first
            out[gpu] = FakeLoad(
                utilization_pct=driven if driven is not None else util[i], memory_pct=mem
            )
    return out


def _number(text: str) -> float | None:
    """A percentage 0–100 from text ("35", " 35.5\\n", "35%"); None if not a number."""
    text = text.strip().rstrip("%").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return min(100.0, max(0.0, value))
