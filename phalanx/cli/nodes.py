"""`phalanx nodes`, `drain` and `resume`: the servers of the cluster (like sinfo/scontrol)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import console, fail, print_json, print_table

if TYPE_CHECKING:
    from phalanx.api.models import NodeList

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
    long: Annotated[
        bool,
        typer.Option(
            "--long", "-l", help="Also each GPU's utilisation and memory in use, as last reported."
        ),
    ] = False,
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """List nodes: state, GPUs in use, model, heartbeat age, jobs, how jobs are confined
    (cgroups, or none and why), like sinfo -N. With -l, one line per GPU: its utilisation,
    memory in use, temperature and power from the agent's last heartbeat."""
    from rich.markup import escape
    from rich.table import Table

    with connect(head, token) as client:
        listed = client.nodes()
    if json_out:
        print_json(listed)
        return
    if long:
        _gpus(listed)
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


GPU_COLUMNS = ("NODE", "STATE", "GPU", "MODEL", "UTIL", "MEM(USED/TOTAL)", "TEMP", "POWER", "AGE")


def _gpus(listed: NodeList) -> None:
    """`nodes -l`: one row per GPU, as its agent last reported it ('-': no reading)."""
    rows = []
    for node in listed.nodes:
        readings = {g.index: g for g in node.gpu_telemetry}
        age = "-" if node.telemetry_age_s is None else f"{node.telemetry_age_s:.1f}s"
        for gpu in node.gpus:
            r = readings.get(gpu.index)
            util = None if r is None else r.utilization_pct
            used = None if r is None else r.memory_used_mb
            temp = None if r is None else r.temperature_c
            power = None if r is None else r.power_w
            rows.append(
                [
                    node.name,
                    node.state,
                    str(gpu.index),
                    gpu.model,
                    "-" if util is None else f"{util:.0f}%",
                    f"{'-' if used is None else f'{used / 1024:.1f}'}/{gpu.memory_mb / 1024:.1f}G",
                    "-" if temp is None else f"{temp:.0f}C",
                    "-" if power is None else f"{power:.0f}W",
                    age,
                ]
            )
    print_table([(c, c in ("GPU", "UTIL", "TEMP", "POWER")) for c in GPU_COLUMNS], rows)


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
