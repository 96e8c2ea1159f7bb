"""`sbatch`: submit a batch script to Phalanx as Slurm's sbatch does, printing `Submitted
batch job N` (or `N` with --parsable). The options are read by phalanx.jobspec, the parser
`phalanx submit` uses; the command line overrides SBATCH_* variables, which override
#SBATCH lines."""

from __future__ import annotations

import os
import sys

from phalanx.jobspec import (
    JobSpecError,
    SubmitOptions,
    merge,
    parse_sbatch_script,
)
from phalanx.slurmcli.common import connect, die
from phalanx.slurmcli.getopts import run_tool
from phalanx.slurmcli.submitting import (
    ScriptError,
    build,
    command_line,
    exit_status,
    input_options,
    job_of,
    print_warnings,
    read_script,
    submit,
    wait_ended,
    with_arguments,
)

# sbatch options honoured here rather than in the JobSpec.
HANDLED = frozenset(
    {
        "parsable", "wrap", "hold", "wait", "test-only", "quiet", "verbose", "help", "usage",
        "version",
    }
)  # fmt: skip
# Slurm options that change nothing about what runs or where: taken silently (submitit
# passes --wckey and --open-mode on every job). Others Phalanx lacks get a warning.
HARMLESS = frozenset(
    {
        "wckey", "comment", "open-mode", "acctg-freq", "profile", "get-user-env",
        "propagate", "mcs-label", "kill-on-invalid-dep", "no-kill", "priority", "nice",
        "clusters",
    }
)  # fmt: skip
USAGE = """\
Usage: sbatch [OPTIONS...] [script [args...]]   (Phalanx's sbatch, Slurm 22.05 compatible)

Options Phalanx honours:
  -J, --job-name=NAME        -N, --nodes=N            -n, --ntasks=N
      --ntasks-per-node=N    -c, --cpus-per-task=N        --mem=SIZE
  -G, --gpus=[TYPE:]N            --gpus-per-node=[TYPE:]N --gpus-per-task=[TYPE:]N
      --gres=gpu[:TYPE][:N]  -C, --constraint=GPU_MODEL  -t, --time=TIME
  -p, --partition=TEAM       -q, --qos=QOS            -A, --account=NAME
  -o, --output=PATTERN       -e, --error=PATTERN      (%j %J %x %A %a %t %u %N %n %%)
  -D, --chdir=DIR            -a, --array=INDICES[%MAX] -d, --dependency=after*:ID[:ID]
      --signal=[B:]SIG[@SECS]    --requeue / --no-requeue  --exclusive
  -w, --nodelist=HOSTS       -x, --exclude=HOSTS      -b, --begin=TIME
      --export=ALL|NONE|VARS     --mail-type=TYPES        --mail-user=URL
      --wrap=COMMAND             --parsable               -H, --hold
  -W, --wait                     --test-only              -Q, --quiet
Phalanx's own: --launcher, --max-restarts, --restart-on-failure, --checkpoint-dir,
  --preempt-signal, --preempt-grace, --hang-timeout, --notify-url.
Other Slurm options are accepted with a warning and ignored; heterogeneous jobs are
refused (docs/slurm.md).
"""


def main(argv: list[str]) -> int:
    return run_tool("sbatch", _sbatch, argv)


def _sbatch(argv: list[str]) -> int:
    line = command_line("sbatch", argv, HANDLED | HARMLESS, USAGE)
    if line is None:
        return 0
    flags = line.seen
    try:
        text, name = _script(flags.get("wrap"), line.arguments)
        script = parse_sbatch_script(text, (HANDLED | HARMLESS) - {"wrap"})
        flags = {**script.seen, **flags}
        opts = merge(merge(script.opts, input_options(os.environ)), line.opts)
        _default_output(opts)
        text = with_arguments(text, line.arguments[1:])
        spec, warnings = build(opts, script=text, script_name=name)
        if "hold" in flags:
            spec = spec.model_copy(update={"hold": True})
    except ScriptError as exc:
        die(str(exc).replace("\n", "\nsbatch: error: "))
    except JobSpecError as exc:
        die(str(exc))
    if "quiet" not in flags:
        print_warnings("sbatch", [*script.warnings, *line.warnings, *warnings])
    if "test-only" in flags:
        print(f"sbatch: Job would be submitted (test only): {spec.name}", file=sys.stderr)
        return 0
    with connect() as client:
        answer = submit(client, spec)
        print_warnings("sbatch", answer.warnings)
        job = job_of(answer)
        print(job if "parsable" in flags else f"Submitted batch job {job}", flush=True)
        if "wait" in flags:
            ended = wait_ended(client, answer.job_ids)
            return max(exit_status(info) for info in ended)
    return 0


def _script(wrap: str | None, arguments: list[str]) -> tuple[str, str | None]:
    """The script's text and file name: --wrap's command, the file named, or stdin."""
    if wrap is not None:
        if arguments:
            die("Script arguments not permitted with --wrap option")
        return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{wrap}\n", "wrap"
    path = arguments[0] if arguments else None
    return read_script(path, sys.stdin.buffer)


def _default_output(opts: SubmitOptions) -> None:
    """Slurm's default output file in the working directory: `slurm-%j.out`, or
    `slurm-%A_%a.out` for an array (stderr goes there too unless -e is given)."""
    if opts.output is None:
        opts.output = "slurm-%A_%a.out" if opts.array is not None else "slurm-%j.out"
