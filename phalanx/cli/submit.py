"""`phalanx submit`: a YAML spec, an `#SBATCH` script, or flags + `-- CMD`, optionally waited on."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import fail, warn
from phalanx.cli.waiting import wait_for_jobs

if TYPE_CHECKING:
    from phalanx.api.models import JobSpec

_COMMAND_KEY = "phalanx.submit.command"


class SubmitCommand(TyperCommand):
    """Remembers what came after `--`: that is the job's command, never a spec file."""

    # `ctx` is Typer's bundled click Context; Any avoids naming Typer's private module.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta[_COMMAND_KEY] = args[args.index("--") + 1 :]
            args = args[: args.index("--")]
        return super().parse_args(ctx, args)


def _opt(*names: str, help: str, metavar: str) -> Any:
    # Every value is read as text (phalanx.jobspec parses it, with messages naming the
    # flag); `metavar` says in --help what kind of value it is, e.g. INTEGER, not <str>.
    return typer.Option(*names, help=help, metavar=metavar, show_default=False)


def submit(
    ctx: typer.Context,
    spec_file: Annotated[
        Path | None,
        typer.Argument(
            help="A YAML job spec (.yaml/.yml) or a batch script with #SBATCH lines. "
            "To run a command instead: phalanx submit [FLAGS] -- CMD ARGS…",
            show_default=False,
        ),
    ] = None,
    job_name: Annotated[
        str | None, _opt("--job-name", "-J", help="Job name.", metavar="NAME")
    ] = None,
    nodes: Annotated[
        str | None, _opt("--nodes", "-N", help="Number of nodes.", metavar="INTEGER")
    ] = None,
    ntasks: Annotated[
        str | None, _opt("--ntasks", "-n", help="Total tasks (ranks).", metavar="INTEGER")
    ] = None,
    ntasks_per_node: Annotated[
        str | None, _opt("--ntasks-per-node", help="Tasks per node.", metavar="INTEGER")
    ] = None,
    gres: Annotated[
        str | None, _opt("--gres", help="GPUs per node: gpu[:TYPE]:N.", metavar="GRES")
    ] = None,
    gpus: Annotated[
        str | None, _opt("--gpus", "-G", help="GPUs in total: [TYPE:]N.", metavar="[TYPE:]INTEGER")
    ] = None,
    gpus_per_node: Annotated[
        str | None,
        _opt("--gpus-per-node", help="GPUs per node: [TYPE:]N.", metavar="[TYPE:]INTEGER"),
    ] = None,
    gpus_per_task: Annotated[
        str | None,
        _opt("--gpus-per-task", help="GPUs per task: [TYPE:]N.", metavar="[TYPE:]INTEGER"),
    ] = None,
    cpus_per_task: Annotated[
        str | None, _opt("--cpus-per-task", "-c", help="CPUs per task.", metavar="INTEGER")
    ] = None,
    mem: Annotated[
        str | None, _opt("--mem", help="Memory per node, e.g. 64G.", metavar="SIZE")
    ] = None,
    time_limit: Annotated[
        str | None, _opt("--time", "-t", help="Time limit: MM, HH:MM:SS, D-HH:MM.", metavar="TIME")
    ] = None,
    partition: Annotated[
        str | None, _opt("--partition", "-p", help="Team to run as.", metavar="TEAM")
    ] = None,
    qos: Annotated[
        str | None, _opt("--qos", "-q", help="low, normal or high.", metavar="QOS")
    ] = None,
    account: Annotated[
        str | None, _opt("--account", "-A", help="Account (recorded).", metavar="ACCOUNT")
    ] = None,
    output: Annotated[
        str | None, _opt("--output", "-o", help="stdout file pattern.", metavar="PATTERN")
    ] = None,
    error: Annotated[
        str | None, _opt("--error", "-e", help="stderr file pattern.", metavar="PATTERN")
    ] = None,
    dependency: Annotated[
        str | None, _opt("--dependency", "-d", help="e.g. afterok:12:13.", metavar="DEPENDENCY")
    ] = None,
    array: Annotated[
        str | None, _opt("--array", "-a", help="Array indices, e.g. 0-15%4.", metavar="INDICES")
    ] = None,
    requeue: Annotated[
        bool | None,
        typer.Option("--requeue/--no-requeue", help="Requeue after node failure or preemption."),
    ] = None,
    signal: Annotated[
        str | None,
        _opt("--signal", help="[{R|B}:]SIG\\[@SECONDS] before the time limit.", metavar="SIGNAL"),
    ] = None,
    exclusive: Annotated[
        bool | None,
        typer.Option("--exclusive/--oversubscribe", help="Whole nodes only for this job."),
    ] = None,
    launcher: Annotated[
        str | None,
        _opt(
            "--launcher", help="torchrun (one process per GPU), node or batch.", metavar="LAUNCHER"
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        _opt(
            "--workdir",
            "--chdir",
            "-D",
            help="Working directory (default: the current one).",
            metavar="DIR",
        ),
    ] = None,
    export: Annotated[
        str | None,
        _opt("--export", help="Environment to pass: ALL, NONE or VAR[=VALUE],…", metavar="VARS"),
    ] = None,
    constraint: Annotated[
        str | None, _opt("--constraint", "-C", help="GPU model.", metavar="MODEL")
    ] = None,
    exclude: Annotated[
        str | None, _opt("--exclude", "-x", help="Nodes to avoid.", metavar="NODES")
    ] = None,
    nodelist: Annotated[
        str | None,
        _opt("--nodelist", "-w", help="Run only on these nodes, e.g. n[1-3].", metavar="NODES"),
    ] = None,
    begin: Annotated[
        str | None,
        _opt("--begin", "-b", help="Not before: now+1h, 16:00, 2026-12-01T09:00.", metavar="TIME"),
    ] = None,
    max_restarts: Annotated[
        str | None, _opt("--max-restarts", help="Restarts after failures.", metavar="INTEGER")
    ] = None,
    restart_on_failure: Annotated[
        bool | None,
        typer.Option(
            "--restart-on-failure/--no-restart-on-failure",
            help="Restart (counts against --max-restarts) when a rank exits non-zero.",
        ),
    ] = None,
    checkpoint_dir: Annotated[
        str | None,
        _opt(
            "--checkpoint-dir",
            help="Checkpoints, kept across restarts; relative to -D.",
            metavar="DIR",
        ),
    ] = None,
    preempt_signal: Annotated[
        str | None,
        _opt("--preempt-signal", help="Preemption notice signal (default USR1).", metavar="SIGNAL"),
    ] = None,
    preempt_grace: Annotated[
        str | None,
        _opt(
            "--preempt-grace",
            help="Notice to kill: seconds or H:MM:SS (default 60).",
            metavar="TIME",
        ),
    ] = None,
    hang_timeout: Annotated[
        str | None,
        _opt(
            "--hang-timeout",
            help="Restart after this long without progress; 0: off.",
            metavar="TIME",
        ),
    ] = None,
    notify_url: Annotated[
        str | None,
        _opt(
            "--notify-url",
            help="Webhook the head POSTs job events to (JSON; see --mail-type).",
            metavar="URL",
        ),
    ] = None,
    mail_type: Annotated[
        str | None,
        _opt(
            "--mail-type",
            help="Events for --notify-url: BEGIN,END,FAIL,REQUEUE,ALL (END).",
            metavar="EVENTS",
        ),
    ] = None,
    mail_user: Annotated[
        str | None,
        _opt(
            "--mail-user", help="An http(s) URL: as --notify-url (no mail is sent).", metavar="URL"
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the parsed job spec; submit nothing.")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="Wait for the job to end; exit with its exit code."),
    ] = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit a job: a YAML spec, an #SBATCH script, or flags and a command after --.

    Examples: `phalanx submit job.yaml`, `phalanx submit train.sbatch -p teamA`,
    `phalanx submit -N 2 --gpus-per-node 8 -- python train.py`.
    """
    from phalanx.jobspec import SubmitOptions

    command: list[str] | None = ctx.meta.get(_COMMAND_KEY)
    cli_opts = SubmitOptions(
        job_name=job_name,
        nodes=nodes,
        ntasks=ntasks,
        ntasks_per_node=ntasks_per_node,
        gres=gres,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        gpus_per_task=gpus_per_task,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time_limit,
        partition=partition,
        qos=qos,
        account=account,
        output=output,
        error=error,
        dependency=dependency,
        array=array,
        requeue=requeue,
        signal=signal,
        exclusive=exclusive,
        launcher=launcher,
        workdir=workdir,
        export=export,
        constraint=constraint,
        exclude=exclude,
        nodelist=nodelist,
        begin=begin,
        max_restarts=max_restarts,
        restart_on_failure=restart_on_failure,
        checkpoint_dir=checkpoint_dir,
        preempt_signal=preempt_signal,
        preempt_grace=preempt_grace,
        hang_timeout=hang_timeout,
        notify_url=notify_url,
        mail_type=mail_type,
        mail_user=mail_user,
    )
    spec = _build(spec_file, command, cli_opts)
    if dry_run:
        sys.stdout.write(spec.model_dump_json(indent=2, exclude_defaults=not json_out) + "\n")
        return
    with connect(head, token) as client:
        answer = client.submit(spec)
        for message in answer.warnings:
            warn(message)
        if json_out:
            sys.stdout.write(answer.model_dump_json(indent=2) + "\n")
        elif answer.array_job_id is not None:
            typer.echo(f"Submitted array job {answer.array_job_id} ({len(answer.job_ids)} tasks)")
        else:
            typer.echo(f"Submitted job {answer.job_ids[0]}")
        sys.stdout.flush()
        if wait:
            raise typer.Exit(wait_for_jobs(client, answer.job_ids))


def _build(spec_file: Path | None, command: list[str] | None, cli_opts: Any) -> JobSpec:
    """Parse whichever input was given into one JobSpec; bad input exits 2 with a message."""
    import dataclasses

    from phalanx.jobspec import (
        JobSpecError,
        build_spec,
        check_script,
        load_yaml,
        merge,
        parse_sbatch,
    )

    cwd, environ = os.getcwd(), dict(os.environ)
    try:
        if command is not None:
            if spec_file is not None:
                fail(f"give either a spec file ({spec_file}) or a command after --, not both")
            if not command:
                fail("no command after --: phalanx submit [FLAGS] -- CMD ARGS…")
            spec, warnings = build_spec(
                cli_opts, command=command, script=None, cwd=cwd, environ=environ
            )
        elif spec_file is None:
            fail(
                "nothing to submit: give a YAML spec, an #SBATCH script, "
                "or a command after --  (phalanx submit [FLAGS] -- CMD ARGS…)"
            )
        else:
            text = _read(spec_file)
            if spec_file.suffix.lower() in (".yaml", ".yml"):
                given = [k for k, v in dataclasses.asdict(cli_opts).items() if v is not None]
                if given:
                    flags = ", ".join("--" + k.replace("_", "-") for k in given)
                    fail(f"{flags}: set these in {spec_file} (flags do not apply to a YAML spec)")
                spec, warnings = load_yaml(text, cwd=cwd, environ=environ)
            else:
                check_script(text)
                script_opts, warnings = parse_sbatch(text)
                spec, more = build_spec(
                    merge(script_opts, cli_opts),
                    command=None,
                    script=text,
                    cwd=cwd,
                    environ=environ,
                    script_name=spec_file.name,
                )
                warnings = [*warnings, *more]
    except JobSpecError as exc:
        where = f"{spec_file}: " if spec_file is not None and command is None else ""
        fail(f"{where}{exc}")
    for message in warnings:
        warn(message)
    if not os.path.isdir(spec.workdir):
        # Only a warning: the nodes may mount what this machine does not (sbatch, too,
        # leaves it to the node). There the agent never creates it: the job fails.
        warn(
            f"working directory {spec.workdir} does not exist on this machine; "
            "the job fails (LaunchFailed) unless it exists on its nodes"
        )
    return spec


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: no such file (to run a command, put it after --: phalanx submit -- CMD)")
    except IsADirectoryError:
        fail(f"{path} is a directory, not a YAML spec or batch script")
    except UnicodeDecodeError:
        fail(f"{path} is not a text file (a YAML spec or batch script is expected)")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
