"""Start real training jobs on 127.0.0.1 (one process per rank, gloo) and clean them up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.local.cluster import free_port

REPO = Path(__file__).resolve().parents[2]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: one thread each (2 shared cores), repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHALANX_", "TORCHELASTIC"))}
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(key, None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


@dataclass
class Ranks:
    """The rank processes of one job, forked by one forkrun.py parent (see there)."""

    parent: subprocess.Popen[bytes]
    pids: list[int]
    logs: list[Path]
    codes_file: Path

    def running(self) -> bool:
        """Whether the job (its parent, which waits for every rank) is still running."""
        return self.parent.poll() is None

    def signal(self, rank: int, sig: int) -> None:
        """Send `sig` to one rank."""
        os.kill(self.pids[rank], sig)

    def wait(self, timeout_s: float) -> list[int]:
        """Exit codes by rank (negative: killed by that signal); every rank is killed if
        the job outlives timeout_s."""
        try:
            self.parent.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        codes: list[int] = json.loads(self.codes_file.read_text())
        return codes

    def kill(self) -> None:
        """SIGKILL the whole job (the parent's process group holds every rank)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.parent.pid, signal.SIGKILL)
        self.parent.wait(timeout=30)

    def output(self) -> str:
        """Every rank's combined stdout/stderr, for assertion messages."""
        return "\n".join(f"--- rank {i}\n{log.read_text()}" for i, log in enumerate(self.logs))


def start(
    world: int,
    argv: Sequence[str],
    logdir: Path,
    extra_env: Mapping[str, str] | None = None,
) -> Ranks:
    """Start `argv` (a Python script and its arguments) as `world` ranks with torchrun's
    variables and a free port; returns once every rank process exists."""
    logdir.mkdir(parents=True, exist_ok=True)
    tag = time.monotonic_ns()
    logs = [logdir / f"{tag}-rank{rank}.log" for rank in range(world)]
    pids_file = logdir / f"{tag}.pids"
    codes_file = logdir / f"{tag}.codes"
    spec = {
        "world": world,
        "port": free_port(),
        "argv": list(argv),
        "logs": [str(p) for p in logs],
        "env": dict(extra_env or {}),
        "pids": str(pids_file),
        "codes": str(codes_file),
    }
    spec_file = logdir / f"{tag}.json"
    spec_file.write_text(json.dumps(spec))
    parent = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("forkrun.py")), str(spec_file)],
        env=child_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: one killpg reaches every rank
    )
    deadline = time.monotonic() + 120
    while not pids_file.exists():
        if parent.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGKILL)
            raise RuntimeError(f"forkrun.py failed to start the ranks (exit {parent.poll()})")
        time.sleep(0.02)
    return Ranks(parent, json.loads(pids_file.read_text()), logs, codes_file)


def run(
    world: int,
    argv: Sequence[str],
    logdir: Path,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = 180.0,
) -> tuple[list[int], str]:
    """Run to the end: (exit codes by rank, combined output)."""
    ranks = start(world, argv, logdir, extra_env)
    codes = ranks.wait(timeout_s)
    return codes, ranks.output()
