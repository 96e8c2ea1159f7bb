"""Slurm filename patterns for `-o/--output` and `-e/--error`: `%j`, `%x`, `%5j`, …"""

from __future__ import annotations

import re

NO_VAL = 4_294_967_294  # what Slurm writes for %a in a job that is not an array task
MAX_PAD = 10  # Slurm caps the zero padding of `%<n>j` at 10 digits
_TOKEN = re.compile(r"%(?:%|([0-9]*)([jJxtNunAa]))")


def expand_pattern(
    pattern: str,
    *,
    job_id: int,
    name: str,
    task: int,
    node: str,
    user: str,
    array_job_id: int | None,
    array_task_id: int | None,
    node_id: int = 0,
) -> str:
    """Fill in a Slurm filename pattern, as sbatch does for `--output` and `--error`.

    `%j` job id, `%J` the same (Slurm's `jobid.stepid` is the job id outside a step: the
    batch script, or a rank here), `%x` job name, `%t` task (rank), `%N` node name, `%n`
    node index in the job, `%u` user, `%A` array master job id, `%a` array task id, `%%` a
    literal `%`.
    A number after `%` zero-pads numeric values (`%5j` → `00042`; at most 10, ignored for
    text). Outside an array, `%A` is the job id and `%a` is 4294967294, as in Slurm. A
    pattern containing a backslash is not expanded; its backslashes are removed (Slurm's
    `\\` escape). Other `%` sequences are left as they are.
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")
    in_array = array_task_id is not None
    numbers = {
        "j": job_id,
        "J": job_id,  # jobid.stepid in Slurm; the batch step and ranks add no step id
        "t": task,
        "n": node_id,
        "A": array_job_id if in_array and array_job_id is not None else job_id,
        "a": array_task_id if array_task_id is not None else NO_VAL,
    }
    texts = {"x": name, "N": node, "u": user}

    def substitute(match: re.Match[str]) -> str:
        pad, code = match.groups()
        if code is None:
            return "%"
        if code in texts:
            return texts[code]
        width = min(int(pad), MAX_PAD) if pad else 0
        return str(numbers[code]).zfill(width)

    return _TOKEN.sub(substitute, pattern)
