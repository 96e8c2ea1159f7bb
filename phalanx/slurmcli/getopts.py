"""Command lines read as Slurm's tools read theirs (getopt_long: `--opt=value`, `--opt
value`, unique prefixes of long names, `-ovalue`, clusters of short flags, `--`), with
getopt's own error lines."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.slurmcli.common import run


class UsageError(Exception):
    """A command line getopt refuses; printed as getopt does (not as `TOOL: error:`)."""


def run_tool(tool: str, body: Callable[[list[str]], int], argv: list[str]) -> int:
    """common.run, plus getopt's usage errors (exit 1, as Slurm's tools)."""

    def guarded(args: list[str]) -> int:
        try:
            return body(args)
        except UsageError as exc:
            print(exc, file=sys.stderr)
            return 1

    return run(tool, guarded, argv)


@dataclass(frozen=True)
class Opt:
    long: str
    short: str | None = None
    takes_value: bool = False


@dataclass
class Parsed:
    values: dict[str, list[str | None]] = field(default_factory=dict)  # by long name
    arguments: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.values

    def last(self, name: str) -> str | None:
        given = self.values.get(name)
        return given[-1] if given else None

    def all(self, name: str) -> list[str]:
        return [value for value in self.values.get(name, []) if value is not None]


def usage_lines(tool: str, problem: str) -> str:
    """getopt's two lines: the problem, and where to read more."""
    return f'{tool}: {problem}\nTry "{tool} --help" for more information'


def parse(tool: str, argv: list[str], options: list[Opt], *, permute: bool = True) -> Parsed:
    """Options and arguments; `permute` (GNU getopt's default) lets options follow
    arguments, otherwise the first argument ends the options (srun, salloc)."""
    by_long = {opt.long: opt for opt in options}
    by_short = {opt.short: opt for opt in options if opt.short}
    out = Parsed()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            out.arguments.extend(argv[i:])
            break
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            opt = by_long.get(name)
            if opt is None:
                matches = [o for long, o in by_long.items() if long.startswith(name)]
                if len(matches) != 1:
                    what = "ambiguous" if matches else "unrecognized"
                    raise UsageError(usage_lines(tool, f"{what} option '--{name}'"))
                opt = matches[0]
            value: str | None = inline if eq else None
            if opt.takes_value and value is None:
                if i >= len(argv):
                    raise UsageError(
                        usage_lines(tool, f"option '--{opt.long}' requires an argument")
                    )
                value, i = argv[i], i + 1
            elif not opt.takes_value and eq:
                raise UsageError(
                    usage_lines(tool, f"option '--{opt.long}' doesn't allow an argument")
                )
            out.values.setdefault(opt.long, []).append(value)
        elif token.startswith("-") and len(token) > 1:
            j = 1
            while j < len(token):
                opt = by_short.get(token[j])
                if opt is None:
                    raise UsageError(usage_lines(tool, f"invalid option -- '{token[j]}'"))
                j += 1
                if not opt.takes_value:
                    out.values.setdefault(opt.long, []).append(None)
                    continue
                if j < len(token):
                    value = token[j:]
                elif i < len(argv):
                    value, i = argv[i], i + 1
                else:
                    raise UsageError(
                        usage_lines(tool, f"option requires an argument -- '{opt.short}'")
                    )
                out.values.setdefault(opt.long, []).append(value)
                break
        else:
            out.arguments.append(token)
            if not permute:
                out.arguments.extend(argv[i:])
                break
    return out
