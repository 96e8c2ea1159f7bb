"""What sbatch, srun and salloc share: reading a batch script as sbatch does, options from
`SBATCH_*`/`SALLOC_*`/`SLURM_*` input variables, the JobSpec (phalanx.jobspec, the one
parser), the submit, and waiting for a job's end and exit code."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import BinaryIO

from phalanx.api.models import JobInfo, JobSpec, SubmitResponse
from phalanx.api.states import TERMINAL_JOB_STATES
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import CommandLine, JobSpecError, SubmitOptions, build_spec, parse_sbatch_argv
from phalanx.slurmcli.common import die
from phalanx.slurmcli.getopts import UsageError, usage_lines
from phalanx.slurmcli.slurmjson import VERSION_LINE

MAX_SCRIPT_BYTES = 1_000_000  # JobSpec.script's bound
TERMINAL = TERMINAL_JOB_STATES  # the wire's terminal job states (phalanx.api.states)
# Slurm's input environment variables (man sbatch, "INPUT ENVIRONMENT VARIABLES") that map
# to a SubmitOptions field; the command line overrides them and they override #SBATCH.
_INPUT_VARS = {
    "ACCOUNT": "account", "ARRAY_INX": "array", "CONSTRAINT": "constraint",
    "EXPORT": "export", "GPUS": "gpus", "GPUS_PER_NODE": "gpus_per_node",
    "GPUS_PER_TASK": "gpus_per_task", "GRES": "gres", "JOB_NAME": "job_name",
    "MEM": "mem", "PARTITION": "partition", "QOS": "qos", "SIGNAL": "signal",
    "TIMELIMIT": "time", "CPUS_PER_TASK": "cpus_per_task",
}  # fmt: skip
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"})


def command_line(
    tool: str,
    argv: list[str],
    handled: frozenset[str],
    usage: str,
    extra: Sequence[tuple[str, str | None, bool]] = (),
) -> CommandLine | None:
    """An sbatch-family command line (sbatch, srun, salloc) read as sbatch reads it; None
    once it printed `--help`/`--usage` or `--version` (the tool is done). A bad or unknown
    option is getopt's usage error."""
    try:
        line = parse_sbatch_argv(argv, handled, extra)
    except JobSpecError as exc:
        die(str(exc))
    if line.unknown:
        raise UsageError(usage_lines(tool, f"unrecognized option '{line.unknown[0]}'"))
    if "help" in line.seen or "usage" in line.seen:
        sys.stdout.write(usage)
        return None
    if "version" in line.seen:
        print(VERSION_LINE)
        return None
    return line


