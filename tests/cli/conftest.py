"""Fixtures for CLI tests: an isolated client config dir, the CLI in-process and as a real
process, and one local cluster (head + 2 agents × 2 fake GPUs) shared by a test module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from phalanx.cli.main import app
from phalanx.local import LocalCluster


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own client config dir and no credentials from the environment."""
    path = tmp_path / "config"
    monkeypatch.setenv("PHALANX_CONFIG_DIR", str(path))
    for name in ("PHALANX_HEAD", "PHALANX_TOKEN", "PHALANX_JOIN_TOKEN", "PHALANX_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    return path


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in this process (fast); stdout and stderr are kept apart."""
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `python -m phalanx ARGS` as a real process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (e.g. a state dir unique to one test)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head and two agents (127.0.0.2, 127.0.0.3) with two fake GPUs each."""
    with LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=2, gpus_per_node=2) as running:
        yield running


@pytest.fixture
def admin_env(cluster: LocalCluster) -> dict[str, str]:
    """Environment that points the CLI at the cluster as admin."""
    return cluster.client_env()
