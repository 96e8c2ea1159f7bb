"""Readers of the real serving traces in ../shared/traces/serving (README there).

- Mooncake (FAST'25) `*_trace.jsonl`: `timestamp` (ms from start), `input_length`,
  `output_length`, `hash_ids` (one id per 512-token block of the input; equal ids =
  identical prefix blocks).
- Azure LLM inference 2023 (Splitwise, ISCA'24) `azure_llm_2023_{conv,code}.csv`:
  `TIMESTAMP` (wall clock), `ContextTokens`, `GeneratedTokens`.

Rows come back in arrival order with times in seconds from the first request. A bad row
is an error naming the file and line, never a traceback from deep inside.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
MAX_ROWS = 1_000_000
MAX_HASH_IDS = 4096  # 2M tokens of prompt: beyond any trace row


class TraceError(ValueError):
    """A trace file is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    time_s: float  # arrival, seconds after the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake only: one per 512-token block


def traces_dir() -> Path:
    """`$PHALANX_TRACES/serving`, else shared/traces/serving beside the checkout (or in
    it), as phalanx.sim.demo finds the scheduler's traces."""
    root = os.environ.get("PHALANX_TRACES")
    if root:
        return Path(root) / "serving"
    repo = Path(__file__).resolve().parents[3]
    inside = repo / "shared" / "traces" / "serving"
    return inside if inside.is_dir() else repo.parent / "shared" / "traces" / "serving"


TRACE_FILES = {
    "mooncake": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
    "azure-conv": "azure_llm_2023_conv.csv",
    "azure-code": "azure_llm_2023_code.csv",
}


def trace_path(name: str) -> Path:
    if name not in TRACE_FILES:
        raise TraceError(f"unknown trace {name!r}; known: {', '.join(sorted(TRACE_FILES))}")
    return traces_dir() / TRACE_FILES[name]


def load(name: str, limit: int | None = None) -> list[TraceRow]:
    """The named trace's first `limit` rows (all when None)."""
    path = trace_path(name)
    return load_mooncake(path, limit) if name.startswith("mooncake") else load_azure(path, limit)


def _open(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None


def _count(value: object, what: str, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraceError(f"{where}: {what} must be an integer >= {low}, not {value!r}")
    return value


def load_mooncake(path: Path, limit: int | None = None) -> list[TraceRow]:
    rows: list[TraceRow] = []
    cap = min(limit if limit is not None else MAX_ROWS, MAX_ROWS)
    for number, line in enumerate(_open(path), start=1):
        if len(rows) >= cap:
            break
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: not a JSON object")
        stamp = obj.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
            raise TraceError(f"{where}: timestamp must be a number of ms >= 0")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or len(ids) > MAX_HASH_IDS:
            raise TraceError(f"{where}: hash_ids must be a list of at most {MAX_HASH_IDS}")
        rows.append(
            TraceRow(
                time_s=float(stamp) / 1000.0,
                input_tokens=_count(obj.get("input_length"), "input_length", where, 1),
                output_tokens=_count(obj.get("output_length"), "output_length", where, 1),
                hash_ids=tuple(_count(h, "a hash id", where) for h in ids),
            )
        )
    return _from_first(rows)


def load_azure(path: Path, limit: int | None = None) -> list[TraceRow]:
    rows: list[TraceRow] = []
    cap = min(limit if limit is not None else MAX_ROWS, MAX_ROWS)
    reader = csv.reader(_open(path))
    header = next(reader, None)
    if header != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        raise TraceError(f"{path}: expected the header TIMESTAMP,ContextTokens,GeneratedTokens")
    first: datetime | None = None
    for number, cells in enumerate(reader, start=2):
        if len(rows) >= cap:
            break
        where = f"{path}:{number}"
        if len(cells) != 3:
            raise TraceError(f"{where}: expected 3 columns, found {len(cells)}")
        try:
            # Seven fractional digits: datetime takes six.
            stamp = datetime.fromisoformat(cells[0].strip()[:26])
            inp, out = int(cells[1]), int(cells[2])
        except ValueError:
            raise TraceError(f"{where}: bad row {','.join(cells)[:80]!r}") from None
        first = stamp if first is None else first
        # A few rows carry 0 generated tokens; an engine always returns at least one.
        rows.append(
            TraceRow(
                time_s=(stamp - first).total_seconds(),
                input_tokens=_count(inp, "ContextTokens", where, 1),
                output_tokens=max(1, _count(out, "GeneratedTokens", where, 0)),
            )
        )
    return _from_first(sorted(rows, key=lambda r: r.time_s))


def _from_first(rows: list[TraceRow]) -> list[TraceRow]:
    if not rows:
        return rows
    t0 = min(r.time_s for r in rows)
    return [
        TraceRow(r.time_s - t0, r.input_tokens, r.output_tokens, r.hash_ids)
        for r in sorted(rows, key=lambda r: r.time_s)
    ]
