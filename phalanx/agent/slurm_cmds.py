"""`srun` and `scontrol` for scripts running inside a Phalanx job (the agent puts shims on PATH)."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx.jobspec import JobSpecError, hostlist
from phalanx.tls import CA_PEM_ENV


class CommandError(Exception):
    """A problem the user of scontrol can fix; printed as `scontrol: error: …`."""


def write_shims(bin_dir: Path) -> None:
    """Write executable `srun` and `scontrol` wrappers that run this Python's shims."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)  # every job's user runs them
    for cmd in ("srun", "scontrol"):
        path = bin_dir / cmd
        text = f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m phalanx.agent.{cmd} "$@"\n'
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)


# ----------------------------------------------------------------------------- srun
def srun_main(argv: Sequence[str]) -> int:
    """Run a job step: start tasks on the job's agents, stream their output, wait, and
    exit with the highest task exit code (128 + signal for a killed task)."""
    # Imported here so `scontrol` (often run in loops by job scripts) starts light.
    from .stepfiles import TaskFiles, append_mode
    from .stepplan import SrunError, job_context, parse_srun, plan_step, workdir
    from .steprun import Http, StepRun

    try:
        opts = parse_srun(argv)
        job = job_context(os.environ)
        plan = plan_step(opts, job, os.environ)
        streams = {"stdout": opts.output, "stderr": opts.error}
        patterns = {stream: p for stream, p in streams.items() if p is not None}
        files = None
        if patterns:
            append = append_mode(opts.open_mode, os.environ)
            files = TaskFiles(patterns, os.environ, job.nodes, append, cwd=workdir(opts))
    except SrunError as e:
        print(f"srun: error: {e}", file=sys.stderr)
        return 1
    for option in opts.ignored:
        print(f"srun: note: {option} is accepted and ignored by Phalanx", file=sys.stderr)
    client = Http(job.step_token, os.environ.get(CA_PEM_ENV))
    step = StepRun(client, job, plan, workdir(opts), label=opts.label, files=files)
    # Handlers first: a signal that arrives while the step launches still cancels it.
    previous = {sig: signal.signal(sig, step.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    # Notices (preemption, --signal, cancel --signal) reach the step's tasks from their
    # agents directly; srun, in the batch script's process group, gets them too and must
    # live on (their default action would end it and orphan the step).
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        previous[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        step.launch()
        return step.follow(kill_on_bad_exit=opts.kill_on_bad_exit)
    except SrunError as e:
        print(f"srun: error: {e}", file=sys.stderr)
        step.kill()
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        client.close()
        if files is not None:
            files.close()


# ----------------------------------------------------------------------------- scontrol
def scontrol_main(argv: Sequence[str]) -> int:
    """`scontrol show hostnames [LIST]` and `scontrol show job [ID]` inside a job."""
    args = list(argv)
    try:
        if args[:2] in (["show", "hostnames"], ["show", "hostname"]):
            expr = args[2] if len(args) > 2 else os.environ.get("SLURM_JOB_NODELIST")
            if not expr:
                raise CommandError("no hostlist given and SLURM_JOB_NODELIST is not set")
            for name in hostlist.expand(expr):
                print(name)
            return 0
        if args[:2] == ["show", "job"] and (len(args) == 2 or _is_self(args[2], os.environ)):
            print(_show_job(args[2] if len(args) > 2 else None, os.environ))
            return 0
        if args[:1] == ["requeue"] and len(args) == 2 and _is_self(args[1], os.environ):
            return _requeue_self(os.environ)
    except (CommandError, JobSpecError) as e:
        print(f"scontrol: error: {e}", file=sys.stderr)
        return 1
    # Everything else (other jobs, nodes, partitions, hold, update…): the submit-side
    # scontrol, which speaks to the head with the user's own token (client config).
    command = [sys.executable, "-m", "phalanx.slurmcli", "scontrol", *args]
    os.execv(sys.executable, command)


def _is_self(refs: str, env: Mapping[str, str]) -> bool:
    """Whether `refs` (`123`, `120_3`, comma-separated) names only the current job."""
    names = {env.get("SLURM_JOB_ID", "")}
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        names.add(f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}")
    given = [ref for ref in refs.split(",") if ref]
    return bool(given) and all(ref in names for ref in given) and "" not in names


def _requeue_self(env: Mapping[str, str]) -> int:
    """`scontrol requeue $SLURM_JOB_ID` inside the job: the job asks the head, with its
    own step token, to requeue it (POST /v1/jobs/{id}/self/requeue). Silent on success."""
    from .steprun import Http

    token, heads = env.get("PHALANX_STEP_TOKEN"), env.get("PHALANX_HEAD")
    if not token or not heads:
        raise CommandError("PHALANX_STEP_TOKEN or PHALANX_HEAD is not set: not inside a job")
    # The requeue stops this very job: its SIGTERM can reach this process before the head's
    # answer does, and the caller (submitit) would read "died with SIGTERM" as a failed
    # requeue. Slurm's scontrol answers before slurmd signals the job; so does this one
    # (the job's kill after its grace is SIGKILL, which still ends it).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    client = Http(token, env.get(CA_PEM_ENV))
    failure = "no head answered"
    try:
        for head in heads.split(","):
            try:
                answer = client.request(
                    "POST", f"{head}/v1/jobs/{env['SLURM_JOB_ID']}/self/requeue"
                )
            except (OSError, http.client.HTTPException) as e:
                failure = f"{head}: {e}"
                continue
            if answer.status_code == 200:
                return 0
            failure = _detail(answer.content)
            if answer.status_code < 500:
                break
    finally:
        client.close()
    raise CommandError(f"Requeue of job {env['SLURM_JOB_ID']} failed: {failure}")


def _detail(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else body.decode(errors="replace")[:200]


def _show_job(job_id: str | None, env: Mapping[str, str]) -> str:
    """A minimal Slurm-like record of the current job, from its environment."""
    current = env.get("SLURM_JOB_ID")
    if not current:
        raise CommandError("not inside a job; use `phalanx show JOB_ID`")
    if job_id is not None and job_id != current:
        raise CommandError(
            f"only the current job ({current}) can be shown here; use `phalanx show {job_id}`"
        )
    fields = [
        ("JobId", current),
        ("JobName", env.get("SLURM_JOB_NAME", "")),
        ("UserId", env.get("SLURM_JOB_USER", "")),
        ("Partition", env.get("SLURM_JOB_PARTITION", "")),
        ("JobState", "RUNNING"),
        ("RestartCnt", env.get("SLURM_RESTART_COUNT", "0")),
        ("NumNodes", env.get("SLURM_JOB_NUM_NODES", "")),
        ("NumTasks", env.get("SLURM_NTASKS", "")),
        ("NodeList", env.get("SLURM_JOB_NODELIST", "")),
        ("WorkDir", env.get("SLURM_SUBMIT_DIR", "")),
    ]
    return "\n".join(
        ("   " if i else "") + " ".join(f"{k}={v}" for k, v in fields[i : i + 3])
        for i in range(0, len(fields), 3)
    )
