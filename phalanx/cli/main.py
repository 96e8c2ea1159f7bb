"""The `phalanx` command: one Typer app, one module per command group."""

from __future__ import annotations

from typing import Annotated

import typer

from phalanx import __version__
from phalanx.cli.admin import admin, whoami
from phalanx.cli.attach import DashCommand, attach, exec_command
from phalanx.cli.connect import select_context
from phalanx.cli.contexts import CONTEXT_HELP, context_app
from phalanx.cli.jobctl import hold, release, requeue, update
from phalanx.cli.jobs import cancel, show
from phalanx.cli.jobstats import jobstats
from phalanx.cli.local import local_app
from phalanx.cli.logs import logs
from phalanx.cli.nodes import drain, nodes, resume
from phalanx.cli.report import idle, report
from phalanx.cli.serve import serve_app
from phalanx.cli.services import agent, head, up
from phalanx.cli.slurmpool import slurm_pool
from phalanx.cli.slurmshims import slurm_shims
from phalanx.cli.submit import SubmitCommand, submit
from phalanx.cli.tokens import token_app
from phalanx.cli.top import top
from phalanx.cli.usage import CliGroup
from phalanx.cli.views import history, priority, queue, share

app = typer.Typer(
    name="phalanx",
    # `sim` and its heavy imports load only when used; usage errors are one line.
    cls=CliGroup,
    help="Phalanx: many GPU servers, working like one.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, …)
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"phalanx {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            help=CONTEXT_HELP + " Also accepted after the command; default $PHALANX_CONTEXT.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Phalanx: many GPU servers, working like one."""
    select_context(context)


app.command("submit", cls=SubmitCommand)(submit)
app.command("queue")(queue)
app.command("show")(show)
app.command("jobstats")(jobstats)
app.command("cancel")(cancel)
app.command("hold")(hold)
app.command("release")(release)
app.command("requeue")(requeue)
app.command("update")(update)
app.command("history")(history)
app.command("logs")(logs)
app.command("priority")(priority)
app.command("share")(share)
app.command("report")(report)
app.command("idle")(idle)
app.command("exec", cls=DashCommand)(exec_command)
app.command("attach")(attach)
app.command("nodes")(nodes)
app.command("drain")(drain)
app.command("resume")(resume)
app.command("whoami")(whoami)
app.command("top")(top)
app.add_typer(admin, name="admin")
app.add_typer(token_app, name="token")
app.add_typer(context_app, name="context")
app.add_typer(local_app, name="local")
app.add_typer(serve_app, name="serve")
app.command("up")(up)
app.command("head")(head)
app.command("agent")(agent)
app.command("slurm-shims")(slurm_shims)
app.command("slurm-pool")(slurm_pool)


@app.command("version")
def version() -> None:
    """Print the Phalanx version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
