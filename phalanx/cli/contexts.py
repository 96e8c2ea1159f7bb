"""`phalanx context list|use|add|remove`: several clusters in one client config, like
kubectl's contexts; `--context NAME` on any command (or $PHALANX_CONTEXT) picks one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from phalanx.cli.connect import read_token_file
from phalanx.cli.output import console, fail

context_app = typer.Typer(
    help="Client contexts: named clusters (head URL, token, CA) and the one commands use.",
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(help="Context name.", show_default=False)]
CONTEXT_HELP = "Use this client context for this command (`phalanx context list`)."


def _load() -> tuple[Path, Any]:
    from phalanx.client.config import ConfigError, config_path, load_contexts

    path = config_path()
    try:
        return path, load_contexts(path)
    except ConfigError as exc:
        fail(str(exc))


@context_app.command("list")
def context_list() -> None:
    """The contexts, with the one in use marked `*` (tokens are never shown)."""
    from rich.markup import escape
    from rich.table import Table

    path, stored = _load()
    if not stored.contexts:
        typer.echo(f"no contexts in {path}: `phalanx up` or `phalanx context add` makes one")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("CURRENT", "NAME", "HEAD", "CA"):
        table.add_column(column)
    for name in sorted(stored.contexts):
        entry = stored.contexts[name]
        current = "*" if name == stored.current else ""
        table.add_row(
            current, escape(name), escape(entry.get("head", "")), escape(entry.get("ca", ""))
        )
    console().print(table)


@context_app.command("use")
def context_use(name: NameArg) -> None:
    """Make commands use context NAME from now on."""
    from phalanx.client.config import write_contexts

    path, stored = _load()
    if name not in stored.contexts:
        known = ", ".join(sorted(stored.contexts)) or "none"
        fail(f"no context {name!r} (contexts: {known})")
    stored.current = name
    write_contexts(stored, path)
    typer.echo(f"using context {name} ({stored.contexts[name].get('head')})")


@context_app.command("add")
def context_add(
    name: NameArg,
    head: Annotated[
        str,
        typer.Option("--head", help="Head URL, or several comma-separated.", show_default=False),
    ],
    token_file: Annotated[
        str,
        typer.Option(
            "--token-file",
            help="File holding the API token (stored in the 0600 config; never an argument).",
            show_default=False,
        ),
    ],
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            help="The head's CA certificate to pin (its STATE_DIR/tls/ca.crt).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    use: Annotated[
        bool, typer.Option("--use/--no-use", help="Also make it the one in use.")
    ] = True,
) -> None:
    """Add or replace context NAME."""
    from phalanx.client.api import ApiError, _head_urls
    from phalanx.client.config import ConfigError, normalize_heads, save_context

    try:
        heads = normalize_heads(head)
        _head_urls(heads)
    except (ConfigError, ApiError) as exc:
        fail(str(exc.detail if isinstance(exc, ApiError) else exc))
    if ca_file is not None and not ca_file.is_file():
        fail(f"--ca-file {ca_file}: no such file")
    token = read_token_file(token_file)
    ca = str(ca_file.resolve()) if ca_file is not None else None
    try:
        path = save_context(name, heads, token, ca=ca, use=use)
    except ConfigError as exc:
        fail(str(exc))
    typer.echo(f"context {name} saved in {path}" + (" and in use" if use else ""))


@context_app.command("remove")
def context_remove(name: NameArg) -> None:
    """Forget context NAME (and its token)."""
    from phalanx.client.config import write_contexts

    path, stored = _load()
    if stored.contexts.pop(name, None) is None:
        fail(f"no context {name!r}")
    if stored.current == name:
        stored.current = None
    write_contexts(stored, path)
    left = "" if stored.current else " (no context is in use now: `phalanx context use NAME`)"
    typer.echo(f"context {name} removed{left}")
