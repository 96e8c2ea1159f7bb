"""dcgm-exporter's HPC job-mapping files (`phalanx agent --hpc-job-mapping-dir DIR`).

dcgm-exporter started with `--hpc-job-mapping-dir DIR` reads, at each collection, every
file in DIR whose name is a GPU index (`0`, `1`, …; other names are skipped) and labels
that GPU's series with `hpc_job="ID"` for each line of it (one job id per line; an empty
file: no label). The agent keeps one file per GPU of this node, holding the ids of the
jobs with a running rank on it, and rewrites a file only when its content changes,
atomically (written under a name dcgm-exporter skips, then renamed over it), so a reader
never sees half a file. Files for GPU indices this node does not have are removed.

`%n` in the directory stands for the node's name (several agents on one machine, as
Slurm's `%n` in slurm.conf).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger("phalanx.agent")
FILE_MODE = 0o644  # dcgm-exporter runs as another user; job ids are no secret
DIR_MODE = 0o755


def expand(directory: str, node: str) -> Path:
    """The directory with `%n` replaced by the node's name."""
    return Path(directory.replace("%n", node))


class JobMapWriter:
    """Keeps DIR/<gpu index> = the ids of the jobs on that GPU, one per line."""

    def __init__(self, directory: Path, gpus: Iterable[int]) -> None:
        self.directory = directory
        self.gpus = sorted(set(gpus))
        self._written: dict[int, str] = {}

    def prepare(self) -> None:
        """Create the directory, drop stale files (other indices, an earlier run's temp
        files) and write every GPU's file empty: no job until the first update says so.
        OSError if the directory cannot be made or written (the agent refuses to start)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        mine = {str(i) for i in self.gpus}
        for entry in self.directory.iterdir():
            stale = entry.name.isdigit() and entry.name not in mine
            if (stale or entry.name.startswith(".phalanx-")) and entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        self._written = {}
        self.update({})

    def update(self, jobs_by_gpu: Mapping[int, Iterable[int]]) -> list[int]:
        """Make each GPU's file list the jobs `jobs_by_gpu` names for it (none: empty);
        the GPUs whose file changed."""
        changed = []
        for gpu in self.gpus:
            text = "".join(f"{j}\n" for j in sorted(set(jobs_by_gpu.get(gpu, ()))))
            if self._written.get(gpu) == text:
                continue
            self._write(gpu, text)
            self._written[gpu] = text
            changed.append(gpu)
        return changed

    def _write(self, gpu: int, text: str) -> None:
        final = self.directory / str(gpu)
        temp = self.directory / f".phalanx-{gpu}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, FILE_MODE)  # whatever the agent's umask
        finally:
            os.close(fd)
        os.replace(temp, final)
