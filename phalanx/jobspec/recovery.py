"""How a job survives faults: checkpoint dir, preemption notice and grace, hang timeout."""

from __future__ import annotations

import posixpath
from typing import Any

from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.jobflags import signal_name
from phalanx.jobspec.options import SubmitOptions
from phalanx.jobspec.units import parse_duration

# JobSpec's bounds (phalanx.api.models), checked here so the message names the option.
MAX_PREEMPT_GRACE_S = 86400
MAX_HANG_TIMEOUT_S = 7 * 86400
# A notice must give the job a chance to checkpoint; these two cannot be caught.
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def recovery_fields(opts: SubmitOptions, workdir: str) -> dict[str, Any]:
    """The JobSpec fields of the fault-tolerance options that were given.

    `workdir` is the job's resolved (absolute) working directory: a relative
    `--checkpoint-dir` is taken from it.
    """
    fields: dict[str, Any] = {}
    if opts.restart_on_failure is not None:
        fields["restart_on_failure"] = opts.restart_on_failure
    if opts.checkpoint_dir is not None:
        fields["checkpoint_dir"] = checkpoint_dir(opts.checkpoint_dir, workdir)
    if opts.preempt_signal is not None:
        fields["preempt_signal"] = preempt_signal(opts.preempt_signal)
    if opts.preempt_grace is not None:
        fields["preempt_grace_s"] = parse_duration(
            "--preempt-grace", opts.preempt_grace, maximum=MAX_PREEMPT_GRACE_S
        )
    if opts.hang_timeout is not None:
        try:
            fields["hang_timeout_s"] = parse_duration(
                "--hang-timeout", opts.hang_timeout, maximum=MAX_HANG_TIMEOUT_S
            )
        except JobSpecError as exc:
            raise JobSpecError(f"{exc}; 0 turns the hang check off") from None
    return fields


def checkpoint_dir(given: str, workdir: str) -> str:
    """`--checkpoint-dir`, made absolute: a relative path is taken from the job's workdir.

    Resolved at submit time (not by the agent) so that the spec, the head's records and
    PHALANX_CHECKPOINT_DIR all show the one directory every restart uses.
    """
    raw = given.strip()
    if not raw:
        raise JobSpecError("--checkpoint-dir: the directory is empty")
    if raw.startswith("~"):
        # The shell expands `~` in a flag, but not in YAML or after `--checkpoint-dir=`;
        # taken literally it would name a directory called `~` under the workdir.
        raise JobSpecError(
            f"--checkpoint-dir={given}: '~' is not expanded here; give an absolute path or "
            "one relative to the job's working directory"
        )
    return posixpath.normpath(posixpath.join(workdir, raw))


def preempt_signal(text: str) -> str:
    """`USR1`, `sigusr1`, `SIGUSR1` or a number (`10`) → `SIGUSR1`; refuses SIGKILL/SIGSTOP."""
    where = f"--preempt-signal={text}"
    raw = text.strip()
    if not raw:
        raise JobSpecError(f"{where}: give a signal name, e.g. USR1 or SIGTERM")
    name = signal_name(where, raw)
    if name in _UNCATCHABLE:
        raise JobSpecError(
            f"{where}: {name} cannot be caught, so the job could not checkpoint before "
            "the kill; use a signal it can handle, e.g. USR1 or TERM"
        )
    return name
