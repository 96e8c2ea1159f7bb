"""Slurm time limits (`-t/--time`), durations in seconds, and memory sizes (`--mem`)."""

from __future__ import annotations

import re

from phalanx.api.models import MAX_INT32
from phalanx.jobspec.errors import JobSpecError

_TIME_FORMS = (
    "minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
    "days-hours:minutes:seconds, or UNLIMITED"
)
# `[0-9]` rather than `\d`: `\d` also matches non-ASCII digits, which Slurm does not take.
# Bounded, so a number is never too long to convert (Python refuses 4300+ digits), yet
# long enough that a number too large is told so (`too large`), not called invalid.
_N = "[0-9]{1,30}"
_DAYS = re.compile(rf"({_N})-({_N})(?::({_N})(?::({_N}))?)?")
_CLOCK = re.compile(rf"({_N})(?::({_N})(?::({_N}))?)?")
_SECONDS = re.compile(_N)
MAX_TIME_LIMIT_S = MAX_INT32  # JobSpec.time_limit_s's bound: about 68 years
_DURATION_FORMS = (
    "seconds, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes or "
    "days-hours:minutes:seconds (e.g. 90, 1:30, 0:10:00)"
)
_MEM = re.compile(rf"({_N})([KMGT])?(?:I?B)?", re.IGNORECASE)
MAX_MEM_MB = MAX_INT32  # JobSpec.mem_mb's bound: 2 PiB
_MEM_FACTOR_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_time(text: str) -> int | None:
    """Parse a Slurm time limit into seconds; None means no limit.

    Forms as `sbatch -t`: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`. `UNLIMITED`,
    `INFINITE` and `-1` (Slurm's own spellings) and a zero limit (Slurm: "a time limit of
    zero requests that no time limit be imposed") all give None. Seconds are kept exactly
    (Slurm rounds a limit up to whole minutes). Fields are not range-checked, as in Slurm:
    `0:90` is 90 seconds.
    """
    raw = text.strip()
    if raw.upper() in {"UNLIMITED", "INFINITE", "-1"}:
        return None
    if not raw:
        raise JobSpecError(f"empty time limit; use {_TIME_FORMS}")
    total = _slurm_seconds(raw)
    if total is None:
        raise JobSpecError(f"invalid time limit {text!r}; use {_TIME_FORMS}")
    if total > MAX_TIME_LIMIT_S:
        raise JobSpecError(
            f"time limit {text!r} is too large (max {_clock(MAX_TIME_LIMIT_S)}, about 68 "
            "years); use UNLIMITED for no limit"
        )
    return total or None


def parse_duration(option: str, text: str, *, maximum: int) -> int:
    """Parse a duration for `option` into seconds, 0..maximum, or a JobSpecError naming both.

    A bare number is seconds (unlike `-t`, where it is minutes: these options are about
    seconds, as the head's own `--preempt-grace` and `--hang-timeout`); the other forms
    are `-t`'s: `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`. 0 is kept (it is not "none").
    """
    raw = text.strip()
    seconds = int(raw) if _SECONDS.fullmatch(raw) else _slurm_seconds(raw)
    if seconds is None:
        raise JobSpecError(f"{option}={text}: invalid duration; use {_DURATION_FORMS}")
    if seconds > maximum:
        raise JobSpecError(f"{option}={text}: at most {maximum} seconds ({seconds} given)")
    return seconds


def _slurm_seconds(raw: str) -> int | None:
    """Seconds in one of `-t`'s forms (a bare number is minutes); None for anything else."""
    days_form = _DAYS.fullmatch(raw)
    if days_form:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in days_form.groups())
    else:
        clock = _CLOCK.fullmatch(raw)
        if clock is None:
            return None
        parts = [int(g) for g in clock.groups() if g is not None]
        days = 0
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, (minutes, seconds) = 0, parts
        else:
            hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _clock(seconds: int) -> str:
    """Seconds as `-t`'s longest form, D-HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    return f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def elapsed(seconds: int) -> str:
    """Slurm's elapsed-time form (squeue's TIME, `phalanx queue`): `M:SS`, `H:MM:SS` or
    `D-HH:MM:SS`."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def parse_mem(text: str) -> int:
    """Parse a Slurm memory size into MB (binary units: 1G = 1024M).

    `4096`, `4096M`, `4G`, `1T`, `512K` (rounded up to whole MB); suffixes are case
    insensitive and a trailing `B` is accepted (`4GB`). No unit means MB, as in Slurm.
    `0` gives 0 (Slurm: all of the node's memory); the caller decides what that means.
    """
    raw = text.strip()
    match = _MEM.fullmatch(raw)
    if match is None:
        raise JobSpecError(
            f"invalid memory size {text!r}; use a whole number with an optional unit "
            "K, M, G or T (default M), e.g. 4096 or 64G"
        )
    number = int(match.group(1))
    unit = (match.group(2) or "M").upper()
    # Kilobytes round up: 1K still needs a whole MB.
    mb = -(-number // 1024) if unit == "K" else number * int(_MEM_FACTOR_MB[unit])
    if mb > MAX_MEM_MB:
        raise JobSpecError(f"memory size {text!r} is too large (max {MAX_MEM_MB}M, about 2048T)")
    return mb
