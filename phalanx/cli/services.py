"""`phalanx head`, `phalanx agent` and `phalanx up`: running the cluster's processes."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from phalanx.cli.output import fail


def head(
    state_dir: Annotated[
        Path,
        typer.Option(
            help="Where the head keeps its database and tokens.",
            file_okay=False,
            show_default=False,
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8265,
    db: Annotated[
        str | None,
        typer.Option(
            help="Database URL, e.g. postgresql+psycopg://… (default: SQLite in the state dir)."
        ),
    ] = None,
    heartbeat: Annotated[
        float, typer.Option(min=0.1, max=30, help="Seconds between agent heartbeats.")
    ] = 2.0,
    lease: Annotated[
        float,
        typer.Option(
            min=0.5,
            max=3600,
            help="A node silent this long is marked down; its agent stops its jobs after as "
            "long without the head, and they are requeued once --requeue-margin more has "
            "passed (at least 3 heartbeats).",
        ),
    ] = 8.0,
    requeue_margin: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds after the lease before requeueing.")
    ] = 2.0,
    kill_grace: Annotated[
        float, typer.Option(min=0, max=3600, help="Seconds between SIGTERM and SIGKILL.")
    ] = 5.0,
    preempt_grace: Annotated[
        float,
        typer.Option(
            min=0, max=86400, help="Seconds a preempted job has to checkpoint (its own wins)."
        ),
    ] = 60.0,
    hang_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="A job that reports progress and then goes silent this long is restarted "
            "(its own --hang-timeout wins; 0: off).",
        ),
    ] = 600.0,
    max_outage: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="Agents keep their jobs through a head outage (restart, pause, failover) "
            "this long when their peers confirm the head is out (0: fence at the lease).",
        ),
    ] = 600.0,
) -> None:
    """Run the head: REST API, scheduler and state (blocks; Ctrl-C stops it)."""
    from phalanx.head.mirror import Settings
    from phalanx.head.server import serve

    if lease < 3 * heartbeat:
        fail(f"--lease {lease:g} must be at least 3 heartbeats (--heartbeat {heartbeat:g})")
    settings = Settings(
        heartbeat_s=heartbeat,
        lease_s=lease,
        requeue_margin_s=requeue_margin,
        kill_grace_s=kill_grace,
        preempt_grace_s=preempt_grace,
        hang_timeout_s=hang_timeout,
        max_outage_s=max_outage,
    )
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot create the state dir {state_dir}: {exc.strerror}")
    with contextlib.suppress(KeyboardInterrupt):
        serve(state_dir, host, port, db, settings)


def _labels(values: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key or not label:
            fail(f"--label {value!r}: expected KEY=VALUE, e.g. --label rack=r1")
        labels[key] = label
    return labels


def agent(
    head_url: Annotated[
        str,
        typer.Option(
            "--head",
            help="The head's URL, or several comma-separated (a leader and its standbys).",
            show_default=False,
        ),
    ],
    address: Annotated[
        str,
        typer.Option(help="This node's address, as other nodes reach it.", show_default=False),
    ],
    token: Annotated[
        str | None,
        typer.Option(
            help="Join token (default: $PHALANX_JOIN_TOKEN).",
            envvar="PHALANX_JOIN_TOKEN",
            show_envvar=False,
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Node name (default: the hostname).", show_default=False)
    ] = None,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of the agent's API (0: any free one).")
    ] = 0,
    fake_gpus: Annotated[
        int | None,
        typer.Option(min=1, max=62, help="Pretend to have this many GPUs (no NVML needed)."),
    ] = None,
    gpu_model: Annotated[str, typer.Option(help="Model of the fake GPUs.")] = "H100",
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the agent keeps logs and state (default: in the user's app dir).",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(help="Topology label KEY=VALUE, repeatable (rack=r1, block=b1)."),
    ] = None,
    health_check: Annotated[
        list[Path] | None,
        typer.Option(
            help="NHC-style health-check script, repeatable: exit 0 is healthy; otherwise the "
            "first line of its output is reported and the head drains the node.",
            dir_okay=False,
        ),
    ] = None,
    health_interval: Annotated[
        float, typer.Option(help="Seconds between health-check runs (also their timeout).")
    ] = 30.0,
    max_outage: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="Keep jobs running through a head outage at most this long (the head's "
            "--max-outage caps it; 0: fence when the lease runs out).",
        ),
    ] = 600.0,
) -> None:
    """Run an agent on this server: join the head, run the jobs it assigns (blocks)."""
    from phalanx.agent.main import AgentConfig, AgentError, run_agent

    if not token:
        fail(
            "no join token: pass --token or set PHALANX_JOIN_TOKEN (see `phalanx up` output "
            "or `phalanx admin join-token create`)"
        )
    node_name = name or socket.gethostname()
    directory = state_dir or Path(typer.get_app_dir("phalanx")) / f"agent-{node_name}"
    config = AgentConfig(
        head_url=head_url,
        token=token,
        address=address,
        name=node_name,
        port=port,
        fake_gpus=fake_gpus,
        gpu_model=gpu_model,
        state_dir=directory,
        labels=_labels(label or []),
        health_checks=tuple(health_check or ()),
        health_interval_s=health_interval,
        max_outage_s=max_outage,
    )
    try:
        run_agent(config)
    except AgentError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def up(
    nodes: Annotated[int, typer.Option(min=1, max=253, help="Local agents to start.")] = 2,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=62, help="Fake GPUs per agent.")] = 4,
    state_dir: Annotated[
        Path,
        typer.Option(help="Where the head and agents keep their state and logs.", file_okay=False),
    ] = Path("phalanx-state"),
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Head port (0: any free one).")
    ] = 8265,
    db: Annotated[
        str | None,
        typer.Option(help="Database URL (default: SQLite in the state dir)."),
    ] = None,
    gpu_model: Annotated[str, typer.Option(help="Model of the fake GPUs.")] = "H100",
) -> None:
    """Start a head and local agents with fake GPUs, and point the client at them.

    Runs until Ctrl-C, then stops every process it started.
    """
    from phalanx.client.config import save
    from phalanx.local.cluster import ClusterError, LocalCluster

    signal.signal(signal.SIGTERM, _interrupt)
    # A shell starts background jobs with SIGINT ignored; `up` must still stop on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster = LocalCluster(
        state_dir,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_model=gpu_model,
        port=port or None,
        db_url=db,
    )
    typer.echo(f"starting a head and {nodes} agents (state in {cluster.state_dir}) …")
    try:
        cluster.start()
    except ClusterError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("stopped")
        return
    try:
        config = save(cluster.url, cluster.admin_token)
        typer.echo(
            f"Phalanx is up: head {cluster.url}, {nodes} nodes × {gpus_per_node} "
            f"fake {gpu_model} GPUs\n"
            f"  admin token:   {cluster.admin_token_file}\n"
            f"  client config: {config} (phalanx commands now use this cluster)\n"
            f"  logs:          {cluster.log_dir}\n"
            "Try:\n"
            "  phalanx nodes\n"
            f"  phalanx submit -N {nodes} --gpus-per-node {gpus_per_node} --wait -- "
            "python -c \"import os; print('rank', os.environ['RANK'])\"\n"
            "  phalanx queue;  phalanx history;  phalanx logs JOBID\n"
            "Ctrl-C stops everything."
        )
        while True:
            time.sleep(0.5)
            cluster.check()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
        typer.echo("stopping …")
    except ClusterError as exc:
        cluster.stop()
        fail(str(exc), code=1)
    finally:
        cluster.stop()
    typer.echo("stopped")
