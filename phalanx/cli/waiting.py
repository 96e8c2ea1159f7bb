"""`phalanx submit --wait`: follow the submitted jobs until they end, then exit as they did."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from phalanx.cli.output import TERMINAL_STATES, duration, elapsed, exit_status

if TYPE_CHECKING:
    from phalanx.api.models import JobInfo
    from phalanx.client.api import PhalanxClient


def _status_line(jobs: list[JobInfo], now: float) -> str:
    job = jobs[0]
    label = f"job {job.id}" if len(jobs) == 1 else f"{len(jobs)} jobs"
    states = ",".join(sorted({j.state for j in jobs}))
    reason = job.reason_message or job.reason
    started = elapsed(job.start_time, job.end_time, now)
    parts = [f"{label}: {states}", f"elapsed {duration(started or 0)}"]
    if job.state == "PD" and reason:
        parts.append(reason)
    if job.exit_code and job.state in TERMINAL_STATES:
        parts.append(f"exit {job.exit_code}")
    return "  ".join(parts)


def wait_for_jobs(client: PhalanxClient, job_ids: list[int], poll_s: float = 0.5) -> int:
    """Show the jobs' status on stderr until every job has ended; the exit status to end
    with. On a terminal, one live line; otherwise (a log file, a pipe) one line each time
    the state or the reason changes, and the last one, each ending in a newline.

    Ctrl-C stops the waiting, not the jobs (as sbatch --wait): it says how to cancel them
    and exits 130, as a shell reports SIGINT."""
    try:
        if sys.stderr.isatty():
            infos = _wait_live(client, job_ids, poll_s)
        else:
            infos = _wait_lines(client, job_ids, poll_s)
    except KeyboardInterrupt:
        sys.stderr.write("\n" if sys.stderr.isatty() else "")
        sys.stderr.write(_still_running(job_ids) + "\n")
        return 130
    codes = [exit_status(j.state, j.exit_code) for j in infos]
    return next((c for c in codes if c), 0)


def _poll(client: PhalanxClient, job_ids: list[int]) -> list[JobInfo]:
    return [client.job(job_id).job for job_id in job_ids]


def _ended(infos: list[JobInfo]) -> bool:
    return all(j.state in TERMINAL_STATES for j in infos)


def _wait_live(client: PhalanxClient, job_ids: list[int], poll_s: float) -> list[JobInfo]:
    from rich.live import Live
    from rich.text import Text

    from phalanx.cli.output import console

    with Live(Text(""), console=console(stderr=True), transient=False, auto_refresh=False) as live:
        while True:
            infos = _poll(client, job_ids)
            live.update(Text(_status_line(infos, time.time())), refresh=True)
            if _ended(infos):
                return infos
            time.sleep(poll_s)


def _wait_lines(client: PhalanxClient, job_ids: list[int], poll_s: float) -> list[JobInfo]:
    said = None  # (states, reason) last written: elapsed time alone is no news in a log
    while True:
        infos = _poll(client, job_ids)
        now = (sorted({j.state for j in infos}), infos[0].reason_message or infos[0].reason)
        if now != said or _ended(infos):
            sys.stderr.write(_status_line(infos, time.time()) + "\n")
            sys.stderr.flush()
            said = now
        if _ended(infos):
            return infos
        time.sleep(poll_s)


def _still_running(job_ids: list[int]) -> str:
    """What Ctrl-C during --wait leaves behind, and the command that stops it."""
    if len(job_ids) == 1:
        return f"job {job_ids[0]} keeps running; `phalanx cancel {job_ids[0]}`"
    first, last = job_ids[0], job_ids[-1]
    if len(job_ids) > 10 and job_ids == list(range(first, last + 1)):
        return f"jobs {first}-{last} keep running; `phalanx cancel $(seq {first} {last})`"
    ids = " ".join(map(str, job_ids))
    return f"jobs {ids} keep running; `phalanx cancel {ids}`"
