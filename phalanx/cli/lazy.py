"""A command group that imports heavy commands (`sim`: numpy, matplotlib) only when run.

Every `phalanx queue` would otherwise pay seconds of start-up for the simulator's imports.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

# name → (module, function, help): registered as a command the first time it is looked up.
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "sim": (
        "phalanx.cli.sim",
        "sim",
        "Replay a workload (Philly trace, Pollux workload or synthetic) through the scheduler "
        "on a virtual clock and report JCT, queueing, utilisation, fairness and goodput.",
    ),
}


# Root options also accepted after the command name (`phalanx queue --context prod`).
HOISTED_OPTIONS = ("--context",)


def hoist_root_options(args: list[str]) -> list[str]:
    """`args` with each HOISTED_OPTIONS option and its value moved to the front, where the
    root command parses it; nothing after `--` (a job's own arguments) is touched."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg in HOISTED_OPTIONS and i + 1 < len(args):
            front += args[i : i + 2]
            i += 2
            continue
        if any(arg.startswith(f"{name}=") for name in HOISTED_OPTIONS):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


class LazyGroup(TyperGroup):
    """TyperGroup whose LAZY_COMMANDS are imported on first use (run or --help), and whose
    root options may also follow the command name."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        result: list[str] = super().parse_args(ctx, hoist_root_options(list(args)))
        return result

    # `ctx` is Typer's bundled click Context and the result its Command; Any avoids naming
    # Typer's private `_click` module.
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return [*names, *(n for n in LAZY_COMMANDS if n not in names)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, function, help_text = LAZY_COMMANDS[cmd_name]
            callback = getattr(importlib.import_module(module), function)
            single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
            single.command(cmd_name, help=help_text)(callback)
            command = typer.main.get_command(single)
            command.name = cmd_name
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)
