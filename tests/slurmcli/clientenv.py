"""A Phalanx cluster that real Slurm clients drive unchanged: a LocalCluster (fake GPUs) and
the Slurm shims (`phalanx slurm-shims DIR`) first on PATH, with the head and token in the
environment, as a user would set them up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from phalanx.local import LocalCluster

T = TypeVar("T")


@dataclass(frozen=True)
class ShimCluster:
    """The cluster, the folder holding the shims, and the variables a client process needs
    (PATH with the shims first, PHALANX_HEAD, PHALANX_TOKEN, the head's CA)."""

    cluster: LocalCluster
    bin_dir: Path
    env: dict[str, str]

    def run(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command (a shim by its Slurm name) as a client would."""
        return subprocess.run(
            list(argv), env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60
        )


@contextmanager
def shim_cluster(state: Path, *, nodes: int = 2, gpus_per_node: int = 2) -> Iterator[ShimCluster]:
    """Start a LocalCluster under `state`, write the shims into `state/slurm-bin`, and put
    them (and this interpreter's venv, for the clients' `python`) first on PATH in this
    process too: submitit and dask-jobqueue call `sbatch`, `sacct` and `scancel` from the
    test process itself."""
    with LocalCluster(state / "cluster", nodes=nodes, gpus_per_node=gpus_per_node) as cluster:
        bin_dir = state / "slurm-bin"
        venv_bin = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            **cluster.client_env(),
            "PHALANX_CONFIG_DIR": str(state / "config"),
            # torch and numpy in jobs on a 2-core machine: one thread each.
            "OMP_NUM_THREADS": "1",
        }
        # --force: this machine has Debian's slurm-wlm clients in /usr/bin; the shims are
        # meant to come first on PATH here.
        written = subprocess.run(
            [sys.executable, "-m", "phalanx", "slurm-shims", "--force", str(bin_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert written.returncode == 0, written.stderr
        env["PATH"] = f"{bin_dir}:{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
        with pytest.MonkeyPatch.context() as patch:
            for name in ("PATH", "PHALANX_CONFIG_DIR", "OMP_NUM_THREADS", *cluster.client_env()):
                patch.setenv(name, env[name])
            yield ShimCluster(cluster, bin_dir, env)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll `probe` until it returns something other than None (or fail naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)
