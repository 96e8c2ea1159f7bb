"""The `--head`/`--token` options every client command takes, and turning failures into
one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.output import fail

if TYPE_CHECKING:
    from phalanx.client.api import PhalanxClient

HeadOpt = Annotated[
    str | None,
    typer.Option(
        "--head",
        help="Head URL, or several comma-separated (a leader and its standbys) "
        "(default: $PHALANX_HEAD, then the client config).",
        show_default=False,
    ),
]
# A file, never the token itself: every user of the machine sees arguments in `ps`.
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        help="File holding the API token (default: $PHALANX_TOKEN, then the client config). "
        "Tokens are never command-line arguments: `ps` shows those to every user.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]

# The client context chosen for this invocation (`phalanx --context NAME …`, also accepted
# after the command name); set by the root command before any command runs.
_selected_context: list[str | None] = [None]


def select_context(name: str | None) -> None:
    """Use client context `name` (None: $PHALANX_CONTEXT, else the one in use)."""
    _selected_context[0] = name


def selected_context() -> str | None:
    return _selected_context[0]


def read_token_file(path: str) -> str:
    """The token in `path` (its first line), or a one-line failure."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--token-file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})")
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        fail(f"--token-file {path} is empty")
    return token


@contextmanager
def connect(head: str | None, token_file: str | None) -> Iterator[PhalanxClient]:
    """A client for the configured head (`token_file`: --token-file); config and API
    errors exit 2 with one line."""
    from phalanx.client.api import ApiError, PhalanxClient
    from phalanx.client.config import ConfigError, resolve

    try:
        config = resolve(
            head,
            read_token_file(token_file) if token_file else None,
            context=selected_context(),
        )
        with PhalanxClient(config.head, config.token, ca=config.ca) as client:
            yield client
    except (ApiError, ConfigError) as exc:
        fail(str(exc))
