"""`phalanx whoami` and `phalanx admin …`: users, tokens, join tokens, teams, fault injection."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from phalanx.cli import retire
from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import console, fail, print_json
from phalanx.cli.report import idle_policy
from phalanx.cli.tokens import join_app, token_app

admin = typer.Typer(
    help="Manage users, tokens, join tokens, teams and nodes; inject GPU faults; recover "
    "admin access (admin).",
    no_args_is_help=True,
)
user_app = typer.Typer(help="Users: add, set, list, disable, enable, delete.", no_args_is_help=True)
team_app = typer.Typer(help="Teams: GPU quota, cohort, borrowing, fair-share weight, QOS; delete.")
node_app = typer.Typer(help="Nodes: replace one (free its name), remove a dead one.")
admin.add_typer(user_app, name="user")
admin.add_typer(token_app, name="token")
admin.add_typer(join_app, name="join-token")
admin.add_typer(team_app, name="team", no_args_is_help=True)
admin.add_typer(node_app, name="node", no_args_is_help=True)
user_app.command("disable")(retire.user_disable)
user_app.command("enable")(retire.user_enable)
user_app.command("delete")(retire.user_delete)
team_app.command("delete")(retire.team_delete)
team_app.command("idle-policy")(idle_policy)
node_app.command("remove")(retire.node_remove)
admin.command("recover")(retire.recover)

QosOpt = Annotated[
    str | None,
    typer.Option(
        "--qos",
        help="QOS allowed, comma-separated (low, normal, high; `low` is always allowed); "
        "`default` clears it.",
        show_default=False,
    ),
]


def _qos(text: str | None) -> list[str] | None:
    if text is None or text.strip() == "default":
        return None
    return [q.strip() for q in text.split(",") if q.strip()]


UidOpt = Annotated[
    int | None,
    typer.Option(
        "--uid",
        min=0,
        max=2**31 - 1,
        help="Unix uid the user's jobs run as on the nodes (default: the account named "
        "like the user).",
    ),
]
GidOpt = Annotated[
    int | None,
    typer.Option("--gid", min=0, max=2**31 - 1, help="Primary Unix gid (default: the uid's own)."),
]


def whoami(json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None) -> None:
    """Who the token belongs to: user, role and teams."""
    with connect(head, token) as client:
        me = client.whoami()
    if json_out:
        print_json(me)
        return
    typer.echo(f"user:  {me.user}")
    typer.echo(f"role:  {me.role}")
    typer.echo(f"teams: {', '.join(me.teams) or '-'}")
    if me.admin_of:
        typer.echo(f"admin of: {', '.join(me.admin_of)}")


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="User name.", show_default=False)],
    is_admin: Annotated[bool, typer.Option("--admin", help="Cluster administrator.")] = False,
    team: Annotated[
        list[str] | None, typer.Option("--team", help="Member of this team (repeatable).")
    ] = None,
    team_admin: Annotated[
        list[str] | None,
        typer.Option("--team-admin", help="Administrator of this team (repeatable)."),
    ] = None,
    default_team: Annotated[
        str | None, typer.Option(help="Team for jobs without -p (default: the first --team).")
    ] = None,
    uid: UidOpt = None,
    gid: GidOpt = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create a user (its jobs run as the Unix account of the same name, or --uid)."""
    from pydantic import ValidationError

    from phalanx.api.models import UserCreate

    teams = list(dict.fromkeys([*(team or []), *(team_admin or [])]))
    try:
        body = UserCreate(
            name=name,
            admin=is_admin,
            teams=teams,
            team_admin_of=list(team_admin or []),
            default_team=default_team or (teams[0] if teams else None),
            uid=uid,
            gid=gid,
        )
    except ValidationError as exc:
        fail(_first_error(exc))
    with connect(head, token) as client:
        info = client.create_user(body)
    if json_out:
        print_json(info)
    else:
        typer.echo(f"user {info.name} created (teams: {', '.join(info.teams) or '-'})")
        typer.echo(f"next: phalanx admin token create {info.name}")


