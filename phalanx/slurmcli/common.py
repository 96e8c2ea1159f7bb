"""What every Slurm-compatible command shares: the head connection (the same resolution as
`phalanx`: $PHALANX_HEAD / $PHALANX_TOKEN, else the client config's context in use) and
Slurm's way of failing (`TOOL: error: MESSAGE` on stderr, exit 1)."""

from __future__ import annotations

import getopt
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

from phalanx.client.api import ApiError, PhalanxClient
from phalanx.client.config import ConfigError, resolve


class SlurmError(Exception):
    """A failure to report as Slurm does: `TOOL: error: MESSAGE`, exit `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def die(message: str, code: int = 1) -> NoReturn:
    raise SlurmError(message, code)


@contextmanager
def connect() -> Iterator[PhalanxClient]:
    """A client for the configured head; a missing config or an API failure becomes a
    SlurmError with the head's one-line message."""
    try:
        config = resolve()
        with PhalanxClient(config.head, config.token, ca=config.ca) as client:
            yield client
    except (ApiError, ConfigError) as exc:
        raise SlurmError(str(exc)) from exc


def run(tool: str, body: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a tool's body, printing a SlurmError as Slurm would; never a traceback for a
    failure the user can act on."""
    try:
        return body(argv)
    except SlurmError as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


def options(tool: str, argv: list[str], short: str, long: list[str]) -> list[tuple[str, str]]:
    """The options of a tool that takes no arguments (squeue, sacct, sinfo), read by GNU
    getopt as Slurm's tools read them; a bad option or a stray argument is Slurm's error."""
    try:
        opts, rest = getopt.gnu_getopt(argv, short, long)
    except getopt.GetoptError as exc:
        die(f'{exc.msg}\nTry "{tool} --help" for more information')
    if rest:
        die(f"Unknown arguments: {' '.join(rest)[:200]}")
    return opts
