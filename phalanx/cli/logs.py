"""`phalanx logs`: one rank's log, or every rank's with `[rank N]` before each line."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from phalanx.cli.connect import HeadOpt, TokenOpt, connect
from phalanx.cli.jobctl import job_refs
from phalanx.cli.jobs import JOB_HELP
from phalanx.cli.output import fail

if TYPE_CHECKING:
    from phalanx.api.models import JobInfo
    from phalanx.client.api import PhalanxClient

Stream = Literal["stdout", "stderr"]


def rank_count(job: JobInfo) -> int:
    """How many ranks the job's agents start: the batch script once, one per node with the
    node launcher, one per GPU with torchrun (head.records.JobRecord.expected_ranks)."""
    if job.launcher == "batch":
        return 1
    if job.launcher == "node":
        return job.nodes
    return job.nodes * job.gpus_per_node


class RankLog:
    """One rank's log read in chunks from `offset`; with a prefix, whole lines only (a
    partial line waits for its end, or for the rank's end)."""

    def __init__(self, rank: int, prefix: str) -> None:
        self.rank = rank
        self.prefix = prefix
        self.offset = 0
        self.partial = ""
        self.done = False

    def write(self, data: str, final: bool) -> None:
        if not self.prefix:
            sys.stdout.write(data)
        else:
            text = self.partial + data
            lines = text.split("\n")
            self.partial = lines.pop()
            if final and self.partial:
                lines.append(self.partial)
                self.partial = ""
            sys.stdout.write("".join(f"{self.prefix}{line}\n" for line in lines))
        sys.stdout.flush()


def _read(client: PhalanxClient, job_id: str, log: RankLog, stream: Stream, follow: bool) -> bool:
    """Read what `log`'s rank has written since its offset; True if any new bytes came.
    With `follow`, a job that has not started yet is waited for (the head answers 409;
    one that ended without running answers 404, which ends the command)."""
    from phalanx.client.api import ApiError

    advanced = False
    while not log.done:
        try:
            chunk = client.logs(job_id, rank=log.rank, stream=stream, offset=log.offset)
        except ApiError as exc:
            if follow and exc.status == 409:  # not started (yet, or again after a requeue)
                return advanced
            raise
        moved = chunk.next_offset > log.offset
        log.offset = chunk.next_offset
        log.done = chunk.eof
        if chunk.data or chunk.eof:
            log.write(chunk.data, final=chunk.eof)
        if not moved:
            return advanced
        advanced = True
    return advanced


def logs(
    job_id: Annotated[str, typer.Argument(help=JOB_HELP, show_default=False)],
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            "-r",
            min=0,
            help="Only this rank's log (default: every rank's).",
            show_default=False,
        ),
    ] = None,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show stderr, not stdout.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the ranks end.")
    ] = False,
    poll_s: Annotated[float, typer.Option(min=0.05, help="Seconds between polls with -f.")] = 0.5,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's logs (stdout by default): every rank's, each line after `[rank N]`
    (a one-rank job's as they are), or one rank's with --rank. With -f, wait for the job
    to start and follow until its ranks end; a job that ends without running says so."""
    stream: Stream = "stderr" if stderr else "stdout"
    [ref] = job_refs([job_id]) if "[" not in job_id else [""]
    if not ref:
        fail(f"{job_id!r}: logs takes one job (123 or 123_4), not a range")
    with connect(head, token) as client:
        every = rank is None
        ranks = list(range(rank_count(client.job(ref).job))) if every else [rank or 0]
        prefixed = len(ranks) > 1
        pending = [RankLog(r, f"[rank {r}] " if prefixed else "") for r in ranks]
        while pending:
            advanced = False
            for log in pending:
                advanced = _read(client, ref, log, stream, follow) or advanced
                if not follow:
                    log.done = True  # without -f: what is there now, once
                    log.write("", final=True)
            pending = [log for log in pending if not log.done]
            if pending and not advanced:
                time.sleep(poll_s)
