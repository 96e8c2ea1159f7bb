"""The top-level command group: usage errors as one `error: …` line, and help that is not
cramped when piped.

Typer prints a usage error (a missing option, a value out of range, an unknown command)
as a Rich box of several lines with the usage above it; docs/cli.md promises one line that
starts with `error: `, as every other failure prints, so scripts can grep for it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import typer

from phalanx.cli.lazy import LazyGroup

# Help wider than 80 columns when piped (`phalanx submit --help | less`): at 80, Rich cut
# option names (`--checkpoint-int…`). On a terminal, Rich uses the terminal's width.
PIPED_HELP_WIDTH = 120

# Pydantic's phrases (Typer checks numeric bounds with it), restated as docs/cli.md words
# things; first match wins.
_PLAIN = [
    (re.compile(r"^Invalid value: "), ""),  # a command's own check: its words say it all
    (re.compile(r"Input should be greater than or equal to (\S+)"), r"must be at least \1"),
    (re.compile(r"Input should be less than or equal to (\S+)"), r"must be at most \1"),
    (re.compile(r"Input should be greater than (\S+)"), r"must be more than \1"),
    (re.compile(r"Input should be less than (\S+)"), r"must be less than \1"),
    (re.compile(r"Input should be a valid integer[^;]*"), "must be a whole number"),
    (re.compile(r"Input should be a valid number[^;]*"), "must be a number"),
    (
        re.compile(r"String should have at most (\d+) characters?"),
        r"too long: at most \1 characters",
    ),
    (re.compile(r"Input should be"), "must be"),
]
_DID_YOU_MEAN = re.compile(r"\s*Did you mean (\S+?)\?")
_POSSIBLE = re.compile(r"\s*\(Possible options: ([^)]*)\)")


def one_line(error: typer.TyperException) -> str:
    """A usage error as `error: what is wrong (see 'phalanx X --help')`. Click already
    suggests the closest command or option ("Did you mean --nodes?"); it is kept, in
    the same words as the job spec's suggestions."""
    message = " ".join(error.format_message().split())
    for pattern, words in _PLAIN:
        message = pattern.sub(words, message)
    message = _DID_YOU_MEAN.sub(r" (did you mean \1?)", message)
    message = _POSSIBLE.sub(_possible, message).replace(". (did you mean", " (did you mean")
    ctx: Any = getattr(error, "ctx", None)
    message = message.rstrip(".")
    if message[:1].isupper() and not message[1:2].isupper():  # not an acronym ("GPU")
        message = message[0].lower() + message[1:]
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {message}{hint}"


def _possible(match: re.Match[str]) -> str:
    options = match.group(1)
    return f" (did you mean {'one of ' if ',' in options else ''}{options}?)"


class CliGroup(LazyGroup):
    """The `phalanx` group (lazy `sim`, see lazy.py) whose usage errors are one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, False, windows_expand_args, **extra)
        if _help_wanted(argv) and not sys.stdout.isatty():
            _widen_help()
        try:
            code = super().main(argv, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as error:  # click's ClickException: a usage error
            if type(error).__name__ == "NoArgsIsHelpError":
                sys.exit(2)  # the help was printed already (as Typer does)
            typer.echo(one_line(error), err=True)
            sys.exit(getattr(error, "exit_code", 2))
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        # Not standalone, click returns what `typer.Exit(code)` carried, or the command's
        # own return value (None: success).
        sys.exit(code if isinstance(code, int) else 0)


def _help_wanted(argv: list[str]) -> bool:
    """Whether this call prints help: `--help` before any `--`, or no arguments at all."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return not argv or "--help" in options


def _widen_help() -> None:
    """Make Typer's help console wider when output is piped, unless the user set
    TERMINAL_WIDTH (Typer's own setting). Imported only when help is printed: it loads
    Rich (a third of a second)."""
    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH
