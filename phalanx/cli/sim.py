"""`phalanx sim`: replay a trace or a synthetic workload through the scheduler."""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from phalanx.core import PLACEMENT_POLICIES, POLICIES, SchedulerConfig
from phalanx.sim.engine import SimConfig
from phalanx.sim.failures import FailureModel
from phalanx.sim.layout import LayoutError, load_yaml, parse_vc_nodes, per_vc, uniform
from phalanx.sim.plots import plot_all
from phalanx.sim.report import summary_table
from phalanx.sim.runner import Scenario, run
from phalanx.sim.workload import Workload, WorkloadError, read_philly, read_pollux, synthetic

err = Console(stderr=True)


def _date(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a date (YYYY-MM-DD[ HH:MM:SS])", param_hint=flag
        ) from None


def _plots_folder(path: Path) -> Path:
    """Make sure plots can be written into `path` (created if missing) before simulating:
    a long run must not end in a traceback over a typo in --plots."""

    def refuse(why: str) -> NoReturn:
        typer.echo(f"error: --plots {path}: cannot write plots there ({why})", err=True)
        raise typer.Exit(2)

    if path.exists() and not path.is_dir():
        refuse("it exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A real write, not os.access: root ignores permission bits, not read-only mounts.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        refuse(exc.strerror or str(exc))
    return path


def _load(
    trace: Path | None,
    synthetic_jobs: int | None,
    gpus: int,
    load: float,
    teams: int,
    seed: int,
    start: datetime | None,
    end: datetime | None,
    vcs: list[str] | None,
    gpus_per_node: int,
) -> Workload:
    if trace is not None and synthetic_jobs is not None:
        raise typer.BadParameter("give either --trace or --synthetic, not both")
    if synthetic_jobs is not None:
        return synthetic(
            synthetic_jobs, gpus, load=load, teams=teams, seed=seed, gpus_per_node=gpus_per_node
        )
    if trace is None:
        raise typer.BadParameter("give a workload: --trace PATH or --synthetic JOBS")
    with trace.open(encoding="utf-8") as f:
        header = f.readline()
    if header.startswith("timestamp,"):
        return read_philly(trace, start, end, vcs)
    if header.startswith("name,time,"):
        if start or end:
            raise typer.BadParameter("--start/--end apply to the Philly trace only")
        return read_pollux(trace)
    raise typer.BadParameter(
        f"{trace}: unknown trace format (expected a Philly CSV starting 'timestamp,' or a "
        "Pollux workload starting 'name,time,')"
    )


def sim(
    trace: Annotated[
        Path | None,
        typer.Option(help="Philly CSV or Pollux workload CSV.", exists=True, dir_okay=False),
    ] = None,
    synthetic_jobs: Annotated[
        int | None,
        typer.Option(
            "--synthetic", min=1, help="Generate this many synthetic jobs instead of a trace."
        ),
    ] = None,
    load: Annotated[float, typer.Option(min=0.01, help="Synthetic offered load (0–1+).")] = 0.9,
    teams: Annotated[int, typer.Option(min=1, help="Synthetic teams.")] = 8,
    start: Annotated[
        str | None, typer.Option(help="Keep jobs submitted at or after this date.")
    ] = None,
    end: Annotated[str | None, typer.Option(help="Keep jobs submitted before this date.")] = None,
    vc_nodes: Annotated[
        str | None,
        typer.Option(
            help="Simulate each listed VC on its own N nodes (VC=N,VC=N,...); "
            "other VCs are dropped."
        ),
    ] = None,
    cluster: Annotated[
        Path | None, typer.Option(help="Cluster layout YAML.", exists=True, dir_okay=False)
    ] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes (single cluster).")] = 64,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=62, help="GPUs per node.")] = 8,
    nodes_per_rack: Annotated[int, typer.Option(min=1, help="Nodes per rack.")] = 32,
    racks_per_block: Annotated[int, typer.Option(min=1, help="Racks per block.")] = 8,
    policy: Annotated[
        str,
        typer.Option(
            help=f"Ordering policy, or several comma-separated to compare: {', '.join(POLICIES)}."
        ),
    ] = "priority",
    placement: Annotated[
        str,
        typer.Option(help=f"Placement policy: {', '.join(PLACEMENT_POLICIES)}."),
    ] = "topology",
    backfill: Annotated[
        bool, typer.Option(help="EASY backfill behind the blocked head job.")
    ] = True,
    preemption: Annotated[bool, typer.Option(help="Allow preemption.")] = True,
    limit_factor: Annotated[
        float, typer.Option(min=0.0, help="Time limit = duration × this (0: no limits).")
    ] = 1.0,
    mtbf_gpu_hours: Annotated[
        float | None,
        typer.Option(
            min=1.0, help="Enable node failures: mean GPU-hours between failures of one GPU."
        ),
    ] = None,
    checkpoint_interval: Annotated[
        float, typer.Option(min=1.0, help="Seconds between checkpoints.")
    ] = 1800.0,
    checkpoint_cost: Annotated[
        float, typer.Option(min=0.0, help="Seconds one checkpoint blocks.")
    ] = 30.0,
    restart_cost: Annotated[float, typer.Option(min=0.0, help="Seconds to restart a job.")] = 120.0,
    repair: Annotated[
        float, typer.Option(min=0.0, help="Seconds to repair a failed node.")
    ] = 3600.0,
    seed: Annotated[int, typer.Option(help="Random seed (synthetic workload, failures).")] = 0,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Parallel processes (default: CPUs).")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout.")
    ] = False,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
) -> None:
    """Replay a workload through the scheduling core on a virtual clock."""
    try:
        policies = [p.strip() for p in policy.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise typer.BadParameter(
                f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}",
                param_hint="--policy",
            )
        if placement not in PLACEMENT_POLICIES:
            raise typer.BadParameter(
                f"unknown placement {placement!r}; known: {', '.join(PLACEMENT_POLICIES)}",
                param_hint="--placement",
            )
        vc_map = parse_vc_nodes(vc_nodes) if vc_nodes else None
        workload = _load(
            trace,
            synthetic_jobs,
            nodes * gpus_per_node,
            load,
            teams,
            seed,
            _date(start, "--start"),
            _date(end, "--end"),
            list(vc_map) if vc_map else None,
            gpus_per_node,
        )
        if vc_map:
            scenario = Scenario.per_vc(per_vc(vc_map, gpus_per_node, nodes_per_rack), workload)
        elif cluster is not None:
            loaded = load_yaml(cluster)
            if isinstance(loaded, dict):
                scenario = Scenario.per_vc(loaded, workload)
            else:
                scenario = Scenario.single(loaded, workload)
        else:
            layout = uniform(nodes, gpus_per_node, nodes_per_rack, racks_per_block)
            scenario = Scenario.single(layout, workload)
    except (WorkloadError, LayoutError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if scenario.jobs == 0:
        err.print("[red]error:[/red] the workload has no jobs (check --start/--end and --vc-nodes)")
        raise typer.Exit(2)
    if plots is not None:
        plots = _plots_folder(plots)

    failures = FailureModel(
        mtbf_gpu_hours, repair, checkpoint_interval, checkpoint_cost, restart_cost, seed
    )
    sched = SchedulerConfig(backfill=backfill, preemption=preemption)
    configs = {
        p: SimConfig(
            policy=p,
            placement=placement,
            scheduler=sched,
            limit_factor=limit_factor or None,
            failures=failures,
        )
        for p in policies
    }
    err.print(
        f"simulating {scenario.jobs:,} jobs on {len(scenario.layouts)} cluster(s) "
        f"under {', '.join(policies)} — {scenario.description}"
    )
    outcomes = run(scenario, configs, workers, report=lambda line: err.print(f"  done: {line}"))
    summaries = {label: o.summary for label, o in outcomes.items()}
    # The results first: a plotting error (a full disk, a file in the way) must not lose them.
    table = summary_table(summaries, f"Phalanx simulation — {scenario.description}")
    if json_out:
        err.print(table)
        payload = summaries[policies[0]] if len(policies) == 1 else {"policies": summaries}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()
    else:
        Console().print(table)
    if plots is not None:
        try:
            paths = plot_all({label: o.results for label, o in outcomes.items()}, plots)
        except (OSError, ValueError) as exc:
            detail = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) else exc
            typer.echo(f"error: plots not written ({detail}); the results above stand", err=True)
            raise typer.Exit(1) from None
        err.print("plots: " + ", ".join(str(p) for p in paths))
