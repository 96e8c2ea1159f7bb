"""`phalanx slurm-shims DIR`: write Slurm's commands (sbatch, squeue, …) as small scripts
into DIR, to put on PATH, so that tools which drive Slurm drive Phalanx. Never over a real
Slurm by accident: a real command of the same name on PATH is refused without --force."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.output import fail

MARKER = "# phalanx slurm shim"  # how a shim written here is told from a real command


def shim_text(tool: str) -> str:
    """One shim: run this Python's `phalanx.slurmcli TOOL` with the arguments given."""
    return (
        f"#!/bin/sh\n{MARKER}: `{tool}` answered by a Phalanx head (docs/slurm.md)\n"
        f'exec {shlex.quote(sys.executable)} -m phalanx.slurmcli {tool} "$@"\n'
    )


def real_commands(tools: tuple[str, ...], target: Path, path: str) -> dict[str, str]:
    """Each tool that PATH (outside `target`) resolves to a command not written by this
    installer: a real Slurm that the shims would shadow or be shadowed by."""
    found = {}
    others = os.pathsep.join(
        entry
        for entry in path.split(os.pathsep)
        if entry and Path(entry).resolve() != target.resolve()
    )
    for tool in tools:
        where = shutil.which(tool, path=others)
        if where is not None and MARKER not in _head(Path(where)):
            found[tool] = where
    return found


def slurm_shims(
    directory: Annotated[
        Path,
        typer.Argument(
            help="Folder to write the commands into (created if missing).", show_default=False
        ),
    ],
    force: Annotated[
        bool,
        typer.Option("--force", help="Write them even where a real Slurm command is on PATH."),
    ] = False,
) -> None:
    """Write Slurm's commands (sbatch, squeue, sacct, scancel, sinfo, scontrol, srun,
    salloc) into DIRECTORY as scripts that talk to the Phalanx head with your token.

    Then put DIRECTORY first on PATH, e.g. `export PATH=DIRECTORY:$PATH`, and tools that
    drive Slurm (submitit, dask-jobqueue, Snakemake, Nextflow, TorchX) use Phalanx. The
    head and token are found as for `phalanx` itself ($PHALANX_HEAD / $PHALANX_TOKEN, else
    the client config). Refused where a real Slurm command of one of these names is on
    PATH (it would shadow, or be shadowed by, the shims), unless --force.
    """
    from phalanx.slurmcli import TOOLS

    target = directory.expanduser().absolute()
    real = real_commands(TOOLS, target, os.environ.get("PATH", ""))
    if real and not force:
        listed = ", ".join(f"{tool} ({where})" for tool, where in sorted(real.items()))
        fail(
            f"a real Slurm is on PATH: {listed}; the shims would shadow it or be shadowed by "
            "it. Use another machine or account, or --force to write them anyway"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            path = target / tool
            if path.exists() and not force and MARKER not in _head(path):
                fail(f"{path} exists and is not a Phalanx shim; use --force to replace it")
            tmp = target / f".{tool}.tmp"
            tmp.write_text(shim_text(tool), encoding="utf-8")
            tmp.chmod(0o755)
            tmp.replace(path)
    except OSError as exc:
        fail(f"cannot write the commands into {target}: {exc.strerror or exc}")
    typer.echo(f"wrote {', '.join(TOOLS)} into {target}")
    on_path = any(
        entry and Path(entry).absolute() == target
        for entry in os.environ.get("PATH", "").split(os.pathsep)
    )
    if not on_path:
        typer.echo(f"put it on PATH to use them: export PATH={shlex.quote(str(target))}:$PATH")


def _head(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(512)
    except OSError:
        return ""
