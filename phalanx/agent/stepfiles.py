"""srun's `-o/--output` and `-e/--error` inside a job: each task's stream goes to a file named
by a Slurm pattern (`%t` task, `%j` job, `%N` node, `%n` node index, `%x` name, `%u` user,
`%A`/`%a` array ids, `%%`) instead of srun's own stdout/stderr.

submitit runs every job as `srun --unbuffered --output DIR/%j_%t_log.out --error
DIR/%j_%t_log.err python -m submitit.core._submit DIR`; TorchX as `srun
--output=slurm-$SLURM_JOB_ID-role-0.out …`. A pattern without a per-task field gathers every
task in one file, as Slurm does; `none` discards the stream. Files are opened for appending
(`--open-mode=append`, or $SLURM_OPEN_MODE) or truncated once when srun starts
(`truncate`, Slurm's default); either way srun then writes at the file's end, so lines the
batch script writes to the same file (submitit's batch output is task 0's file) are never
overwritten. A requeued job's later runs append by default, so its earlier runs' lines stay.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from phalanx.jobspec.patterns import expand_pattern

from .stepplan import SrunError

_MODES = {"append": True, "a": True, "truncate": False, "t": False}


def append_mode(option: str | None, environ: Mapping[str, str]) -> bool:
    """`--open-mode`, else $SLURM_OPEN_MODE, else append in a requeued job's later runs (so
    a checkpointing job keeps the lines of its earlier runs: submitit logs its checkpoint
    and requeue there) and truncate in its first (Slurm's JobFileAppend=0)."""
    text = option if option is not None else environ.get("SLURM_OPEN_MODE")
    if text is None:
        restarts = environ.get("SLURM_RESTART_COUNT", "0")
        text = "append" if restarts.isdigit() and int(restarts) > 0 else "truncate"
    try:
        return _MODES[text.strip().lower()]
    except KeyError:
        raise SrunError(f"--open-mode={text}: expected append or truncate") from None


@dataclass
class TaskFiles:
    """Where each task's streams go: a file per (stream, expanded pattern), or srun's own."""

    patterns: dict[str, str]  # "stdout"/"stderr" → pattern (absent: srun's own stream)
    environ: Mapping[str, str]
    nodes: list[str]  # the job's nodes in order (`%n` is the index)
    append: bool
    cwd: str = "."  # relative patterns are relative to the step's working directory (-D)
    _open: dict[str, TextIO] = field(default_factory=dict)

    def target(self, stream: str, task_id: int, node: str) -> TextIO | None:
        """The file task `task_id`'s `stream` goes to (opened once), or None for srun's own."""
        pattern = self.patterns.get(stream)
        if pattern is None:
            return None
        path = self._path(pattern, task_id, node)
        handle = self._open.get(path)
        if handle is None:
            try:
                if not self.append:
                    Path(path).open("w").close()  # truncate once; write at the end below
                handle = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            except OSError as e:
                raise SrunError(f"cannot open {stream} file {path}: {e.strerror}") from e
            self._open[path] = handle
        return handle

    def _path(self, pattern: str, task_id: int, node: str) -> str:
        if pattern.lower() == "none":
            return os.devnull
        env = self.environ

        def number(name: str) -> int | None:
            text = env.get(name, "")
            return int(text) if text.isdigit() else None

        expanded = expand_pattern(
            pattern,
            job_id=number("SLURM_JOB_ID") or 0,
            name=env.get("SLURM_JOB_NAME", ""),
            task=task_id,
            node=node,
            user=env.get("SLURM_JOB_USER") or env.get("USER", ""),
            array_job_id=number("SLURM_ARRAY_JOB_ID"),
            array_task_id=number("SLURM_ARRAY_TASK_ID"),
            node_id=self.nodes.index(node) if node in self.nodes else 0,
        )
        return os.path.abspath(os.path.join(self.cwd, expanded))

    def close(self) -> None:
        for handle in self._open.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._open.clear()