class ScriptError(Exception):
    """A script sbatch refuses, with Slurm's lines (each printed as `TOOL: error: LINE`)."""

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def read_script(path: str | None, stdin: BinaryIO) -> tuple[str, str | None]:
    """The batch script from `path` (None: standard input, as sbatch without a file) and
    its file name for the default job name (None from stdin: "sbatch"). Bounded: a file
    larger than the JobSpec takes is never read whole."""
    try:
        if path is None:
            data = stdin.read(MAX_SCRIPT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        raise ScriptError(f"Unable to open file {path}") from None
    name = None if path is None or path == "/dev/stdin" else os.path.basename(path)
    return check_script(data), name


def check_script(data: bytes) -> str:
    """The script's text, or ScriptError with what sbatch says of such a script."""
    if len(data) > MAX_SCRIPT_BYTES:
        raise ScriptError(
            "Batch job submission failed: Pathname of a file, directory or other parameter "
            f"too long (the script is over {MAX_SCRIPT_BYTES} bytes, Phalanx's limit)"
        )
    if not data:
        raise ScriptError("Batch script is empty!")
    if not data.strip():
        raise ScriptError("Batch script contains only whitespace!")
    if not data.startswith(b"#!"):
        raise ScriptError(
            "This does not look like a batch script.  The first",
            "line must start with #! followed by the path to an interpreter.",
            "For instance: #!/bin/sh",
        )
    if b"\r\n" in data:
        raise ScriptError(
            "Batch script contains DOS line breaks (\\r\\n)",
            "instead of expected UNIX line breaks (\\n).",
        )
    if b"\0" in data:
        raise ScriptError(
            "The Slurm controller does not allow scripts that",
            "contain a NULL character '\\0'.",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScriptError(f"Batch script is not UTF-8 text (byte {exc.start})") from None


def with_arguments(script: str, arguments: list[str]) -> str:
    """The script with its command-line arguments set (`sbatch job.sh a b` → $1=a, $2=b).
    A JobSpec carries no script arguments, so a `set -- ARGS` line goes in after the
    #SBATCH header; only shell scripts can take them that way."""
    if not arguments:
        return script
    first, _, rest = script.partition("\n")
    words = first[2:].split()
    program = os.path.basename(words[0]) if words else ""
    if program == "env" and len(words) > 1:
        program = os.path.basename(words[-1])
    if program not in _SHELLS:
        raise ScriptError(
            f"script arguments ({shlex.join(arguments)}) need a shell script (#!/bin/sh, "
            f"#!/bin/bash, …) on Phalanx; {first.strip()!r} cannot take them"
        )
    lines = rest.split("\n")
    body = next(
        (i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")),
        len(lines),
    )
    lines.insert(body, f"set -- {shlex.join(arguments)}")
    return first + "\n" + "\n".join(lines)


def input_options(environ: Mapping[str, str], prefix: str = "SBATCH_") -> SubmitOptions:
    """Options from Slurm's input variables (`SBATCH_PARTITION`, `SBATCH_TIMELIMIT`, …);
    `prefix` is `SALLOC_` or `SLURM_` for salloc and srun."""
    opts = SubmitOptions()
    for name, field in _INPUT_VARS.items():
        value = environ.get(prefix + name)
        if value:
            setattr(opts, field, value)
    for name, flag in (("REQUEUE", True), ("NO_REQUEUE", False)):
        if environ.get(prefix + name):
            opts.requeue = flag
    if environ.get(prefix + "EXCLUSIVE"):
        opts.exclusive = True
    return opts


def build(
    opts: SubmitOptions,
    *,
    script: str | None = None,
    command: list[str] | None = None,
    script_name: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[JobSpec, list[str]]:
    """The JobSpec, as `phalanx submit` builds it (the submit directory is the working
    directory); a JobSpecError is the caller's to report."""
    return build_spec(
        opts,
        command=command,
        script=script,
        cwd=os.getcwd(),
        environ=dict(os.environ if environ is None else environ),
        script_name=script_name,
    )


def submit(client: PhalanxClient, spec: JobSpec) -> SubmitResponse:
    """Submit; a refusal raises ApiError with Slurm's words in front."""
    try:
        return client.submit(spec)
    except ApiError as exc:
        raise ApiError(exc.status, f"Batch job submission failed: {exc.detail}") from None


def job_of(answer: SubmitResponse) -> int:
    """The id Slurm prints for a submit: the array's id, else the job's."""
    return answer.array_job_id if answer.array_job_id is not None else answer.job_ids[0]


def exit_status(job: JobInfo) -> int:
    """A shell's exit status for an ended job: its exit code, 128 + the signal that killed
    it, or 1 for a job that ended without one (cancelled before it started, node lost)."""
    code, _, sig = (job.exit_code or "").partition(":")
    if code.isdigit() and int(code):
        return int(code) & 0xFF
    if sig.isdigit() and int(sig):
        return 128 + int(sig)
    if job.state == "CD" and code.isdigit():
        return 0
    return 1


def wait_ended(client: PhalanxClient, job_ids: Iterable[int]) -> list[JobInfo]:
    """Poll until every job has ended (backing off to 2 s between looks); their last views."""
    pending = list(job_ids)
    ended: list[JobInfo] = []
    pause = 0.2
    while pending:
        still: list[int] = []
        for job_id in pending:
            info = client.job(job_id).job
            if info.state in TERMINAL:
                ended.append(info)
            else:
                still.append(job_id)
        pending = still
        if pending:
            time.sleep(pause)
            pause = min(pause * 1.5, 2.0)
    return ended


def print_warnings(tool: str, warnings: Iterable[str]) -> None:
    for message in warnings:
        print(f"{tool}: warning: {message}", file=sys.stderr)
