"""What the agent refuses to launch (LaunchFailed): invalid assignments, unusable output paths,
a working directory that is not there."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from phalanx.api.models import Assignment, DesiredState, validation_detail

LAUNCH_FAILED = "LaunchFailed: "


@dataclass(frozen=True)
class Refused:
    """A job of the desired state this agent cannot even read: it reports the job's rank
    as failed to launch (the head fails the job, without requeueing it) and starts nothing."""

    job_id: int
    epoch: int
    rank: int  # best effort: the first global rank this node would have run
    why: str  # "LaunchFailed: …"


class InvalidDesiredState(ValueError):
    """The head's answer is not a desired state at all (not even job by job)."""


def parse_desired(content: bytes | str) -> tuple[DesiredState, list[Refused]]:
    """The head's answer, each job validated on its own: one invalid job (a NUL in its
    command, a port out of range) is refused alone. Refusing the whole answer would leave
    the agent without a valid answer until its lease ran out and it fenced every job."""
    try:
        return DesiredState.model_validate_json(content), []
    except ValidationError as whole:
        error = whole
    try:
        raw = json.loads(content)
    except ValueError as e:
        raise InvalidDesiredState(f"not JSON: {e}") from e
    jobs = raw.get("jobs") if isinstance(raw, dict) else None
    if not isinstance(jobs, list):
        raise InvalidDesiredState(_summary(error))
    try:
        state = DesiredState.model_validate_json(json.dumps({**raw, "jobs": []}))
    except ValidationError as e:
        raise InvalidDesiredState(_summary(e)) from e
    good: list[Assignment] = []
    refused: list[Refused] = []
    for item in jobs:
        try:
            # Through JSON again: strict mode judges JSON input, not Python objects.
            good.append(Assignment.model_validate_json(json.dumps(item)))
        except ValidationError as e:
            r = _refused(item, f"{LAUNCH_FAILED}invalid assignment: {_summary(e)}")
            if r is not None:
                refused.append(r)
    return state.model_copy(update={"jobs": good}), refused


def _refused(item: object, why: str) -> Refused | None:
    """The job id and epoch of an invalid assignment, if they can be read."""
    if not isinstance(item, dict):
        return None
    job_id, epoch = _int(item.get("job_id")), _int(item.get("epoch"))
    if job_id is None or epoch is None or job_id < 1 or epoch < 0:
        return None
    node_rank, per_node = _int(item.get("node_rank")), _int(item.get("gpus_per_node"))
    rank = 0
    if node_rank is not None and 0 <= node_rank < 2**16:
        launcher = item.get("launcher")
        if launcher == "torchrun" and per_node is not None and 0 < per_node < 2**8:
            rank = node_rank * per_node
        elif launcher == "node":
            rank = node_rank
    return Refused(job_id, epoch, rank, why)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _summary(e: ValidationError) -> str:
    return validation_detail(e.errors(), limit=5)


def output_problem(flag: str, pattern: str, path: Path) -> str | None:
    """Why a rank's `-o`/`-e` file cannot be written ("LaunchFailed: …"), or None. Creates
    missing parent directories (as the agent always has) and the file itself."""
    where = f"{flag} {pattern!r}"
    try:
        if path.is_dir():
            return f"{LAUNCH_FAILED}{where} names a directory ({path}), not a file"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"{LAUNCH_FAILED}{where}: cannot write {path}: {why}"
    return None


def workdir_usable(workdir: str) -> bool:
    """Whether the agent's own user (the job's, when the agent does not switch users) can
    start a process in `workdir`."""
    return os.path.isdir(workdir) and os.access(workdir, os.X_OK)


def workdir_problem(workdir: str, user: str | None = None) -> str:
    """Why the job cannot start in `workdir` ("LaunchFailed: …"), once the job's user
    could not enter it. The directory is never created: a typo in `-D` would run the job
    in a new empty directory (Slurm fails such a job too). The wording comes from what the
    agent itself sees; whether the job fails is the user's view (reconcile)."""
    try:
        mode = os.stat(workdir).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return f"{LAUNCH_FAILED}working directory {workdir} does not exist on this node"
    except OSError as e:  # e.g. a root-squashed NFS mount the agent itself cannot read
        return f"{LAUNCH_FAILED}working directory {workdir} cannot be reached: {e.strerror or e}"
    if not stat.S_ISDIR(mode):
        return f"{LAUNCH_FAILED}working directory {workdir} is not a directory"
    who = f"user {user}" if user else "the job's user"
    return f"{LAUNCH_FAILED}working directory {workdir}: {who} may not enter it"
