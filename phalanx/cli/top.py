"""`phalanx top`: a live terminal view of the cluster (Rich Live) for a login node: the
cluster in one line, each node with a bar per GPU (utilisation, from the agents' last
heartbeats), and the jobs. From the REST API only (`GET /v1/nodes`, `GET /v1/jobs` with the
server doing the filtering and the limit); `--once` prints one frame and exits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, TokenOpt, connect
from phalanx.cli.output import console

if TYPE_CHECKING:
    from rich.console import RenderableType

    from phalanx.api.models import JobInfo, NodeInfo
    from phalanx.client.api import PhalanxClient

BLOCKS = " ▁▂▃▄▅▆▇█"  # a GPU's utilisation, 0 … 100 %
NODE_STYLE = {"up": "green", "drain": "yellow", "down": "red"}
STATE_ORDER = {"R": 0, "PR": 1, "CG": 2, "PD": 3}
MIN_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Frame:
    """What one refresh fetched."""

    nodes: list[NodeInfo]
    jobs: list[JobInfo]
    at: float
    more_jobs: bool  # the head had more live jobs than the limit


def gpu_cell(util: float | None) -> tuple[str, str]:
    """A GPU's one-character bar and its colour (`?`: no reading yet)."""
    if util is None:
        return "?", "dim"
    level = max(0.0, min(100.0, util))
    char = BLOCKS[round(level / 100 * (len(BLOCKS) - 1))]
    if char == " ":
        char = "·"  # an idle GPU still shows
    colour = "green" if level >= 70 else "yellow" if level >= 30 else "red"
    return char, colour


def fetch(client: PhalanxClient, user: str | None, team: str | None, limit: int) -> Frame:
    nodes = client.nodes().nodes
    jobs = client.jobs(active=True, user=user, team=team, limit=limit + 1).jobs
    return Frame(nodes, jobs[:limit], time.time(), len(jobs) > limit)


def render(frame: Frame, rows: int, problem: str | None = None) -> RenderableType:
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    nodes, jobs = frame.nodes, frame.jobs
    total = sum(len(n.gpus) for n in nodes)
    used = sum(n.gpus_used for n in nodes)
    readings = [
        t.utilization_pct for n in nodes for t in n.gpu_telemetry if t.utilization_pct is not None
    ]
    mean = f"{sum(readings) / len(readings):.0f}%" if readings else "-"
    states: dict[str, int] = {}
    for n in nodes:
        states[n.state] = states.get(n.state, 0) + 1
    by_state: dict[str, int] = {}
    for j in jobs:
        by_state[j.state] = by_state.get(j.state, 0) + 1
    head = Text.assemble(
        ("phalanx top", "bold"),
        f"  {time.strftime('%H:%M:%S', time.localtime(frame.at))}  ",
        f"nodes {len(nodes)} (" + ", ".join(f"{k} {v}" for k, v in sorted(states.items())) + ")",
        f"  GPUs {used}/{total} allocated, mean utilisation {mean}",
        "  jobs " + (", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) or "none"),
        " (more not shown)" if frame.more_jobs else "",
    )
    parts: list[RenderableType] = [head]
    if problem:
        parts.append(Text(problem, style="bold red"))

    node_table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for column in ("NODE", "STATE", "GPUS", "UTIL", "MEM", "TEMP", "POWER", "JOBS"):
        node_table.add_column(column)
    for n in nodes[:rows]:
        by_index = {t.index: t for t in n.gpu_telemetry}
        bar = Text()
        for g in n.gpus:
            t = by_index.get(g.index)
            bar.append(*gpu_cell(None if t is None else t.utilization_pct))
        mem_used = sum(t.memory_used_mb or 0 for t in n.gpu_telemetry)
        mem_all = sum(g.memory_mb for g in n.gpus)
        temps = [t.temperature_c for t in n.gpu_telemetry if t.temperature_c is not None]
        power = [t.power_w for t in n.gpu_telemetry if t.power_w is not None]
        node_table.add_row(
            escape(n.name),
            Text(n.state, style=NODE_STYLE.get(n.state, "red")),
            f"{n.gpus_used}/{len(n.gpus)}",
            bar,
            f"{mem_used / 1024:.0f}/{mem_all / 1024:.0f} GiB" if n.gpu_telemetry else "-",
            f"{max(temps):.0f}°C" if temps else "-",
            f"{sum(power):.0f} W" if power else "-",
            ",".join(str(j) for j in n.jobs[:6]) + ("…" if len(n.jobs) > 6 else ""),
        )
    parts.append(node_table)
    if len(nodes) > rows:
        parts.append(Text(f"… {len(nodes) - rows} more nodes (--rows)", style="dim"))

    job_table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for column in ("JOBID", "USER", "TEAM", "QOS", "ST", "GPUS", "TIME", "NAME", "WHERE/REASON"):
        job_table.add_column(column)
    ordered = sorted(jobs, key=lambda j: (STATE_ORDER.get(j.state, 9), j.id))
    for j in ordered[:rows]:
        started = j.start_time if j.state in ("R", "PR", "CG") else None
        elapsed = _duration(frame.at - started) if started else "-"
        where = ",".join(p.node for p in j.placement) if j.placement else (j.reason or "")
        job_table.add_row(
            str(j.id),
            escape(j.user),
            escape(j.team),
            j.qos,
            j.state,
            str(j.nodes * j.gpus_per_node),
            elapsed,
            escape(j.name[:24]),
            escape(where[:40]),
        )
    parts.append(Text(""))
    parts.append(job_table if jobs else Text("no live jobs", style="dim"))
    if len(jobs) > rows:
        parts.append(Text(f"… {len(jobs) - rows} more jobs (--rows)", style="dim"))
    return Group(*parts)


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    clock = f"{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{days}-{clock}" if days else clock


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", "-n", min=MIN_INTERVAL_S, max=3600, help="Seconds between refreshes."
        ),
    ] = 2.0,
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="Only this user's jobs.", show_default=False)
    ] = None,
    team: Annotated[
        str | None, typer.Option("--team", help="Only this team's jobs.", show_default=False)
    ] = None,
    rows: Annotated[
        int, typer.Option("--rows", min=1, max=10_000, help="Nodes and jobs shown at most.")
    ] = 50,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", min=1, max=100_000, help="Live jobs fetched per refresh (the head's limit)."
        ),
    ] = 1000,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """A live view of nodes, their GPUs (a bar per GPU: its utilisation) and the jobs you
    may see, refreshed every --interval seconds until Ctrl-C (like top/nvtop)."""
    try:
        _run(once, interval, user, team, rows, limit, head, token)
    except KeyboardInterrupt:  # Ctrl-C, whenever it comes: the view ends, no traceback
        return


def _run(
    once: bool,
    interval: float,
    user: str | None,
    team: str | None,
    rows: int,
    limit: int,
    head: str | None,
    token: str | None,
) -> None:
    from phalanx.client.api import ApiError

    out = console()
    with connect(head, token) as client:  # errors of the first fetch exit 2 (one line)
        frame = fetch(client, user, team, limit)
        if once:
            out.print(render(frame, rows))
            return
        from rich.live import Live

        with Live(render(frame, rows), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                try:
                    frame = fetch(client, user, team, limit)
                    live.update(render(frame, rows), refresh=True)
                except ApiError as exc:  # keep the last frame; say why it is stale
                    shown = time.strftime("%H:%M:%S", time.localtime(frame.at))
                    problem = f"{exc} (showing the frame of {shown}; retrying)"
                    live.update(render(frame, rows, problem), refresh=True)
