"""Slurm's time forms for `sacct -S/-E` (parse_time with its "past" reading: a day or hour
without a date is the latest one not in the future), in the local time zone."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from phalanx.slurmcli.fields import FormatError

FORMS = (
    "HH:MM[:SS][AM|PM], MMDD[YY][-HH:MM[:SS]], MM.DD[.YY][-HH:MM[:SS]], "
    "MM/DD[/YY][-HH:MM[:SS]], YYYY-MM-DD[{T|-}HH:MM[:SS]], today, midnight, noon, "
    "elevenses, fika, teatime, now[{+|-}count[seconds|minutes|hours|days|weeks]]"
)
_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip
_NAMED_HOURS = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_NOW = re.compile(r"now(?:([+-])([0-9]{1,9})([a-z]*))?")
_CLOCK = r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?"
_HOUR = re.compile(_CLOCK + r"\s*(am|pm)?")
# `T` or `-` between date and time: Slurm takes both (TorchX lists jobs with
# `sacct -S1970-01-01-00:00:01`).
_ISO = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:[t-]" + _CLOCK + ")?")
_DAY = re.compile(r"([0-9]{1,2})([./]?)([0-9]{1,2})(?:\2([0-9]{2}))?(?:-" + _CLOCK + ")?")


def parse_time(text: str, now: float) -> float:
    """Unix seconds for one of Slurm's forms (FORMS); FormatError for anything else."""
    raw = text.strip().lower()
    local = datetime.fromtimestamp(now)
    try:
        when = _parse(raw, local)
    except (ValueError, OverflowError):  # 2026-02-30, 25:00
        when = None
    if when is None:
        raise FormatError(f"Invalid time specification: {text[:64]}")
    return when.timestamp()


def _parse(raw: str, local: datetime) -> datetime | None:
    if raw.isdigit() and len(raw) >= 9:  # Unix seconds
        return datetime.fromtimestamp(int(raw))
    if m := _NOW.fullmatch(raw):
        sign, count, unit = m.groups()
        if count is None:
            return local
        if unit not in _UNITS:
            return None
        delta = timedelta(seconds=int(count) * _UNITS[unit])
        return local + delta if sign == "+" else local - delta
    if raw == "today":
        return local.replace(hour=0, minute=0, second=0, microsecond=0)
    if raw in _NAMED_HOURS:
        return _latest(local, local.replace(hour=_NAMED_HOURS[raw], minute=0, second=0), 1)
    if m := _HOUR.fullmatch(raw):
        hour, minute, second, half = m.groups()
        h = int(hour)
        if half is not None:
            if not 1 <= h <= 12:
                return None
            h = h % 12 + (12 if half == "pm" else 0)
        at = local.replace(hour=h, minute=int(minute), second=int(second or 0), microsecond=0)
        return _latest(local, at, 1)
    if m := _ISO.fullmatch(raw):
        y, mo, d, hour, minute, second = m.groups()
        return datetime(int(y), int(mo), int(d), int(hour or 0), int(minute or 0), int(second or 0))
    if m := _DAY.fullmatch(raw):
        mo, _sep, d, yy, hour, minute, second = m.groups()
        year = 2000 + int(yy) if yy is not None else local.year
        at = datetime(year, int(mo), int(d), int(hour or 0), int(minute or 0), int(second or 0))
        if yy is None and at > local:  # the latest such day
            at = at.replace(year=year - 1)
        return at
    return None


def _latest(local: datetime, at: datetime, days: int) -> datetime:
    """`at` today, or `days` earlier if that is still to come."""
    return at if at <= local else at - timedelta(days=days)
