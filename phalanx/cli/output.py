"""How the CLI prints: one-line errors, JSON, tables that survive a pipe, durations, times."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, NoReturn

import typer

from phalanx.api.states import TERMINAL_JOB_STATES

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console

TERMINAL_STATES = TERMINAL_JOB_STATES
STATE_STYLE = {
    "PD": "yellow",
    "R": "green",
    "CG": "cyan",
    "CD": "green",
    "PR": "magenta",
    "F": "red",
    "CA": "red",
    "TO": "red",
    "NF": "red",
    "OOM": "red",
}


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: MESSAGE` on stderr and exit (2 by default: bad input or API error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print `warning: MESSAGE` on stderr."""
    typer.echo(f"warning: {message}", err=True)


def print_json(model: BaseModel) -> None:
    """A wire model as indented JSON on stdout (what `--json` prints)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")
    sys.stdout.flush()


def console(stderr: bool = False) -> Console:
    """A Rich console; when piped, wide enough that table rows never wrap."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=400, no_color=True)


def duration(seconds: float | None) -> str:
    """Slurm's elapsed-time format: `M:SS`, `H:MM:SS` or `D-HH:MM:SS`."""
    if seconds is None:
        return ""
    from phalanx.jobspec.units import elapsed  # here: most commands never format a duration

    return elapsed(max(0, int(seconds)))


def timestamp(unix: float | None) -> str:
    """A unix time as local `YYYY-MM-DDTHH:MM:SS` (as sacct prints it); '' for None."""
    if unix is None:
        return ""
    return datetime.fromtimestamp(unix).strftime("%Y-%m-%dT%H:%M:%S")


def elapsed(start: float | None, end: float | None, now: float | None = None) -> float | None:
    """Seconds from start to end (or to now while running); None if not started."""
    if start is None:
        return None
    return (end if end is not None else (now or time.time())) - start


def parse_since(value: str, now: float | None = None) -> float:
    """`--since`: unix seconds, an ISO date/time, or an age like `30m`, `12h`, `7d`."""
    text = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if len(text) > 1 and text[-1] in units and text[:-1].isdigit():
        return (now or time.time()) - int(text[:-1]) * units[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(
            f"--since {value!r} is not a time: give an age (30m, 12h, 7d), a date "
            "(2025-01-31[T12:00]) or unix seconds"
        )


def exit_status(state: str, exit_code: str | None) -> int:
    """The process exit status `--wait` ends with: 0 for CD, else the job's code, else 1."""
    if state == "CD":
        return 0
    code = (exit_code or "").split(":", 1)[0]
    return int(code) if code.isdigit() and 0 < int(code) < 256 else 1


# Rich lays a table out cell by cell: fine for a screenful, seconds for 10,000 rows.
RICH_ROWS_MAX = 300
# Control characters a name may hold (a tab, a newline) written as escapes, so one row
# stays one line when piped to grep or awk.
_CONTROL = {i: f"\\x{i:02x}" for i in [*range(0x20), 0x7F]} | {
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
}


def cell(value: str) -> str:
    """`value` with control characters escaped (`\\t`, `\\n`, `\\x1b`): one line, no
    terminal escapes."""
    return value.translate(_CONTROL) if not value.isprintable() else value


def clip(value: str, width: int) -> str:
    """`value` cut to `width` terminal cells with a trailing `…` (0: never cut); wide
    characters (CJK) count as two cells, as a terminal shows them."""
    if width <= 0 or len(value) <= width // 2:  # fits however wide its characters are
        return value
    if value.isascii():
        return value if len(value) <= width else value[: width - 1] + "…"
    from rich.cells import cell_len, set_cell_size

    if cell_len(value) <= width:
        return value
    return set_cell_size(value, width - 1) + "…"


def print_table(
    columns: list[tuple[str, bool]],
    rows: list[list[str]],
    styles: dict[int, dict[str, str]] | None = None,
) -> None:
    """Print rows under `(title, right_aligned)` columns, squeue-style.

    A Rich table (with `styles`: column → value → style) for small listings on a terminal;
    plain fixed-width text otherwise, which stays fast at 10,000+ rows.
    """
    rows = [[cell(value) for value in row] for row in rows]
    if len(rows) <= RICH_ROWS_MAX and sys.stdout.isatty():
        from rich.markup import escape
        from rich.table import Table

        table = Table(box=None, pad_edge=False, header_style="bold")
        for title, right in columns:
            table.add_column(title, justify="right" if right else "left", no_wrap=True)
        for row in rows:
            cells = []
            for i, value in enumerate(row):
                style = (styles or {}).get(i, {}).get(value)
                cells.append(f"[{style}]{escape(value)}[/{style}]" if style else escape(value))
            table.add_row(*cells)
        console().print(table)
        return
    # Widths in terminal cells, not characters: a CJK character takes two.
    from rich.cells import cell_len as rich_cell_len

    def cell_len(value: str) -> int:
        return len(value) if value.isascii() else rich_cell_len(value)

    widths = [cell_len(title) for title, _ in columns]
    for row in rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], cell_len(value))
    last = len(columns) - 1

    def line(values: list[str]) -> str:
        parts = []
        for i, value in enumerate(values):
            pad = " " * (widths[i] - cell_len(value))
            if columns[i][1]:
                parts.append(pad + value)
            else:
                parts.append(value if i == last else value + pad)
        return "  ".join(parts)

    out = [line([title for title, _ in columns])]
    out.extend(line(row) for row in rows)
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()
