"""`phalanx nodes`, `drain` and `resume`: the servers of the cluster (like sinfo/scontrol)."""

from __future__ import annotations

from typing import Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import console, fail, print_json

COLUMNS = (
    "NAME",
    "STATE",
    "GPUS(USED/TOTAL)",
    "MODEL",
    "HEARTBEAT-AGE",
    "JOBS",
    "CONFINEMENT",
    "REASON",
)
NODE_STYLE = {"up": "green", "draining": "yellow", "drain": "yellow", "down": "red"}


def nodes(
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List nodes: state, GPUs in use, model, heartbeat age, jobs, how jobs are confined
    (cgroups, or none and why), like sinfo -N."""
    from rich.markup import escape
    from rich.table import Table

    with connect(head, token) as client:
        listed = client.nodes()
    if json_out:
        print_json(listed)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in COLUMNS:
        table.add_column(column, justify="left")
    for node in listed.nodes:
        models = ",".join(dict.fromkeys(g.model for g in node.gpus)) or "-"
        age = node.heartbeat_age_s
        style = NODE_STYLE.get(node.state, "red")
        table.add_row(
            node.name,
            f"[{style}]{node.state}[/{style}]",
            f"{node.gpus_used}/{len(node.gpus)}",
            models,
            "-" if age is None else f"{age:.1f}s",
            ",".join(map(str, node.jobs)) or "-",
            escape(node.confinement),
            escape(node.reason or ""),
        )
    console().print(table)


def drain(
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (shown in `phalanx nodes`).", show_default=False)
    ],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Stop placing jobs on a node; running jobs finish (admin)."""
    if not reason.strip():
        fail("--reason must not be empty")
    with connect(head, token) as client:
        info = client.drain(name, reason)
    if json_out:
        print_json(info)
    else:
        typer.echo(f"node {info.name}: {info.state} ({info.reason or reason})")


def resume(
    name: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Put a drained node back in service (admin)."""
    with connect(head, token) as client:
        info = client.resume(name)
    if json_out:
        print_json(info)
    else:
        typer.echo(f"node {info.name}: {info.state}")
