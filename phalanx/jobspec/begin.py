"""`--begin TIME`: when a job may start at the earliest, as Unix seconds (Slurm's forms)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from phalanx.jobspec.errors import JobSpecError

FORMS = (
    "now+N[s|m|h|d|w] (seconds by default), HH:MM[:SS] (the next such time), "
    "YYYY-MM-DD[THH:MM[:SS]], midnight, noon, teatime, today or tomorrow"
)
_NOW = re.compile(r"now(?:\+([0-9]{1,9})\s*([a-z]*))?")
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
# Matched lowercased, so the date-time separator `T` reads as `t`.
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:t([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?)?")
_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip
_NAMED = {"midnight": 0, "noon": 12, "teatime": 16}  # hour of the next such time


def parse_begin(text: str, now: float) -> float:
    """`--begin` as Unix seconds, in the submitter's local time zone (as sbatch reads it);
    `now` is the current Unix time. JobSpecError for anything else."""
    raw = text.strip().lower()
    local = datetime.fromtimestamp(now)
    try:
        when = _parse(raw, local)
    except ValueError:  # a date or hour out of range (2026-02-30, 25:00)
        when = None
    if when is None:
        raise JobSpecError(f"--begin={text}: not a time; use {FORMS}")
    return when.timestamp() if isinstance(when, datetime) else float(when)


def _parse(raw: str, local: datetime) -> datetime | float | None:
    now_match = _NOW.fullmatch(raw)
    if now_match is not None:
        count, unit = now_match[1], now_match[2] or ""
        if unit not in _UNITS:
            return None
        return local.timestamp() + (int(count) * _UNITS[unit] if count else 0)
    if raw == "today":
        return local.replace(hour=0, minute=0, second=0, microsecond=0)
    if raw == "tomorrow":
        return local.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    if raw in _NAMED:
        return _next(local, _NAMED[raw], 0, 0)
    clock = _CLOCK.fullmatch(raw)
    if clock is not None:
        return _next(local, int(clock[1]), int(clock[2]), int(clock[3] or 0))
    date = _DATE.fullmatch(raw)
    if date is not None:
        year, month, day, hour, minute, second = (int(p or 0) for p in date.groups())
        return datetime(year, month, day, hour, minute, second)
    return None


def _next(local: datetime, hour: int, minute: int, second: int) -> datetime:
    """The next time of day at hour:minute:second (today if still ahead, else tomorrow)."""
    when = local.replace(hour=hour, minute=minute, second=second, microsecond=0)
    return when if when > local else when + timedelta(days=1)
