"""`phalanx token …` (your own API tokens) and `phalanx admin token|join-token …`."""

from __future__ import annotations

from typing import Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import console, fail, print_json, timestamp

token_app = typer.Typer(
    help="API tokens: create, list and revoke your own (admins: anyone's; --join: a join token).",
    no_args_is_help=True,
)
join_app = typer.Typer(help="Tokens agents join the cluster with.", no_args_is_help=True)

ExpiresOpt = Annotated[
    str | None,
    typer.Option(
        "--expires",
        help="Life of the token: 24h, 90d, … (default: the head's, 90 days for API tokens "
        "and 24 h for join tokens; never past the expiry of the token you create it with).",
        show_default=False,
    ),
]
SingleUseOpt = Annotated[
    bool, typer.Option("--single-use", help="Join token: spent by the first node that joins.")
]
NodesOpt = Annotated[
    str | None,
    typer.Option(
        "--nodes",
        help="Join token: only for these node names, comma-separated globs (gpu-01,gpu-*).",
        show_default=False,
    ),
]
AddressesOpt = Annotated[
    str | None,
    typer.Option(
        "--addresses",
        help="Join token: only from these address ranges, comma-separated CIDRs "
        "(10.0.0.0/8); both the node's address and the connection's must be in one.",
        show_default=False,
    ),
]


def _seconds(expires: str | None) -> float | None:
    from phalanx.cli.ttl import parse_ttl

    if expires is None:
        return None
    try:
        return parse_ttl("--expires", expires)
    except ValueError as exc:
        fail(str(exc))


def _until(expires: float | None) -> str:
    return "never expires" if expires is None else f"expires {timestamp(expires)}"


@token_app.command("create")
def token_create(
    user: Annotated[
        str | None,
        typer.Argument(help="The token's user (default: you).", show_default=False),
    ] = None,
    description: Annotated[str, typer.Option(help="What the token is for.")] = "",
    expires: ExpiresOpt = None,
    join: Annotated[
        bool, typer.Option("--join", help="A join token for agents instead (admin).")
    ] = False,
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            help="api: a user's token; metrics: a scrape-only token for Prometheus (admin), "
            "reading /metrics and /v1/metrics/gpus and nothing else.",
        ),
    ] = "api",
    single_use: SingleUseOpt = False,
    nodes: NodesOpt = None,
    addresses: AddressesOpt = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Issue an API token (shown once: store it now), or with --join a join token, or with
    --scope metrics a scrape-only token."""
    if scope not in ("api", "metrics"):
        fail(f"--scope {scope!r}: expected api or metrics")
    if scope == "metrics":
        if join or user is not None or single_use or nodes or addresses:
            fail("--scope metrics makes a scrape-only token: no USER, --join or join options")
        _metrics_create(description, expires, json_out, head, token)
        return
    if join:
        if user is not None:
            fail("a join token belongs to no user: drop USER or --join")
        _join_create(description, expires, single_use, nodes, addresses, json_out, head, token)
        return
    if single_use or nodes or addresses:
        fail("--single-use, --nodes and --addresses are for join tokens (--join)")
    seconds = _seconds(expires)
    with connect(head, token) as client:
        issued = client.create_token(user or client.whoami().user, description, seconds)
    if json_out:
        print_json(issued)
    else:
        typer.echo(issued.token)
        typer.echo(
            f"token {issued.id} for {issued.user} ({_until(issued.expires)}): shown once, "
            "store it now (e.g. in a 0600 file; pass it as PHALANX_TOKEN)",
            err=True,
        )


@token_app.command("list")
def token_list(
    everyone: Annotated[
        bool, typer.Option("--all/--mine", help="Admins: every token, or only yours.")
    ] = True,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List tokens: yours (admins: everyone's). Their secrets are never shown again."""
    from rich.markup import escape
    from rich.table import Table

    with connect(head, token) as client:
        tokens = client.tokens(everyone)
    if json_out:
        print_json(tokens)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ("ID", "USER", "KIND", "CREATED", "EXPIRES", "LAST-USED", "REVOKED", "DESCRIPTION")
    for column in columns:
        table.add_column(column)
    for t in tokens.tokens:
        table.add_row(
            str(t.id),
            t.user or t.node or "",
            t.kind + (" (single use)" if t.single_use else ""),
            timestamp(t.created),
            timestamp(t.expires) if t.expires is not None else "never",
            timestamp(t.last_used),
            "yes" if t.revoked else "",
            escape(t.description),
        )
    console().print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (see token list).", show_default=False)],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Revoke it even if it is the last working admin token (recover with "
            "`phalanx admin recover --state-dir DIR` on the head's machine).",
        ),
    ] = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token (yours; admins: any) and the tokens minted with it: at once. The
    last working admin token is kept unless --force."""
    with connect(head, token) as client:
        client.revoke_token(token_id, force)
    typer.echo(f"token {token_id} revoked")


@join_app.command("create")
def join_token_create(
    description: Annotated[str, typer.Option(help="What the token is for.")] = "",
    expires: ExpiresOpt = None,
    single_use: SingleUseOpt = False,
    nodes: NodesOpt = None,
    addresses: AddressesOpt = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Issue a join token for agents (shown once; give it to `phalanx agent --token-file`)."""
    _join_create(description, expires, single_use, nodes, addresses, json_out, head, token)


def _join_create(
    description: str,
    expires: str | None,
    single_use: bool,
    nodes: str | None,
    addresses: str | None,
    json_out: bool,
    head: str | None,
    token: str | None,
) -> None:
    from pydantic import ValidationError

    from phalanx.api.models import JoinTokenCreate

    try:
        spec = JoinTokenCreate(
            description=description,
            single_use=single_use,
            expires_s=_seconds(expires),
            nodes=_items(nodes),
            addresses=_items(addresses),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    with connect(head, token) as client:
        issued = client.create_join_token(spec)
    if json_out:
        print_json(issued)
        return
    typer.echo(issued.token)
    kind = "single-use join token" if single_use else "join token"
    typer.echo(
        f"{kind} {issued.id} ({_until(issued.expires)}): save it to a 0600 file and start "
        "agents with `phalanx agent --head URL --address ADDR --token-file FILE` "
        "(or PHALANX_JOIN_TOKEN=…)",
        err=True,
    )


def _items(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def _metrics_create(
    description: str, expires: str | None, json_out: bool, head: str | None, token: str | None
) -> None:
    seconds = _seconds(expires)
    with connect(head, token) as client:
        issued = client.create_metrics_token(description, seconds)
    if json_out:
        print_json(issued)
    else:
        typer.echo(issued.token)
        typer.echo(
            f"scrape-only token {issued.id} ({_until(issued.expires)}): shown once; give it to "
            "Prometheus as its bearer token (authorization.credentials_file)",
            err=True,
        )
