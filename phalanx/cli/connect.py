"""The `--head`/`--token` options every client command takes, and turning failures into
one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token (default: $PHALANX_TOKEN, then the client config).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]


@contextmanager
def connect(head: str | None, token: str | None) -> Iterator[PhalanxClient]:
    """A client for the configured head; config and API errors exit 2 with one line."""
    from phalanx.client.api import ApiError, PhalanxClient
    from phalanx.client.config import ConfigError, resolve

    try:
        config = resolve(head, token)
        with PhalanxClient(config.head, config.token, ca=config.ca) as client:
            yield client
    except (ApiError, ConfigError) as exc:
        fail(str(exc))
