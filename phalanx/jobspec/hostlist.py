"""Slurm hostlist expressions: `node[01-04,07]`, `rack[1-2]-node[1-3]`, `127.0.0.[2-3]`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from phalanx.jobspec.errors import JobSpecError

MAX_EXPANDED = 1_000_000  # guards against `n[0-999999999]` eating the machine
_FORBIDDEN = re.compile(r"[\[\],\s]")
_TRAILING_DIGITS = re.compile(r"(.*?)([0-9]{0,18})")
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into host names, in the order written.

    Comma-separated pieces; each piece may hold several bracket groups of numbers and
    ranges (`[01-04,07]`), which multiply out left to right. A range keeps the width of its
    lower bound, so `[08-10]` gives `08 09 10`. An empty expression gives no hosts.
    """
    hosts: list[str] = []
    for piece in _split_top_level(expr):
        segments = _parse_piece(piece, expr)
        count = 1
        for seg in segments:
            count *= len(seg)
        if len(hosts) + count > MAX_EXPANDED:
            raise JobSpecError(f"hostlist {expr!r} names more than {MAX_EXPANDED} hosts")
        hosts.extend("".join(parts) for parts in itertools.product(*segments))
    return hosts


def compress(names: Sequence[str]) -> str:
    """Write host names as one hostlist expression; `expand` gives `names` back exactly.

    Neighbouring names that share a prefix and whose trailing numbers rise are merged into
    one bracket group (`node01,node02,node04` → `node[01-02,04]`); zero padding is kept.
    The order is kept too (it is the rank order of a job's nodes), so it does not sort.
    """
    groups: list[_Group] = []
    for name in names:
        if not name or _FORBIDDEN.search(name):
            raise JobSpecError(
                f"invalid host name {name!r}: it must be non-empty without brackets, "
                "commas or spaces"
            )
        match = _TRAILING_DIGITS.fullmatch(name)
        assert match is not None  # the pattern matches every string
        prefix, digits = match.groups()
        if groups and groups[-1].accepts(prefix, digits):
            groups[-1].numbers.append(int(digits))
        else:
            groups.append(_Group.start(prefix, digits))
    return ",".join(group.render() for group in groups)


@dataclass
class _Group:
    """Names `prefix` + number, numbers rising; width 0: unpadded, else zero-filled."""

    prefix: str
    digits: str  # the first member's digits ("" for a name without a trailing number)
    width: int
    numbers: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, prefix: str, digits: str) -> _Group:
        if not digits:
            return cls(prefix, digits, 0)
        padded = digits != str(int(digits))
        return cls(prefix, digits, len(digits) if padded else 0, [int(digits)])

    def accepts(self, prefix: str, digits: str) -> bool:
        if not digits or not self.numbers or prefix != self.prefix:
            return False
        number = int(digits)
        if number <= self.numbers[-1]:
            return False
        if self.width:
            return len(digits) == self.width
        return digits == str(number)

    def render(self) -> str:
        if len(self.numbers) <= 1:
            return self.prefix + self.digits
        runs: list[str] = []
        start = prev = self.numbers[0]
        for number in [*self.numbers[1:], None]:
            if number is not None and number == prev + 1:
                prev = number
                continue
            lo, hi = str(start).zfill(self.width), str(prev).zfill(self.width)
            runs.append(lo if start == prev else f"{lo}-{hi}")
            if number is not None:
                start = prev = number
        return f"{self.prefix}[{','.join(runs)}]"


def _split_top_level(expr: str) -> list[str]:
    """Split on the commas that are outside brackets."""
    pieces: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expr.strip():
        if char == "[":
            depth += 1
            if depth > 1:
                raise JobSpecError(f"hostlist {expr!r}: brackets cannot be nested")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise JobSpecError(f"hostlist {expr!r}: ']' without a matching '['")
        if char == "," and depth == 0:
            pieces.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise JobSpecError(f"hostlist {expr!r}: '[' without a matching ']'")
    pieces.append("".join(current))
    if pieces == [""]:
        return []
    for piece in pieces:
        if not piece.strip():
            raise JobSpecError(f"hostlist {expr!r} has an empty entry (two commas in a row?)")
    return [piece.strip() for piece in pieces]


def _parse_piece(piece: str, expr: str) -> list[list[str]]:
    """One piece as a list of alternatives per segment: literal text or a bracket group."""
    segments: list[list[str]] = []
    for literal, group in re.findall(r"([^\[]+)|\[([^\]]*)\]", piece):
        if literal:
            if re.search(r"[\]\s]", literal):
                raise JobSpecError(f"hostlist {expr!r}: unexpected character in {literal!r}")
            segments.append([literal])
        else:
            segments.append(_expand_group(group, expr))
    return segments


def _expand_group(group: str, expr: str) -> list[str]:
    values: list[str] = []
    for item in group.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            raise JobSpecError(
                f"hostlist {expr!r}: bad range {item!r} in brackets; use numbers and "
                "ranges like [1-4,7] or [01-16]"
            )
        lo_text, hi_text = match.groups()
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise JobSpecError(f"hostlist {expr!r}: range {item!r} runs backwards")
        if hi - lo >= MAX_EXPANDED:
            raise JobSpecError(f"hostlist {expr!r} names more than {MAX_EXPANDED} hosts")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values