@user_app.command("set")
def user_set(
    name: Annotated[str, typer.Argument(help="User name.", show_default=False)],
    uid: UidOpt = None,
    gid: GidOpt = None,
    by_name: Annotated[
        bool,
        typer.Option(
            "--by-name", help="Forget the uid/gid: map to the account named like the user."
        ),
    ] = False,
    qos: QosOpt = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Change a user: the Unix account its jobs run as on the nodes (--uid/--gid, or
    --by-name), and the QOS it may use (--qos; it wins over the team's). Only what is
    given changes."""
    from pydantic import ValidationError

    from phalanx.api.models import UserUpdate

    if uid is None and gid is None and not by_name and qos is None:
        fail("nothing to change: give --uid N [--gid N], --by-name, or --qos")
    if by_name and (uid is not None or gid is not None):
        fail("--by-name forgets the uid/gid: give it alone, or --uid N [--gid N]")
    if gid is not None and uid is None:
        fail("--gid goes with --uid")
    fields: dict[str, object] = {}
    if uid is not None or by_name:
        fields.update(uid=uid, gid=gid, clear=by_name)
    if qos is not None:
        fields["qos"] = _qos(qos)
    try:
        update = UserUpdate.model_validate(fields)
    except ValidationError as exc:
        fail(_first_error(exc))
    with connect(head, token) as client:
        info = client.set_user(name, update)
    if json_out:
        print_json(info)
        return
    allowed = ", ".join(info.qos) if info.qos is not None else "the team's (default normal)"
    typer.echo(
        f"user {info.name}: jobs run as Unix account {_unix(info.uid, info.gid)}; "
        f"qos {allowed} (low always)"
    )


@node_app.command("replace")
def node_replace(
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a node's credential so a new node may join under its name (its jobs are
    requeued as for a node that died)."""
    with connect(head, token) as client:
        client.replace_node(name)
    typer.echo(f"node {name}: credential revoked; a join token may now register a node {name}")


@user_app.command("list")
def user_list(json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None) -> None:
    """List users."""
    from rich.table import Table

    with connect(head, token) as client:
        users = client.users()
    if json_out:
        print_json(users)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ("NAME", "ADMIN", "TEAMS", "TEAM-ADMIN", "DEFAULT-TEAM", "UNIX", "QOS", "STATUS")
    for column in columns:
        table.add_column(column)
    for u in users.users:
        table.add_row(
            u.name,
            "yes" if u.admin else "",
            ",".join(u.teams),
            ",".join(u.team_admin_of),
            u.default_team or "",
            _unix(u.uid, u.gid),
            ",".join(u.qos) if u.qos is not None else "",
            "disabled" if u.disabled else "",
        )
    console().print(table)


def _unix(uid: int | None, gid: int | None) -> str:
    """How a user maps to a Unix account: `uid:gid`, `uid`, or `by name`."""
    if uid is None:
        return "by name"
    return f"{uid}:{gid}" if gid is not None else str(uid)


@team_app.command("set")
def team_set(
    name: Annotated[str, typer.Argument(help="Team name.", show_default=False)],
    quota: Annotated[
        int | None, typer.Option(min=0, help="GPUs guaranteed to the team (default: no quota).")
    ] = None,
    cohort: Annotated[
        str | None, typer.Option(help="Cohort whose teams lend each other idle quota.")
    ] = None,
    borrowing_limit: Annotated[
        int | None, typer.Option(min=0, help="At most this many GPUs borrowed beyond quota.")
    ] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight (> 0).")] = None,
    qos: QosOpt = None,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create or update a team."""
    from pydantic import ValidationError

    from phalanx.api.models import TeamSpec

    try:
        spec = TeamSpec(
            name=name,
            quota_gpus=quota,
            cohort=cohort,
            borrowing_limit=borrowing_limit,
            weight=weight,
            qos=_qos(qos),
        )
    except ValidationError as exc:
        fail(_first_error(exc))
    with connect(head, token) as client:
        info = client.set_team(spec)
    if json_out:
        print_json(info)
    else:
        quota_text = "no quota" if info.quota_gpus is None else f"quota {info.quota_gpus} GPUs"
        typer.echo(f"team {info.name}: {quota_text}")


@team_app.command("list")
def team_list(json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None) -> None:
    """List teams with quota, cohort, borrowing limit, weight and GPUs in use."""
    from rich.table import Table

    with connect(head, token) as client:
        teams = client.teams()
    if json_out:
        print_json(teams)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NAME", "QUOTA", "COHORT", "BORROW-LIMIT", "WEIGHT", "GPUS-IN-USE", "MEMBERS"):
        table.add_column(column)
    for t in teams.teams:
        table.add_row(
            t.name,
            "-" if t.quota_gpus is None else str(t.quota_gpus),
            t.cohort or "-",
            "-" if t.borrowing_limit is None else str(t.borrowing_limit),
            "-" if t.weight is None else f"{t.weight:g}",
            str(t.gpus_in_use),
            ",".join(t.members),
        )
    console().print(table)


FaultKind = Literal["xid", "ecc_uncorrectable", "row_remap_failure", "gpu_lost"]
# `--kind` spelling → FaultInjection.kind
FAULT_KINDS: dict[str, FaultKind] = {
    "ecc": "ecc_uncorrectable",
    "row-remap": "row_remap_failure",
    "gpu-lost": "gpu_lost",
}


@admin.command("inject-fault")
def inject_fault(
    node: Annotated[
        str, typer.Argument(help="Node name (see `phalanx nodes`).", show_default=False)
    ],
    gpu: Annotated[
        int | None,
        typer.Option(min=0, help="GPU index on the node (default: the node as a whole)."),
    ] = None,
    xid: Annotated[
        int | None,
        typer.Option(
            min=0, max=1000, help="Inject this XID, e.g. 79 (critical) or 13 (application)."
        ),
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(help="Inject another fault instead: ecc, row-remap or gpu-lost."),
    ] = None,
    message: Annotated[str, typer.Option(help="Text the event carries.")] = "injected fault",
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Make a node with fake GPUs report a GPU fault as NVML would (admin; drills, tests)."""
    from pydantic import ValidationError

    from phalanx.api.models import FaultInjection
    from phalanx.api.xid import describe

    if (xid is None) == (kind is None):
        fail("give either --xid CODE or --kind ecc|row-remap|gpu-lost")
    if kind is not None and kind not in FAULT_KINDS:
        fail(f"--kind {kind!r}: expected one of {', '.join(FAULT_KINDS)}")
    try:
        fault = FaultInjection(
            gpu=gpu,
            kind=FAULT_KINDS[kind] if kind is not None else "xid",
            code=xid,
            message=message,
        )
    except ValidationError as exc:
        fail(_first_error(exc))
    with connect(head, token) as client:
        client.inject_fault(node, fault)
    where = f"GPU {gpu}" if gpu is not None else "the node"
    typer.echo(f"node {node}: injected {describe(fault.kind, fault.code)} on {where}")


def _first_error(exc: Exception) -> str:
    """The first pydantic validation error as `field: message`."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            loc = ".".join(str(p) for p in items[0].get("loc", ()))
            return f"{loc}: {items[0].get('msg')}"
    return str(exc).splitlines()[0]
