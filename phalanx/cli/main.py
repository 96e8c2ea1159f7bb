"""The `phalanx` command: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from phalanx import __version__
from phalanx.cli.admin import admin, whoami
from phalanx.cli.attach import DashCommand, attach, exec_command
from phalanx.cli.jobs import cancel, history, logs, queue, show
from phalanx.cli.lazy import LazyGroup
from phalanx.cli.nodes import drain, nodes, resume
from phalanx.cli.services import agent, head, up
from phalanx.cli.submit import SubmitCommand, submit
from phalanx.cli.tokens import token_app

app = typer.Typer(
    name="phalanx",
    cls=LazyGroup,  # `sim` and its heavy imports load only when used
    help="Phalanx: many GPU servers, working like one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("submit", cls=SubmitCommand)(submit)
app.command("queue")(queue)
app.command("show")(show)
app.command("cancel")(cancel)
app.command("history")(history)
app.command("logs")(logs)
app.command("exec", cls=DashCommand)(exec_command)
app.command("attach")(attach)
app.command("nodes")(nodes)
app.command("drain")(drain)
app.command("resume")(resume)
app.command("whoami")(whoami)
app.add_typer(admin, name="admin")
app.add_typer(token_app, name="token")
app.command("up")(up)
app.command("head")(head)
app.command("agent")(agent)


@app.command("version")
def version() -> None:
    """Print the Phalanx version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
