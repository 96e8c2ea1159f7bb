"""Did jobs run on through an operation? Which were running on every rank before it, and
how each of them was disturbed after it (a routine operation must disturb none)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from phalanx.api.models import JobInfo
from phalanx.testing import workload
from phalanx.testing.audit import Submission


class Running(NamedTuple):
    """A job running on every rank: its epoch and its ranks' pids."""

    epoch: int
    pids: frozenset[int]


def running_jobs(
    listed: Sequence[JobInfo], subs: Sequence[Submission], head_url: str
) -> dict[int, Running]:
    """Of the head's R jobs (`listed`) that are `subs`, those whose every rank has begun its
    current epoch and is alive (its ledger's `begin` line, checked in /proc against
    `head_url`); a job still starting is left out."""
    by_id = {s.job_id: s for s in subs if s.job_id is not None}
    out = {}
    for info in listed:
        sub = by_id.get(info.id)
        if sub is None or info.state != "R":
            continue
        pids = {
            int(e["pid"])
            for e in workload.read_ledger(sub.ledger)
            if e["event"] == "begin"
            and e["epoch"] == info.epoch
            and workload.is_running(e, head_url)
        }
        if len(pids) == sub.ranks:
            out[info.id] = Running(info.epoch, frozenset(pids))
    return out


def disturbed(
    before: Mapping[int, Running],
    head: Mapping[int, JobInfo],
    lives: Sequence[workload.Life],
    alive: Callable[[int], bool],
) -> list[str]:
    """How each job of `before` was disturbed since, one line per disturbed job: it is
    unknown to the head, or in another epoch, restarted, not R (nor CD), or one of its
    processes is gone without having logged a clean end. `head`: the head's answer now;
    `lives`: the ledgers' processes; `alive(pid)`: whether a process still runs."""
    ended = {x.pid: x.end_code for x in lives}
    out = []
    for job, (epoch, pids) in sorted(before.items()):
        info = head.get(job)
        why = []
        if info is None:
            why.append("unknown to the head")
        else:
            if info.epoch != epoch or info.restart_count:
                why.append(f"epoch {epoch} → {info.epoch}, restart_count {info.restart_count}")
            if info.state not in ("R", "CD"):
                why.append(f"state {info.state}")
        gone = sorted(p for p in pids if not alive(p) and ended.get(p) != 0)
        if gone:
            codes = ", ".join(f"pid {p}: {_how(ended.get(p))}" for p in gone)
            why.append(f"processes gone ({codes})")
        if why:
            out.append(f"job {job}: " + "; ".join(why))
    return out


def _how(code: int | None) -> str:
    return "no end line" if code is None else f"ended {code}"
