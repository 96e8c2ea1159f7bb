"""Slurm's `%` output formats (squeue `-o`, sinfo `-o`) and `-O name:width` long formats:
parsing them and printing one line, with Slurm's alignment, widths and cutting."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Spec:
    """One `%[.][width]X` of a format, with the literal text after it (`suffix`)."""

    letter: str  # "" for a literal prefix
    width: int
    right: bool
    suffix: str


def parse_format(text: str) -> list[Spec]:
    """Slurm's `-o` parser: text before the first `%` is a prefix; each `%[.][N]X` field
    keeps the text up to the next `%` as its suffix. A `%` at the end prints nothing."""
    specs: list[Spec] = []
    tokens = text.split("%")
    if tokens[0]:
        specs.append(Spec("", 0, False, tokens[0]))
    for token in tokens[1:]:
        if not token:
            continue
        i = 0
        right = token.startswith(".")
        i += 1 if right else 0
        digits = ""
        while i < len(token) and token[i].isdigit() and len(digits) < 6:
            digits += token[i]
            i += 1
        if i >= len(token):  # `%.5` without a field letter: nothing to print
            continue
        specs.append(Spec(token[i], int(digits or 0), right, token[i + 1 :]))
    return specs


def pad(text: str, width: int, right: bool, cut: bool = True) -> str:
    """Slurm's _print_str: right-aligned (`.`) or left-aligned in `width`, cut to it
    unless `cut` is False; width 0: as is."""
    if width == 0:
        return text
    if right:
        out = text.rjust(width)
        return out[:width] if cut else out
    return (text[:width] if cut else text).ljust(width)


@dataclass(frozen=True, slots=True)
class Column:
    """A field: its header and how to print an item's value (and whether a long value is
    cut to the width, as Slurm cuts all but node lists and times)."""

    header: str
    value: Callable[[Any], str]
    cut: bool = True
    header_cut: bool = True  # headers are cut to the width, but NODELIST's


def render(specs: Sequence[Spec], columns: dict[str, Column], item: Any) -> str:
    """One line (the header when `item` is None) of a `%` format; a letter without a
    column prints as Slurm prints an invalid one: `%X` and its suffix, literally."""
    out: list[str] = []
    for spec in specs:
        if not spec.letter:
            out.append(spec.suffix)
            continue
        column = columns.get(spec.letter)
        if column is None:
            out.append("%" + ("." if spec.right else "") + (str(spec.width) if spec.width else ""))
            out.append(spec.letter + spec.suffix)
            continue
        if item is None:
            out.append(pad(column.header, spec.width, spec.right, column.header_cut))
        else:
            out.append(pad(column.value(item), spec.width, spec.right, column.cut))
        out.append(spec.suffix)
    return "".join(out)


def parse_long_format(text: str, names: dict[str, str]) -> tuple[list[Spec], list[str]]:
    """`-O/--Format name[:[.][size][suffix]],…` into Specs of the letters `names` maps
    each (lower-case) name to; width 20 left-aligned by default, as Slurm. An unknown
    name is left out with an error (Slurm's, printed by the caller), as squeue does."""
    specs: list[Spec] = []
    errors: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, colon, rest = item.partition(":")
        letter = names.get(name.lower())
        if letter is None:
            errors.append(f"Invalid job format specification: {name[:64]}")
            continue
        right, width, suffix = False, 20, ""
        if colon:
            right = rest.startswith(".")
            rest = rest[1:] if right else rest
            digits = ""
            while rest and rest[0].isdigit() and len(digits) < 6:
                digits, rest = digits + rest[0], rest[1:]
            width = int(digits or 0)
            suffix = rest
        specs.append(Spec(letter, width, right, suffix))
    return specs, errors
