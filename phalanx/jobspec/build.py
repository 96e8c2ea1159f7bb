"""The one place where submit options become a JobSpec."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from phalanx.api.models import JobSpec
from phalanx.jobspec import hostlist
from phalanx.jobspec.begin import parse_begin
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.exports import export_env
from phalanx.jobspec.jobflags import parse_array, parse_dependency, parse_signal
from phalanx.jobspec.notify import notify_fields
from phalanx.jobspec.options import SubmitOptions
from phalanx.jobspec.recovery import recovery_fields
from phalanx.jobspec.resources import parse_count, resolve
from phalanx.jobspec.units import parse_mem, parse_time
from phalanx.jobspec.wording import echo, plain

LAUNCHERS = ("torchrun", "node", "batch")
MAX_CPUS_PER_TASK = 4096  # JobSpec's bounds, checked here so the message names the flag
MAX_RESTARTS = 1000
# How each JobSpec field is spelled on the command line, for error messages.
_OPTION_OF = {
    "name": "-J/--job-name", "command": "the command", "script": "the script",
    "launcher": "--launcher", "nodes": "-N/--nodes", "gpus_per_node": "--gpus-per-node",
    "ntasks_per_node": "--ntasks-per-node", "cpus_per_task": "-c/--cpus-per-task",
    "mem_mb": "--mem", "time_limit_s": "-t/--time", "team": "-p/--partition",
    "account": "-A/--account", "qos": "-q/--qos", "gpu_model": "the GPU model",
    "workdir": "-D/--chdir", "output": "-o/--output", "error": "-e/--error",
    "env": "--export / env", "dependencies": "-d/--dependency", "array": "-a/--array",
    "signal": "--signal", "max_restarts": "--max-restarts", "exclude_nodes": "-x/--exclude",
    "restart_on_failure": "--restart-on-failure", "checkpoint_dir": "--checkpoint-dir",
    "preempt_signal": "--preempt-signal", "preempt_grace_s": "--preempt-grace",
    "hang_timeout_s": "--hang-timeout", "nodelist": "-w/--nodelist", "begin_time": "--begin",
    "notify_url": "--notify-url / --mail-user", "notify_on": "--mail-type",
}  # fmt: skip


def build_spec(
    opts: SubmitOptions,
    *,
    command: list[str] | None,
    script: str | None,
    cwd: str,
    environ: Mapping[str, str],
    script_name: str | None = None,
) -> tuple[JobSpec, list[str]]:
    """Turn submit options plus what to run into a validated JobSpec, and warnings.

    `command` (argv) or `script` (batch script text), exactly one. `cwd` resolves a
    relative `--chdir` and is the default working directory; `environ` is the submit
    environment that `--export` draws on. `script_name` (the script's file name) gives the
    default job name. Every problem raises JobSpecError naming the option.
    """
    return assemble(
        opts, command=command, script=script, cwd=cwd, environ=environ, script_name=script_name
    )


def assemble(
    opts: SubmitOptions,
    *,
    command: list[str] | None,
    script: str | None,
    cwd: str,
    environ: Mapping[str, str],
    script_name: str | None = None,
    extras: Mapping[str, Any] | None = None,
) -> tuple[JobSpec, list[str]]:
    """`build_spec`, plus JobSpec fields already in wire form (from YAML) in `extras`.

    `extras["env"]` is added on top of what `--export` selects; other extras replace
    the field.
    """
    warnings: list[str] = []
    fields: dict[str, Any] = {
        "launcher": _launcher(opts.launcher, command, script),
        "name": opts.job_name
        if opts.job_name is not None
        else _default_name(command, script, script_name),
        "workdir": _workdir(opts.workdir, cwd),
    }
    if command is not None:
        fields["command"] = command
    if script is not None:
        fields["script"] = script
    res = resolve(opts)
    fields.update(nodes=res.nodes, gpus_per_node=res.gpus_per_node)
    if res.ntasks_per_node is not None:
        fields["ntasks_per_node"] = res.ntasks_per_node
    if res.gpu_model is not None:
        fields["gpu_model"] = res.gpu_model
    if opts.cpus_per_task is not None:
        fields["cpus_per_task"] = parse_count(
            "--cpus-per-task", opts.cpus_per_task, maximum=MAX_CPUS_PER_TASK
        )
    if opts.mem is not None:
        fields["mem_mb"] = parse_mem(opts.mem) or None  # 0: Slurm's "whole node"; no request
    if opts.time is not None:
        fields["time_limit_s"] = parse_time(opts.time)
    if opts.max_restarts is not None:
        fields["max_restarts"] = parse_count(
            "--max-restarts", opts.max_restarts, minimum=0, maximum=MAX_RESTARTS
        )
    for field, value in (
        ("team", opts.partition),
        ("qos", opts.qos),
        ("account", opts.account),
        ("output", opts.output),
        ("error", opts.error),
        ("requeue", opts.requeue),
        ("exclusive", opts.exclusive),
    ):
        if value is not None:
            fields[field] = value
    if opts.partition is not None and "," in opts.partition:
        raise JobSpecError(
            f"--partition={opts.partition}: Phalanx takes one partition (team), not a list"
        )
    if opts.dependency is not None:
        fields["dependencies"], fields["dependency_any"] = parse_dependency(opts.dependency)
    if opts.array is not None:
        fields["array"] = parse_array(opts.array)
    if opts.signal is not None:
        fields["signal"], signal_warnings = parse_signal(opts.signal)
        warnings.extend(signal_warnings)
    if opts.exclude is not None:
        fields["exclude_nodes"] = hostlist.expand(opts.exclude)
    if opts.nodelist is not None:
        fields["nodelist"] = hostlist.expand(opts.nodelist)
        if opts.nodes is None and opts.gpus is None:
            fields["nodes"] = len(fields["nodelist"])  # as sbatch: one node per name
    if opts.begin is not None:
        fields["begin_time"] = parse_begin(opts.begin, time.time())
    fields.update(recovery_fields(opts, fields["workdir"]))
    notify, notify_warnings = notify_fields(opts)
    fields.update(notify)
    warnings.extend(notify_warnings)
    env, env_warnings = export_env(opts.export, environ)
    warnings.extend(env_warnings)
    extra = dict(extras or {})
    env.update(extra.pop("env", {}))
    fields["env"] = env
    fields.update(extra)
    return _validate(fields), warnings


def _launcher(given: str | None, command: list[str] | None, script: str | None) -> str:
    if (command is None) == (script is None):
        raise JobSpecError(
            "give exactly one thing to run: a command (argv) or a batch script"
            + (", not both" if command is not None else "")
        )
    if command is not None and not command:
        raise JobSpecError("the command is empty; give the program to run and its arguments")
    if script is not None and not script.strip():
        raise JobSpecError("the batch script is empty")
    launcher = given if given is not None else ("batch" if script is not None else "torchrun")
    if launcher not in LAUNCHERS:
        raise JobSpecError(f"--launcher={given}: use one of {', '.join(LAUNCHERS)}")
    if (launcher == "batch") != (script is not None):
        what = "a batch script" if script is not None else "a command"
        raise JobSpecError(
            f"--launcher={launcher} cannot run {what}: the batch launcher runs a script, "
            "torchrun and node run a command"
        )
    return launcher


def _default_name(command: list[str] | None, script: str | None, script_name: str | None) -> str:
    """As sbatch: the script's file name ("sbatch" for a script from stdin), else argv[0]."""
    if script is not None:
        return posixpath.basename(script_name or "sbatch") or "job"
    source = command[0] if command else ""
    return posixpath.basename(source.rstrip("/")) or "job"


def _workdir(given: str | None, cwd: str) -> str:
    if given is not None and not given.strip():
        raise JobSpecError("--chdir: the working directory is empty")
    return posixpath.normpath(posixpath.join(cwd, given or ""))


def _validate(fields: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = error["loc"]
            field = str(loc[0]) if loc else "?"
            where = _OPTION_OF.get(field, field)
            detail = ".".join(str(part) for part in loc[1:])
            problems.append(
                f"{where}{' (' + detail + ')' if detail else ''}: {plain(error)}{echo(error)}"
            )
        raise JobSpecError("; ".join(problems)) from None
