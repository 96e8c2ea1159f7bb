"""`phalanx exec` (a command beside a running rank, like kubectl exec) and `phalanx attach`
(follow a running rank's live output, like sattach)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from typer.core import TyperCommand

from phalanx.cli.connect import HeadOpt, TokenOpt, connect
from phalanx.cli.output import TERMINAL_STATES, fail

if TYPE_CHECKING:
    from phalanx.api.models import ExecFrame
    from phalanx.client.api import PhalanxClient

_COMMAND_KEY = "phalanx.exec.command"
# Exit statuses of `phalanx exec` of its own, as timeout(1) and ssh use them.
EXIT_TIMED_OUT = 124
EXIT_LOST = 255  # the stream broke before the command's exit came back
EXIT_INTERRUPTED = 130  # Ctrl-C
Stream = Literal["stdout", "stderr"]
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")


class DashCommand(TyperCommand):
    """Keeps what follows `--` apart: the command to run, whatever options it has."""

    # `ctx` is Typer's bundled click Context; Any avoids naming Typer's private module.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta[_COMMAND_KEY] = args[args.index("--") + 1 :]
            args = args[: args.index("--")]
        return super().parse_args(ctx, args)


JobArg = Annotated[int, typer.Argument(help="Job id.", show_default=False, min=1)]
RankOpt = Annotated[
    int,
    typer.Option(
        "--rank", "-r", min=0, help="Which rank (as `phalanx logs --rank`; 0: the first)."
    ),
]


def exec_command(
    ctx: typer.Context,
    job_id: JobArg,
    rank: RankOpt = 0,
    timeout: Annotated[
        int,
        typer.Option(
            min=1,
            max=3600,
            help="Seconds before the command is killed (exit 124).",
        ),
    ] = 600,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Run a command beside a running rank, like `kubectl exec`: on its node, as the job's
    user, in the job's cgroup, with the rank's environment and working directory.

    Usage: phalanx exec JOB [--rank R] -- CMD ARGS…   e.g. -- nvidia-smi

    Output streams back as it comes. Exit status: the command's (128+N: killed by signal N).

    Ctrl-C or --timeout (exit 124) kill it; so does passing 16 MiB of output. No stdin.

    Only the job's owner, its team's admins and admins may exec into it.
    """
    from pydantic import ValidationError

    from phalanx.api.models import ExecRequest

    command: list[str] | None = ctx.meta.get(_COMMAND_KEY)
    if not command:
        fail("no command: phalanx exec JOB [--rank R] -- CMD ARGS…")
    try:
        request = ExecRequest(argv=command, rank=rank, timeout_s=timeout)
    except ValidationError as exc:
        from phalanx.api.models import validation_detail

        fail(f"cannot run that command: {validation_detail(exc.errors())}")
    with connect(head, token) as client:
        frames = client.exec(job_id, request)
        try:
            code = _stream(frames)
        except KeyboardInterrupt:
            frames.close()  # closes the stream: the head and the agent kill the command
            typer.echo(f"\ninterrupted: the command in job {job_id} was killed", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(code)


def _stream(frames: Any) -> int:
    """Copy the frames' output to stdout and stderr; the exit status to end with."""
    last: ExecFrame | None = None
    for frame in frames:
        if frame.kind == "stdout":
            sys.stdout.write(frame.data)
            sys.stdout.flush()
        elif frame.kind == "stderr":
            sys.stderr.write(frame.data)
            sys.stderr.flush()
        elif frame.kind == "exit":
            last = frame
            break
    if last is None:
        typer.echo("error: the exec's stream ended before the command's exit status", err=True)
        return EXIT_LOST
    if last.message:
        typer.echo(f"error: {last.message}", err=True)
    if last.timed_out:
        return EXIT_TIMED_OUT
    if last.signal is not None:
        return 128 + last.signal
    if last.exit_code is None:
        return EXIT_LOST
    return last.exit_code


def attach(
    job_id: JobArg,
    rank: RankOpt = 0,
    from_start: Annotated[
        bool,
        typer.Option(
            "--from-start", help="Print what the rank has written so far first, then follow."
        ),
    ] = False,
    poll_s: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 0.5,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Follow a running rank's live output, stdout and stderr, until it ends (like sattach).

    Starts with what the rank writes from now on (--from-start: from its first line).

    Waits for a pending job to start. Ctrl-C detaches; the job keeps running.
    """
    with connect(head, token) as client:
        try:
            started_now = _wait_running(client, job_id, poll_s)
            offset = 0 if from_start or started_now else _END
            _follow(client, job_id, rank, offset, poll_s)
        except KeyboardInterrupt:
            typer.echo(
                f"\ndetached; job {job_id} keeps running (`phalanx cancel {job_id}` stops it)",
                err=True,
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None


# An offset past any file's end: the agent answers with the end itself (logfiles.read_chunk
# clamps), which is where live output starts.
_END = 2**63 - 1


def _wait_running(client: PhalanxClient, job_id: int, poll_s: float) -> bool:
    """Wait while the job is pending; whether it had to (its output is then all new).
    Exits with a one-line error if the job has ended."""
    waited = False
    while True:
        info = client.job(job_id).job
        if info.state in TERMINAL_STATES:
            fail(
                f"job {job_id} has ended ({info.state}): nothing runs to attach to; "
                f"`phalanx logs {job_id}` prints what it wrote",
                1,
            )
        if info.state != "PD":
            return waited
        if not waited:
            typer.echo(f"job {job_id} is pending; waiting for it to start…", err=True)
            waited = True
        time.sleep(poll_s)


def _follow(client: PhalanxClient, job_id: int, rank: int, offset: int, poll_s: float) -> None:
    """Print both streams of the rank from `offset` until both reach their end (the rank
    ended): the same reads as `phalanx logs -f`, through the head's log proxy."""
    from phalanx.client.api import ApiError

    offsets = dict.fromkeys(_STREAMS, offset)
    ended: set[Stream] = set()
    out = {"stdout": sys.stdout, "stderr": sys.stderr}
    attached = False
    while len(ended) < len(_STREAMS):
        advanced = False
        for stream in _STREAMS:
            if stream in ended:
                continue
            try:
                chunk = client.logs(job_id, rank=rank, stream=stream, offset=offsets[stream])
            except ApiError as exc:
                if exc.status != 409:
                    raise
                # Not placed (requeued) or not started on its node yet; or gone for good.
                if client.job(job_id).job.state in TERMINAL_STATES:
                    return
                continue
            if chunk.data:
                out[stream].write(chunk.data)
                out[stream].flush()
            advanced = advanced or chunk.next_offset > offsets[stream]
            offsets[stream] = chunk.next_offset
            if chunk.eof:
                ended.add(stream)
        if not attached:  # both streams' positions are known: from here on, nothing is missed
            attached = True
            typer.echo(f"attached to job {job_id} rank {rank}; Ctrl-C detaches", err=True)
        if not advanced and len(ended) < len(_STREAMS):
            time.sleep(poll_s)
