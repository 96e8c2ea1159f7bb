"""Fixtures for the submit-side Slurm commands: one local cluster per test module (head + 2
agents × 2 fake GPUs, real HTTP and SQLite), the commands written by `phalanx slurm-shims`
into a folder, and `slurm(...)` running them as a user would: real processes, that folder
first on PATH, the test's own working directory. Test modules import the fixtures
(`*_fixture`; each registered under its short name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.api.models import JobInfo
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import cancel_all

TERMINAL = ("CD", "F", "CA", "TO", "NF", "OOM")


@dataclass
class Slurm:
    """Runs Slurm commands (the shims) in `workdir` against the cluster."""

    bin_dir: Path
    env: dict[str, str]
    workdir: Path
    client: PhalanxClient

    def __call__(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """`command` through bash (pipes, quoting), as typed at a prompt."""
        done = subprocess.run(
            ["bash", "-c", command],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            check=False,
            cwd=self.workdir,
            env={**self.env, **(env or {})},
        )
        return subprocess.CompletedProcess(
            done.args,
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    def job(self, ref: int | str) -> JobInfo:
        return self.client.job(ref).job

    def wait(
        self, ref: int | str, states: tuple[str, ...] = TERMINAL, timeout: float = 60
    ) -> JobInfo:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(ref)
            if job.state in states or time.monotonic() > deadline:
                return job
            time.sleep(0.1)


@pytest.fixture(scope="module", name="slurm_cluster")
def cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpus_per_node=2) as running:
        yield running


@pytest.fixture(scope="module", name="shim_dir")
def shim_dir_fixture(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The commands, written by the real installer (--force: this machine may have a real
    Slurm on PATH; the shims come first on the tests' PATH)."""
    target = tmp_path_factory.mktemp("shims") / "bin"
    done = subprocess.run(
        [sys.executable, "-m", "phalanx", "slurm-shims", str(target), "--force"],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    return target


def clean_env() -> dict[str, str]:
    """This process's environment without Phalanx credentials or Slurm/sbatch variables."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PHALANX_", "SLURM_", "SBATCH_", "SALLOC_"))
    }


@pytest.fixture(name="slurm")
def slurm_fixture(slurm_cluster: LocalCluster, shim_dir: Path, tmp_path: Path) -> Iterator[Slurm]:
    """Slurm's commands for one test; what it leaves queued or running is cancelled."""
    workdir = tmp_path.resolve() / "work"
    workdir.mkdir()
    env = {
        **clean_env(),
        **slurm_cluster.client_env(),
        "PHALANX_CONFIG_DIR": str(tmp_path / "config"),
        "PATH": f"{shim_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    with slurm_cluster.client() as client:
        yield Slurm(shim_dir, env, workdir, client)
        try:
            cancel_all(client)
        finally:
            slurm_cluster.check()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def eventually(check: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
