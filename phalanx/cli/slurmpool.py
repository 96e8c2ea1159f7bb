"""`phalanx slurm-pool`: keep Phalanx agents running as Slurm jobs (docs/slurm.md)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.connect import HeadOpt, TokenOpt, connect
from phalanx.cli.output import fail

if TYPE_CHECKING:
    from phalanx.client.api import PhalanxClient


def slurm_pool(
    join_token_file: Annotated[
        Path,
        typer.Option(
            help="The join token agents use, in a file every compute node can read at the "
            "same path (a shared filesystem). Only its path goes to Slurm, never the token.",
            dir_okay=False,
            show_default=False,
        ),
    ],
    gpus_per_node: Annotated[
        int,
        typer.Option(min=0, max=64, help="GPUs of each node the pool asks Slurm for (--gres)."),
    ],
    partition: Annotated[
        str | None,
        typer.Option(help="Slurm partition (default: Slurm's default one).", show_default=False),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time",
            help="Slurm time limit of each agent job (sbatch --time: MM, H:MM:SS, D-HH…; "
            "default: the partition's).",
            show_default=False,
        ),
    ] = None,
    min_nodes: Annotated[int, typer.Option("--min", min=0, max=10000, help="Nodes kept.")] = 0,
    max_nodes: Annotated[int, typer.Option("--max", min=1, max=10000, help="Nodes at most.")] = 4,
    idle_timeout: Annotated[
        float,
        typer.Option(
            min=0, max=7 * 86400, help="Seconds a node may stay idle before it is released."
        ),
    ] = 600.0,
    leave_before: Annotated[
        int,
        typer.Option(
            min=1,
            max=86400,
            help="With --time: Slurm sends the agent SIGTERM this many seconds before the "
            "limit (sbatch --signal=B:TERM@N), so its jobs checkpoint and requeue in time.",
        ),
    ] = 120,
    leave_grace: Annotated[
        float,
        typer.Option(
            min=0,
            max=86400,
            help="Seconds an agent's jobs get to checkpoint and requeue once it is told to "
            "leave (keep it below --leave-before and Slurm's KillWait).",
        ),
    ] = 60.0,
    name: Annotated[
        str,
        typer.Option(help="The pool's name: its Slurm jobs are named phalanx-pool-NAME."),
    ] = "default",
    node_prefix: Annotated[
        str | None,
        typer.Option(
            help="Phalanx node names: PREFIX + the Slurm job id (default: slurm- for the "
            "default pool, slurm-NAME- otherwise).",
            show_default=False,
        ),
    ] = None,
    state_root: Annotated[
        str,
        typer.Option(help="Where each agent keeps its state on its node (node-local disk)."),
    ] = "/tmp/phalanx-slurm-pool",
    address: Annotated[
        str,
        typer.Option(
            help="The address agents announce: `auto` (the node's first, hostname -I), "
            "`hostname` (its FQDN), `iface:NAME` (its IPv4 address on that interface, e.g. "
            "iface:ib0), or one literal address (a single-host test)."
        ),
    ] = "auto",
    agent_head: Annotated[
        str | None,
        typer.Option(
            help="The head URL(s) as the compute nodes reach them (default: --head's).",
            show_default=False,
        ),
    ] = None,
    agent_ca_file: Annotated[
        str | None,
        typer.Option(
            help="The head's CA certificate at a path the compute nodes can read.",
            show_default=False,
        ),
    ] = None,
    phalanx_command: Annotated[
        str | None,
        typer.Option(
            help="How a compute node runs phalanx (default: this Python with -m phalanx).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            help="sbatch --output for the agents' logs (default: Slurm's slurm-%j.out).",
            show_default=False,
        ),
    ] = None,
    sbatch_arg: Annotated[
        list[str] | None,
        typer.Option(help="Extra sbatch option, repeatable (--sbatch-arg=--account=ml)."),
    ] = None,
    agent_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="Extra `phalanx agent` option, repeatable (--agent-arg=--label=rack=r1)."
        ),
    ] = None,
    slurm_bin: Annotated[
        str | None,
        typer.Option(
            help="Directory of sbatch/squeue/scancel (default: PATH).", show_default=False
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(min=0.1, max=3600, help="Seconds between passes.")
    ] = 10.0,
    once: Annotated[
        bool,
        typer.Option("--once", help="One pass: print what it saw and did as JSON, then exit."),
    ] = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Keep Phalanx agents running as Slurm jobs: one Slurm job per node, growing with
    Phalanx's pending jobs and shrinking when idle, within --min/--max. Needs an admin
    token (it drains and forgets the nodes it gives back)."""
    import logging
    import signal
    import threading

    from phalanx.slurmpool.payload import AgentJob, address_lines, check_args, parse_command
    from phalanx.slurmpool.policy import PoolLimits
    from phalanx.slurmpool.pool import SlurmPool
    from phalanx.slurmpool.slurm import Slurm

    if min_nodes > max_nodes:
        fail(f"--min {min_nodes} is more than --max {max_nodes}")
    if time_limit and leave_grace >= leave_before:
        fail(
            f"--leave-grace {leave_grace:g} must be less than --leave-before {leave_before}: "
            "the jobs must be requeued before the time limit ends the agent"
        )
    if not join_token_file.is_absolute():
        fail(f"--join-token-file must be an absolute path (the nodes read it): {join_token_file}")
    try:
        if not join_token_file.read_text(encoding="utf-8").strip():
            fail(f"the join token file {join_token_file} is empty")
    except OSError as e:
        fail(f"cannot read the join token file {join_token_file}: {e.strerror or e}")
    if not state_root.startswith("/"):
        fail(f"--state-root must be an absolute path: {state_root}")
    if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 40:
        fail(f"--name {name!r}: letters, digits, - and _ only (at most 40)")
    prefix = node_prefix or ("slurm-" if name == "default" else f"slurm-{name}-")
    try:
        extra_sbatch = check_args(sbatch_arg or [], "--sbatch-arg")
        extra_agent = check_args(agent_arg or [], "--agent-arg")
        address_lines(address)
        command = (
            parse_command(phalanx_command) if phalanx_command else (sys.executable, "-m", "phalanx")
        )
    except ValueError as e:
        fail(str(e))
    if not command:
        fail("--phalanx-command is empty")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with connect(head, token) as client:
        _check_admin(client)
        job = AgentJob(
            pool=name,
            head_url=agent_head or ",".join(client.urls),
            token_file=str(join_token_file),
            node_prefix=prefix,
            state_root=state_root,
            phalanx=tuple(command),
            partition=partition,
            gpus_per_node=gpus_per_node,
            time_limit=time_limit,
            leave_before_s=leave_before,
            leave_grace_s=leave_grace,
            address=address,
            ca_file=agent_ca_file,
            output=output,
            sbatch_args=tuple(extra_sbatch),
            agent_args=tuple(extra_agent),
        )
        limits = PoolLimits(min_nodes, max_nodes, gpus_per_node, idle_timeout)
        pool = SlurmPool(job, limits, client, Slurm(bin_dir=slurm_bin))
        if once:
            report = pool.step()
            typer.echo(json.dumps(asdict(report), sort_keys=True))
            raise typer.Exit(0 if report.ok and not report.problem else 1)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        logging.getLogger("phalanx.slurmpool").info(
            "pool %s: Slurm jobs phalanx-pool-%s, nodes %sID, %d..%d node(s) of %d GPU(s)",
            name,
            name,
            prefix,
            min_nodes,
            max_nodes,
            gpus_per_node,
        )
        pool.run(stop, interval)


def _check_admin(client: PhalanxClient) -> None:
    """The pool drains and forgets nodes and reads every user's queue: an admin token.
    A head that does not answer yet is no reason not to start (the loop retries)."""
    from phalanx.client.api import ApiError, HeadUnreachable

    try:
        me = client.whoami()
    except HeadUnreachable:
        return
    except ApiError as e:
        fail(f"the head refused the token: {e}")
    if me.role != "admin":
        fail(f"phalanx slurm-pool needs an admin token (this one is {me.user}'s, a {me.role})")
