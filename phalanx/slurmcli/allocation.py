"""What srun and salloc share outside a job: waiting for an allocation with Slurm's
messages, following its batch output, the environment of an allocation, and running a
command inside one (a step started beside its first rank: the head's exec path)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Literal

from phalanx.api.models import MAX_EXEC_TIMEOUT_S, ExecRequest, JobInfo
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import hostlist
from phalanx.slurmcli.common import SlurmError
from phalanx.slurmcli.submitting import TERMINAL

# Set in the environment salloc gives its command: the allocation srun runs steps in.
ALLOCATION_ENV = "PHALANX_ALLOCATION"
Stream = Literal["stdout", "stderr"]


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP end the wait as Ctrl-C does (the caller then cancels)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_running(client: PhalanxClient, tool: str, job_id: int, quiet: bool) -> JobInfo:
    """Wait until the job holds its nodes, saying so as Slurm does; SlurmError if it ended
    first (cancelled, failed to start)."""
    job = client.job(job_id).job
    queued = job.state == "PD"
    if queued and not quiet:
        print(f"{tool}: job {job_id} queued and waiting for resources", file=sys.stderr)
    pause = 0.1
    while job.state == "PD":
        time.sleep(pause)
        pause = min(pause * 1.5, 1.0)
        job = client.job(job_id).job
    if job.state in TERMINAL and not job.placement:
        reason = f" ({job.reason})" if job.reason else ""
        raise SlurmError(f"Job allocation {job_id} has been revoked{reason}")
    if queued and not quiet:
        print(f"{tool}: job {job_id} has been allocated resources", file=sys.stderr)
    return job


def nodes_of(job: JobInfo) -> list[str]:
    """The job's nodes in rank order."""
    return list(dict.fromkeys(p.node for p in job.placement))


def follow_output(client: PhalanxClient, job_id: int) -> JobInfo:
    """Copy the job's batch output (rank 0's stdout and stderr) to ours as it grows, until
    the job has ended and both are read; the job's last view."""
    offsets: dict[Stream, int] = {"stdout": 0, "stderr": 0}
    done: set[Stream] = set()
    pause = 0.05
    while True:
        moved = _read(client, job_id, offsets, done)
        if moved:
            pause = 0.05
            continue
        job = client.job(job_id).job
        if job.state in TERMINAL:
            _read(client, job_id, offsets, done)  # what came after the last look
            return job
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


def _read(
    client: PhalanxClient, job_id: int, offsets: dict[Stream, int], done: set[Stream]
) -> bool:
    """Read each stream not yet at its end from its offset; True if anything came."""
    moved = False
    streams: tuple[Stream, Stream] = ("stdout", "stderr")
    for stream in streams:
        if stream in done:
            continue
        try:
            chunk = client.logs(job_id, rank=0, stream=stream, offset=offsets[stream])
        except ApiError as exc:
            if exc.status in (404, 409):  # not (yet, or again) started, or no log kept
                continue
            raise
        if chunk.data:
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(chunk.data)
            out.flush()
        moved |= chunk.next_offset > offsets[stream]
        offsets[stream] = chunk.next_offset
        if chunk.eof:
            done.add(stream)
    return moved


def allocation_env(
    job: JobInfo, ntasks_per_node: int, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """What salloc's command sees: Slurm's allocation variables (stale SLURM_* from the
    caller's environment dropped) and ALLOCATION_ENV for srun."""
    base = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "PHALANX_STEP"))}
    nodes = nodes_of(job)
    nodelist = hostlist.compress(nodes)
    ntasks = len(nodes) * ntasks_per_node
    env.update(
        {
            "SLURM_JOB_ID": str(job.id),
            "SLURM_JOBID": str(job.id),
            "SLURM_JOB_NAME": job.name,
            "SLURM_JOB_USER": job.user,
            "SLURM_JOB_PARTITION": job.team,
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(nodes)),
            "SLURM_NNODES": str(len(nodes)),
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NPROCS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(ntasks_per_node),
            "SLURM_TASKS_PER_NODE": f"{ntasks_per_node}(x{len(nodes)})"
            if len(nodes) > 1
            else str(ntasks_per_node),
            "SLURM_GPUS_PER_NODE": str(job.gpus_per_node),
            "SLURM_SUBMIT_DIR": os.getcwd(),
            "SLURM_SUBMIT_HOST": os.uname().nodename,
            "SLURM_CLUSTER_NAME": "phalanx",
            ALLOCATION_ENV: str(job.id),
        }
    )
    if job.time_limit_s is not None:
        env["SLURM_JOB_TIME_LIMIT"] = str(job.time_limit_s)
    return env


def run_in_allocation(client: PhalanxClient, job_id: int, argv: list[str]) -> int:
    """Run `srun ARGV` as a step of allocation `job_id`: started beside its first rank
    (the head's exec path, as the job's user, with the job's environment, where the
    job's own srun lays the tasks out over its nodes), output streamed back; the step's
    exit code. Bounded by the exec path: MAX_EXEC_TIMEOUT_S, no standard input."""
    request = ExecRequest(argv=["srun", *argv], rank=0, timeout_s=MAX_EXEC_TIMEOUT_S)
    for frame in client.exec(job_id, request):
        if frame.kind == "stdout":
            sys.stdout.write(frame.data)
            sys.stdout.flush()
        elif frame.kind == "stderr":
            sys.stderr.write(frame.data)
            sys.stderr.flush()
        elif frame.kind == "exit":
            if frame.message and (frame.timed_out or frame.truncated):
                print(f"srun: error: {frame.message}", file=sys.stderr)
            if frame.exit_code is not None:
                return frame.exit_code
            return 128 + (frame.signal or 9)
    raise SlurmError(f"the step in job {job_id} ended without an exit status")
