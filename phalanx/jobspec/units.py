"""Slurm time limits (`-t/--time`) and memory sizes (`--mem`)."""

from __future__ import annotations

import re

from phalanx.jobspec.errors import JobSpecError

_TIME_FORMS = (
    "minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
    "days-hours:minutes:seconds, or UNLIMITED"
)
# `[0-9]` rather than `\d`: `\d` also matches non-ASCII digits, which Slurm does not take;
# bounded, so absurdly long numbers are refused instead of being converted.
_DAYS = re.compile(r"([0-9]{1,9})-([0-9]{1,9})(?::([0-9]{1,9})(?::([0-9]{1,9}))?)?")
_CLOCK = re.compile(r"([0-9]{1,9})(?::([0-9]{1,9})(?::([0-9]{1,9}))?)?")
_MEM = re.compile(r"([0-9]{1,12})([KMGT])?(?:I?B)?", re.IGNORECASE)
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
    days_form = _DAYS.fullmatch(raw)
    if days_form:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in days_form.groups())
    else:
        clock = _CLOCK.fullmatch(raw)
        if clock is None:
            raise JobSpecError(f"invalid time limit {text!r}; use {_TIME_FORMS}")
        parts = [int(g) for g in clock.groups() if g is not None]
        days = 0
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, (minutes, seconds) = 0, parts
        else:
            hours, minutes, seconds = parts
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None


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
    if unit == "K":
        return -(-number // 1024)  # round up: 1K still needs a whole MB
    return number * int(_MEM_FACTOR_MB[unit])
