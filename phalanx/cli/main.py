"""The `phalanx` command: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from phalanx import __version__
from phalanx.cli.sim import sim

app = typer.Typer(
    name="phalanx",
    help="Phalanx: many GPU servers, working like one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(
    "sim",
    help="Replay a workload (Philly trace, Pollux workload or synthetic) through the scheduler "
    "on a virtual clock and report JCT, queueing, utilisation, fairness and goodput.",
)(sim)


@app.command("version")
def version() -> None:
    """Print the Phalanx version."""
    typer.echo(__version__)
