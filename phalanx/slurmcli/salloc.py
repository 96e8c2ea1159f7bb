"""`salloc`: get an allocation (a job whose batch script only holds its nodes), wait until
it runs, then run a command (default: your shell) here with Slurm's allocation variables
set; `srun` in it runs steps on the allocation's nodes. When the command ends, the
allocation is released (the job cancelled); when the allocation ends first (time limit,
cancelled), the command is told with SIGHUP, as Slurm's salloc does."""

from __future__ import annotations

import os
import posixpath
import signal
import subprocess
import sys
import threading

from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import JobSpecError, merge
from phalanx.slurmcli.allocation import allocation_env, interrupts_raise, nodes_of, wait_running
from phalanx.slurmcli.common import SlurmError, connect, die
from phalanx.slurmcli.getopts import run_tool
from phalanx.slurmcli.submitting import (
    TERMINAL,
    build,
    command_line,
    input_options,
    job_of,
    print_warnings,
    submit,
)

EXTRA = [
    ("no-shell", None, False),
    ("bell", None, False),
    ("no-bell", None, False),
    ("kill-command", "K", False),
    ("x11", None, False),
]
HANDLED = frozenset({"quiet", "verbose", "help", "usage", "version", "hold", "immediate"})
HOLD_SCRIPT = (
    "#!/bin/sh\n# salloc: this job holds its nodes while salloc's command runs\n"
    "while :; do sleep 3600; done\n"
)
USAGE = """\
Usage: salloc [OPTIONS(0)...] [command(0) [args(0)...]]   (Phalanx's salloc)
Allocates with sbatch's options (-N, -n, --ntasks-per-node, -G, --gpus-per-node, -t, -J,
-p, …), then runs the command (default: $SHELL) with SLURM_JOB_ID, SLURM_JOB_NODELIST,
SLURM_NNODES, SLURM_NTASKS… set; srun in it runs on the allocation. Leaving the command
releases the allocation. --no-shell and --x11 are not supported.
"""
_WATCH_S = 2.0  # how often the allocation is looked at while the command runs


def main(argv: list[str]) -> int:
    return run_tool("salloc", _salloc, argv)


def _salloc(argv: list[str]) -> int:
    line = command_line("salloc", argv, HANDLED, USAGE, EXTRA)
    if line is None:
        return 0
    flags = line.seen
    for unsupported in ("no-shell", "x11", "hold"):
        if unsupported in flags:
            die(f"--{unsupported} is not supported by Phalanx's salloc")
    command = line.arguments or [os.environ.get("SHELL") or "/bin/sh"]
    opts = merge(input_options(os.environ, "SALLOC_"), line.opts)
    if opts.job_name is None:
        opts.job_name = posixpath.basename(command[0]) or "salloc"
    try:
        spec, warnings = build(opts, script=HOLD_SCRIPT)
    except JobSpecError as exc:
        die(str(exc))
    quiet = "quiet" in flags
    if not quiet:
        print_warnings("salloc", warnings)
    with connect() as client:
        answer = submit(client, spec)
        job_id = job_of(answer)
        if not quiet:
            print(f"salloc: Pending job allocation {job_id}", file=sys.stderr)
        try:
            with interrupts_raise():
                job = wait_running(client, "salloc", job_id, quiet)
        except KeyboardInterrupt:
            _release(client, job_id, quiet, revoked=True)
            return 1
        if not quiet:
            print(f"salloc: Granted job allocation {job_id}", file=sys.stderr)
            nodes = ",".join(nodes_of(job))
            print(f"salloc: Nodes {nodes} are ready for job", file=sys.stderr)
        env = allocation_env(job, spec.ntasks_per_node or 1)
        code = _run(client, job_id, command, env)
        _release(client, job_id, quiet, revoked=False)
        return code


def _run(client: PhalanxClient, job_id: int, command: list[str], env: dict[str, str]) -> int:
    """Run the command (its terminal is ours); SIGHUP it if the allocation ends first."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"salloc: error: {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    ended = threading.Event()
    watcher = threading.Thread(target=_watch, args=(job_id, child, ended), daemon=True)
    watcher.start()
    # Ctrl-C belongs to the command (an interactive shell); salloc waits for it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        ended.set()
    return code if code >= 0 else 128 - code


def _watch(job_id: int, child: subprocess.Popen[bytes], stop: threading.Event) -> None:
    """Poll the allocation (its own connection: the client is not shared across threads);
    when it has ended, hang up the command as Slurm's salloc does."""
    try:
        _poll(job_id, child, stop)
    except SlurmError:
        return  # the head is away: the command runs on; the release says what it can


def _poll(job_id: int, child: subprocess.Popen[bytes], stop: threading.Event) -> None:
    with connect() as client:
        while not stop.wait(_WATCH_S):
            try:
                state = client.job(job_id).job.state
            except ApiError:
                continue
            if state in TERMINAL:
                print(f"salloc: Job allocation {job_id} has been revoked.", file=sys.stderr)
                child.send_signal(signal.SIGHUP)
                return


def _release(client: PhalanxClient, job_id: int, quiet: bool, *, revoked: bool) -> None:
    if not quiet:
        if revoked:
            print(f"salloc: Job allocation {job_id} has been revoked.", file=sys.stderr)
        else:
            print(f"salloc: Relinquishing job allocation {job_id}", file=sys.stderr)
    try:
        client.cancel(job_id)
    except ApiError as exc:
        if exc.status != 409:  # 409: it already ended
            print(f"salloc: error: releasing job {job_id}: {exc}", file=sys.stderr)
