"""Values of `--dependency`, `--array` and `--signal`, parsed into wire types."""

from __future__ import annotations

import re
import signal as signals
from typing import cast

from phalanx.api.models import (
    MAX_ARRAY_TASKS,
    ArraySpec,
    DependencySpec,
    DependencyType,
    SignalSpec,
)
from phalanx.jobspec.errors import JobSpecError

MAX_ARRAY_INDEX = 4_000_000  # ArraySpec's bound on an index
_DEPENDENCY_TYPES = ("after", "afterok", "afterany", "afternotok")
_UNSUPPORTED_DEPENDENCIES = ("singleton", "aftercorr", "afterburstbuffer", "expand")
_ARRAY_ITEM = re.compile(r"([0-9]{1,30})(?:-([0-9]{1,30})(?::([0-9]{1,30}))?)?")
_SIGNAL = re.compile(r"(?:([RB]+):)?([A-Za-z0-9]{1,20})(?:@([0-9]{1,30}))?")


def parse_dependency(text: str) -> tuple[list[DependencySpec], bool]:
    """`afterok:1:2,afterany:3` → specs, and whether any one suffices (`?` separator).

    Types after, afterok, afterany, afternotok. Slurm's singleton, aftercorr,
    afterburstbuffer, `+time` delays and array-task ids (`12_3`) are not supported.
    """
    raw = text.strip()
    if not raw:
        raise JobSpecError("empty --dependency; use e.g. afterok:12 or afterany:12:13")
    if "," in raw and "?" in raw:
        raise JobSpecError(
            f"--dependency={text}: use either ',' (all must hold) or '?' (any may hold), not both"
        )
    any_of = "?" in raw
    specs: list[DependencySpec] = []
    for part in re.split(r"[,?]", raw):
        kind, _, ids = part.strip().partition(":")
        if kind in _UNSUPPORTED_DEPENDENCIES:
            raise JobSpecError(
                f"--dependency={text}: '{kind}' dependencies are not supported by Phalanx; "
                f"use one of {', '.join(_DEPENDENCY_TYPES)}"
            )
        if kind not in _DEPENDENCY_TYPES:
            raise JobSpecError(
                f"--dependency={text}: unknown dependency type {kind!r}; use "
                f"{', '.join(_DEPENDENCY_TYPES)} followed by :JOBID[:JOBID...]"
            )
        if not ids:
            raise JobSpecError(f"--dependency={text}: '{kind}' needs job ids, e.g. {kind}:12")
        job_ids = [_dependency_id(text, item) for item in ids.split(":")]
        specs.append(DependencySpec(type=cast(DependencyType, kind), job_ids=job_ids))
    return specs, any_of


def _dependency_id(text: str, item: str) -> int:
    if "+" in item:
        raise JobSpecError(
            f"--dependency={text}: delays ('{item}') are not supported; give the job id only"
        )
    if "_" in item:
        raise JobSpecError(
            f"--dependency={text}: dependencies on single array tasks ('{item}') are not "
            "supported; depend on the whole array job id"
        )
    if not re.fullmatch(r"[0-9]{1,18}", item) or int(item) < 1:
        raise JobSpecError(f"--dependency={text}: {item!r} is not a job id (a number ≥ 1)")
    return int(item)


def parse_array(text: str) -> ArraySpec:
    """`0-15%4`, `1,3,5`, `0-15:2`, or a mix (`1,4-8:2%3`) → sorted, unique indices."""
    raw = text.strip()
    body, pct, limit = raw.partition("%")
    max_parallel: int | None = None
    if pct:
        if not re.fullmatch(r"[0-9]{1,9}", limit) or int(limit) < 1:
            raise JobSpecError(
                f"--array={text}: the limit after '%' must be a number ≥ 1, e.g. 0-15%4"
            )
        max_parallel = int(limit)
    indices: set[int] = set()
    for item in body.split(","):
        match = _ARRAY_ITEM.fullmatch(item.strip())
        if match is None:
            raise JobSpecError(
                f"--array={text}: cannot read {item!r}; use indices and ranges like "
                "0-15, 1,3,5, 0-15:2 or 0-15%4"
            )
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        step = int(match.group(3)) if match.group(3) is not None else 1
        if hi < lo or step < 1:
            raise JobSpecError(f"--array={text}: range {item!r} is empty")
        if hi > MAX_ARRAY_INDEX:
            raise JobSpecError(f"--array={text}: indices must be at most {MAX_ARRAY_INDEX}")
        if len(indices) + (hi - lo) // step + 1 > MAX_ARRAY_TASKS:
            raise JobSpecError(f"--array={text}: more than {MAX_ARRAY_TASKS} tasks")
        indices.update(range(lo, hi + 1, step))
    if len(indices) > MAX_ARRAY_TASKS:
        raise JobSpecError(f"--array={text}: more than {MAX_ARRAY_TASKS} tasks")
    return ArraySpec(indices=sorted(indices), max_parallel=max_parallel)


def parse_signal(text: str) -> tuple[SignalSpec, list[str]]:
    """`[{R|B}:]SIG[@secs]` → SignalSpec; SIG is a name (USR1, SIGUSR1) or a number.

    The default lead time is 60 s, as in Slurm. `R:` (overlap with reservations) has no
    meaning in Phalanx; it is accepted with a warning.
    """
    match = _SIGNAL.fullmatch(text.strip())
    if match is None:
        raise JobSpecError(
            f"--signal={text}: use [B:]SIGNAL[@SECONDS], e.g. USR1@120 or B:SIGUSR1@90"
        )
    flags, sig, secs = match.groups()
    warnings: list[str] = []
    if flags and "R" in flags:
        warnings.append(f"--signal={text}: the R: flag has no meaning in Phalanx; ignored")
    name = signal_name(f"--signal={text}", sig)
    seconds = int(secs) if secs is not None else 60
    if seconds > 65535:
        raise JobSpecError(f"--signal={text}: the lead time must be 0..65535 seconds")
    spec = SignalSpec(signal=name, seconds_before=seconds, batch_only=bool(flags and "B" in flags))
    return spec, warnings


def signal_name(where: str, sig: str) -> str:
    """A signal name (`USR1`, `sigusr1`, `SIGUSR1`) or number (`10`) → `SIGUSR1`.

    Numbers are read with this machine's numbering (they differ between platforms); the
    name goes on the wire. `where` (e.g. `--signal=USR1@9`) starts every error message.
    """
    if sig.isdigit():
        try:
            return signals.Signals(int(sig)).name
        except ValueError:
            raise JobSpecError(f"{where}: {sig} is not a signal number") from None
    name = sig.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in signals.Signals.__members__:
        raise JobSpecError(f"{where}: unknown signal {sig!r}; e.g. USR1, TERM, 10")
    return name
