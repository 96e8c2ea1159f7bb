"""Notices (preemption, `--signal`, `cancel --signal`): which were delivered, kept on disk."""

from __future__ import annotations

import logging
import signal
from collections.abc import Hashable, Sequence
from pathlib import Path

from phalanx.api.models import Assignment, Notice

from .processes import ProcessManager

log = logging.getLogger(__name__)

RECORD_NAME = "notices"  # in each launch dir: one delivered notice id per line


def signal_of(name: str) -> signal.Signals | None:
    """The signal a notice names ("SIGUSR1"), or None if this system has no such signal."""
    try:
        return signal.Signals[name]
    except KeyError:
        return None


def delivered(job_dir: Path) -> set[int]:
    """The notice ids already delivered for this launch (by this agent or an earlier run)."""
    try:
        text = (job_dir / RECORD_NAME).read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split() if x.isdigit()}


def remember(job_dir: Path, notice_id: int) -> None:
    """Record a delivery before the signal goes out: after a crash a notice may be lost,
    but never delivered twice."""
    job_dir.mkdir(parents=True, exist_ok=True)
    with open(job_dir / RECORD_NAME, "a") as f:
        f.write(f"{notice_id}\n")


def forget(job_dir: Path) -> None:
    """Drop the record of a launch dir reused by another job (a new cluster, same ids)."""
    (job_dir / RECORD_NAME).unlink(missing_ok=True)


def send(procs: ProcessManager, a: Assignment, ranks: Sequence[Hashable], n: Notice) -> None:
    """Signal the job's process groups on this node: its ranks (`ranks`, their process
    keys) only when `batch_only`; a batch job's srun step tasks only when `steps_only`
    (other launchers' ranks are its tasks: all of them); else every running process of
    the launch (srun step tasks too). An unknown signal name is logged and skipped."""
    sig = signal_of(n.signal)
    if sig is None:
        log.warning("job %d: notice %d names %s, unknown here; skipped", a.job_id, n.id, n.signal)
        return
    if n.batch_only:
        reached = sum(procs.send_signal(k, sig) for k in ranks)
    elif n.steps_only and a.launcher == "batch":
        # scancel --signal without -b/-f: srun's step tasks, not the batch script.
        reached = procs.signal_owned((a.job_id, a.epoch), sig, skip=set(ranks))
    else:
        reached = procs.signal_owned((a.job_id, a.epoch), sig)
    log.info(
        "job %d.%d: notice %d (%s: %s) sent to %d process group(s)",
        a.job_id,
        a.epoch,
        n.id,
        n.signal,
        n.reason,
        reached,
    )
