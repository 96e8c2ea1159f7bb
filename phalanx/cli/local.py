"""`phalanx local …`: look at and act on the cluster a `phalanx up` runs (from another
terminal): its processes, killing a node or the head on purpose, starting or adding nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.output import fail

local_app = typer.Typer(
    help="The local cluster of a running `phalanx up`: its processes; kill a node or the "
    "head to try fault tolerance; start or add nodes.",
    no_args_is_help=True,
)

StateOpt = Annotated[
    Path,
    typer.Option(
        help="The state dir of the `phalanx up` to talk to (its --state-dir).", file_okay=False
    ),
]
NodeArg = Annotated[str, typer.Argument(help="Node name (127.0.0.N).", show_default=False)]
DEFAULT_STATE = Path("phalanx-state")


def _ask(state_dir: Path, action: str, node: str | None = None) -> None:
    from phalanx.local.control import ControlError, ask

    try:
        typer.echo(ask(state_dir.resolve(), action, node))
    except ControlError as exc:
        fail(str(exc))


@local_app.command("ps")
def ps(state_dir: StateOpt = DEFAULT_STATE) -> None:
    """The head and agents of the running `phalanx up`: pid, address, state, log."""
    from phalanx.local.control import ControlError, read_status

    try:
        status = read_status(state_dir.resolve())
    except ControlError as exc:
        fail(str(exc))
    typer.echo(f"phalanx up (pid {status['up_pid']}), head {status['head']}")
    for row in status.get("processes", []):
        code = row.get("exit_code")
        state = "running" if code is None else f"exited ({code})"
        what = "head" if row["kind"] == "head" else f"agent {row['address']}"
        typer.echo(f"  {what:<17} pid {row['pid']:<8} {state:<12} log {row['log']}")


@local_app.command("kill-node")
def kill_node(node: NodeArg, state_dir: StateOpt = DEFAULT_STATE) -> None:
    """Power a node off: SIGKILL its agent and its job processes. The head marks it down
    after the lease (8 s) and requeues its jobs on other nodes; `start-node` brings it back."""
    _ask(state_dir, "kill-node", node)


@local_app.command("start-node")
def start_node(node: NodeArg, state_dir: StateOpt = DEFAULT_STATE) -> None:
    """Start a killed or crashed node's agent again (it rejoins under its name)."""
    _ask(state_dir, "start-node", node)


@local_app.command("add-node")
def add_node(state_dir: StateOpt = DEFAULT_STATE) -> None:
    """Start one more agent, on the next free 127.0.0.N, with the cluster's fake GPUs."""
    _ask(state_dir, "add-node")


@local_app.command("kill-head")
def kill_head(state_dir: StateOpt = DEFAULT_STATE) -> None:
    """SIGKILL the head; `phalanx up` restarts it on the same state, and running jobs go on
    through the outage."""
    _ask(state_dir, "kill-head")
