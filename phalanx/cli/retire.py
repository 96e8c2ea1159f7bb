"""`phalanx admin user disable|enable|delete`, `admin team delete`, `admin node remove` and
`admin recover`: taking users, teams and nodes out of the cluster, and getting admin access
back from the head's state dir."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import fail, print_json

ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Do it even if it leaves no working admin token (recover with "
        "`phalanx admin recover`).",
    ),
]
UserArg = Annotated[str, typer.Argument(help="User name.", show_default=False)]


def user_disable(
    name: UserArg,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Disable a user: their tokens are refused at once; their running jobs go on."""
    with connect(head, token) as client:
        info = client.disable_user(name, force)
    if json_out:
        print_json(info)
    else:
        typer.echo(f"user {info.name} disabled: their tokens are refused")


def user_enable(
    name: UserArg, json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None
) -> None:
    """Enable a disabled user again: their unrevoked tokens work again."""
    with connect(head, token) as client:
        info = client.enable_user(name)
    if json_out:
        print_json(info)
    else:
        typer.echo(f"user {info.name} enabled")


def user_delete(
    name: UserArg, force: ForceOpt = False, head: HeadOpt = None, token: TokenOpt = None
) -> None:
    """Delete a user who has no live job: their tokens are revoked; their ended jobs stay
    in the history."""
    with connect(head, token) as client:
        client.delete_user(name, force)
    typer.echo(f"user {name} deleted; their tokens are revoked")


def team_delete(
    name: Annotated[str, typer.Argument(help="Team name.", show_default=False)],
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a team that has no live job; its members leave it (a user whose default
    team it was must then submit with -p)."""
    with connect(head, token) as client:
        client.delete_team(name)
    typer.echo(f"team {name} deleted")


def node_remove(
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Forget a node that is down and holds no job (it leaves `phalanx nodes`; its agent
    may join again later with a join token)."""
    with connect(head, token) as client:
        client.remove_node(name)
    typer.echo(f"node {name} removed")


def recover(
    state_dir: Annotated[
        Path,
        typer.Option(
            help="The head's state dir (its admin.token is replaced).",
            file_okay=False,
            show_default=False,
        ),
    ],
    db: Annotated[
        str | None,
        typer.Option(help="The head's database URL if not SQLite in the state dir."),
    ] = None,
    user: Annotated[str, typer.Option(help="Admin user to mint the token for.")] = "admin",
) -> None:
    """Mint a new admin token when none works any more (run on the head's machine, as the
    account that can read its state dir and database). The head, running or not, accepts
    it at once; it is written to STATE_DIR/admin.token (0600)."""
    from sqlalchemy.exc import SQLAlchemyError

    from phalanx.head import admin
    from phalanx.head import db as schema
    from phalanx.head.migrate import upgrade

    if not state_dir.is_dir():
        fail(f"--state-dir {state_dir}: no such directory (the head's --state-dir)")
    url = db or schema.default_url(state_dir)
    if db is None and not (state_dir / "phalanx.db").exists():
        fail(f"{state_dir} holds no phalanx.db: is it the head's state dir? (or pass --db URL)")
    try:
        engine = schema.make_engine(url)
        upgrade(engine)
        token = admin.recover_admin(engine, user)
        engine.dispose()
        path = admin.write_admin_token(state_dir, token)
    except (SQLAlchemyError, ValueError, OSError) as exc:
        fail(f"cannot recover admin access: {str(exc).splitlines()[0]}")
    typer.echo(f"new admin token for user {user} written to {path} (0600)")
    typer.echo(
        f"use it: PHALANX_TOKEN=$(cat {path}) phalanx whoami, or `phalanx context add` it; "
        "revoke the lost ones with `phalanx admin token revoke ID`"
    )
