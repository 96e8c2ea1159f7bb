"""`srun` on the submitting host. Outside an allocation it allocates and runs, as Slurm's:
a job whose batch script runs the job's own srun (which lays the tasks out over the
nodes), its output streamed here, its exit code ours, Ctrl-C cancels it. In a salloc
shell it runs the step inside that allocation; inside a Phalanx job it is the job's srun."""

from __future__ import annotations

import os
import posixpath
import shlex
import sys

from phalanx.jobspec import JobSpecError, SubmitOptions
from phalanx.slurmcli.allocation import (
    ALLOCATION_ENV,
    follow_output,
    interrupts_raise,
    run_in_allocation,
    wait_running,
)
from phalanx.slurmcli.common import connect, die
from phalanx.slurmcli.getopts import run_tool
from phalanx.slurmcli.submitting import (
    build,
    command_line,
    exit_status,
    job_of,
    print_warnings,
    submit,
)

# srun's own options (long, short, takes a value) that sbatch lacks or takes otherwise.
EXTRA = [
    ("label", "l", False),
    ("unbuffered", "u", False),
    ("kill-on-bad-exit", "K", False),
    ("pty", None, False),
    ("mpi", None, True),
    ("overlap", None, False),
    ("exact", None, False),
    ("wait", "W", True),
    ("quit-on-interrupt", "q", False),
    ("disable-status", "X", False),
    ("multi-prog", None, False),
    ("jobid", None, True),
    ("relative", "r", True),
    ("task-prolog", None, True),
    ("task-epilog", None, True),
    ("accel-bind", None, True),
    ("slurmd-debug", None, True),
    ("het-group", None, True),
    ("input", "i", True),
]
HANDLED = frozenset({"quiet", "verbose", "help", "usage", "version", "hold", "test-only"})
# Passed on to the job's own srun, which does what they say there.
_STEP_FLAGS = {"label": "--label", "kill-on-bad-exit": "--kill-on-bad-exit"}
USAGE = """\
Usage: srun [OPTIONS(0)...] executable(0) [args(0)...]   (Phalanx's srun)
Outside an allocation: allocates (sbatch's options: -N, -n, --ntasks-per-node, -G,
--gpus-per-node, -t, -J, -p, -c, --mem, -w, -x, --export…) and runs the command there,
its output here, exiting with its exit code; Ctrl-C cancels. Step options passed on:
-l/--label, -K/--kill-on-bad-exit. Inside salloc's shell: runs the step in that
allocation. --pty, --multi-prog and -i/--input are not supported.
"""


def main(argv: list[str]) -> int:
    if os.environ.get("PHALANX_STEP_TOKEN"):
        # Inside a Phalanx job: the job's own srun (normally first on the job's PATH).
        command = [sys.executable, "-m", "phalanx.agent.srun", *argv]
        os.execv(sys.executable, command)
    return run_tool("srun", _srun, argv)


def _srun(argv: list[str]) -> int:
    line = command_line("srun", argv, HANDLED, USAGE, EXTRA)
    if line is None:
        return 0
    flags = line.seen
    for unsupported in ("pty", "multi-prog", "input", "het-group"):
        if unsupported in flags:
            die(f"--{unsupported} is not supported by Phalanx's srun")
    command = line.arguments
    if not command:
        die("No command given to execute.")
    allocation = flags.get("jobid") or os.environ.get(ALLOCATION_ENV)
    if allocation is not None:
        if not allocation.isdigit():
            die(f"Invalid job id: {allocation}")
        with connect() as client, interrupts_raise():
            return run_in_allocation(client, int(allocation), _step_argv(line.opts, flags, command))
    return _allocate_and_run(line.opts, flags, command)


def _step_argv(opts: SubmitOptions, flags: dict[str, str | None], command: list[str]) -> list[str]:
    """The options of a step inside an allocation, as the job's own srun takes them."""
    argv = [option for name, option in _STEP_FLAGS.items() if name in flags]
    for option, value in (
        ("--nodes", opts.nodes),
        ("--ntasks", opts.ntasks),
        ("--ntasks-per-node", opts.ntasks_per_node),
        ("--nodelist", opts.nodelist),
        ("--cpus-per-task", opts.cpus_per_task),
        ("--export", opts.export),
        ("--chdir", opts.workdir or os.getcwd()),
    ):
        if value is not None:
            argv.append(f"{option}={value}")
    return [*argv, "--", *command]


def _allocate_and_run(opts: SubmitOptions, flags: dict[str, str | None], command: list[str]) -> int:
    quiet = "quiet" in flags
    if opts.job_name is None:
        opts.job_name = posixpath.basename(command[0]) or "srun"
    step = [option for name, option in _STEP_FLAGS.items() if name in flags]
    script = (
        "#!/bin/sh\n# srun on the submitting host: this job's own srun runs the step\n"
        f"exec srun {shlex.join([*step, '--', *command])}\n"
    )
    try:
        spec, warnings = build(opts, script=script)
    except JobSpecError as exc:
        die(str(exc))
    if not quiet:
        print_warnings("srun", warnings)
    with connect() as client:
        answer = submit(client, spec)
        job_id = job_of(answer)
        try:
            with interrupts_raise():
                wait_running(client, "srun", job_id, quiet)
                ended = follow_output(client, job_id)
        except KeyboardInterrupt:
            print(f"srun: interrupted: cancelling job {job_id}", file=sys.stderr)
            client.cancel(job_id)
            return 130
        if ended.state not in ("CD", "F") and not quiet:  # a failed task said why
            reason = f" ({ended.reason})" if ended.reason else ""
            print(f"srun: error: job {job_id} ended {ended.state}{reason}", file=sys.stderr)
        return exit_status(ended)
