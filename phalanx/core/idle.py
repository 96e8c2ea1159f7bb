"""Idle-GPU policy and accounting arithmetic: pure decisions the head's usage tracker applies.

A GPU a job holds is *idle* while its utilisation is at most the policy's threshold; idle
without a break for `window_s` it is *flagged*; flagged for `grace_s` more, the team's
action applies to the job holding it. Time is split at UTC midnight for the daily rollup.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

DAY_S = 86400.0


class IdleAction(enum.Enum):
    """What a team's policy does to a job holding a flagged GPU once the grace is over."""

    NOTIFY = "notify"  # the flag's event only
    PREEMPT = "preempt"  # the cooperative preemption notice: checkpoint, exit, requeue
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """A team's idle-GPU policy (the default applies to a team that set none)."""

    action: IdleAction = IdleAction.NOTIFY
    window_s: float = 1800.0  # idle this long without a break: flagged
    grace_s: float = 600.0  # flagged this long: the action applies
    threshold_pct: float = 1.0  # utilisation at or below this counts as idle


DEFAULT_POLICY = IdlePolicy()


class Verdict(enum.Enum):
    """One GPU's idle standing after a sample or a tick."""

    BUSY = "busy"
    IDLE = "idle"  # idle, not for the window yet
    FLAG = "flag"  # idle for the window just now: flag it
    FLAGGED = "flagged"  # flagged earlier, still idle
    ACT = "act"  # flagged for the grace just now: the action applies


def judge(
    policy: IdlePolicy,
    idle_since: float | None,
    flagged_at: float | None,
    acted: bool,
    now: float,
) -> Verdict:
    """Where a GPU idle since `idle_since` (None: busy) stands at `now`."""
    if idle_since is None:
        return Verdict.BUSY
    if flagged_at is None:
        return Verdict.FLAG if now - idle_since >= policy.window_s else Verdict.IDLE
    if not acted and policy.action is not IdleAction.NOTIFY and now - flagged_at >= policy.grace_s:
        return Verdict.ACT
    return Verdict.FLAGGED


_DAY_NAMES: dict[int, str] = {}  # day number → its name (samples ask ~800 times a second)


def day_of(t: float) -> str:
    """The UTC day (`YYYY-MM-DD`) of unix time `t`."""
    number = int(t // DAY_S)
    name = _DAY_NAMES.get(number)
    if name is None:
        name = time.strftime("%Y-%m-%d", time.gmtime(number * DAY_S))
        if len(_DAY_NAMES) > 100_000:
            _DAY_NAMES.clear()
        _DAY_NAMES[number] = name
    return name


def split_days(start: float, end: float) -> list[tuple[str, float]]:
    """The seconds of [start, end) in each UTC day they touch, in order (empty when
    end <= start): a job running across midnight counts on both days."""
    out: list[tuple[str, float]] = []
    t = start
    while t < end:
        boundary = (t // DAY_S + 1) * DAY_S
        stop = min(end, boundary)
        out.append((day_of(t), stop - t))
        t = stop
    return out
