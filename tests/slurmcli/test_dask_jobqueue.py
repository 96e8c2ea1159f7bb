"""dask-jobqueue, unchanged, on a Phalanx cluster through the Slurm shims.

`SLURMCluster` writes a worker script (`#SBATCH -J dask-worker`, `-n 1`, `--cpus-per-task`,
`--mem`, `-t`, `-o/-e …-%J.out`), submits each worker with `sbatch /tmp/tmpXXXX.sh` (the
file is deleted as soon as sbatch returns), takes the first number of its output as the job
id, and stops workers with `scancel N`; it never polls squeue (workers report to the
scheduler themselves).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dask.array as da
import pytest
from dask_jobqueue.slurm import SLURMCluster
from distributed import Client

from tests.slurmcli.clientenv import ShimCluster, shim_cluster, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShimCluster]:
    with shim_cluster(tmp_path_factory.mktemp("dask")) as running:
        yield running


def _jobs(slurm: ShimCluster, name: str, state: str) -> list[int]:
    with slurm.cluster.client() as api:
        return [j.id for j in api.jobs(states=[state]).jobs if j.name == name]


def _ended(slurm: ShimCluster, ids: list[int]) -> list[str]:
    """The jobs' states once every one has ended (else empty)."""
    with slurm.cluster.client() as api:
        jobs = [api.job(i).job for i in ids]
    return [j.state for j in jobs] if all(j.end_time is not None for j in jobs) else []


def test_slurmcluster_scales_to_two_workers_on_phalanx_and_sums_an_array(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    with (
        SLURMCluster(
            cores=1,
            processes=1,
            memory="1GiB",
            walltime="00:10:00",
            job_name="dask-sum",
            log_directory=str(tmp_path / "logs"),
            scheduler_options={"host": "127.0.0.1"},
        ) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        running = wait_for("two running worker jobs", lambda: _jobs(slurm, "dask-sum", "R") or None)
        assert len(running) == 2
        total = da.arange(1_000_000, chunks=100_000).sum().compute()
        assert total == 499_999_500_000
        # Every chunk ran on the Phalanx jobs' workers.
        assert len(client.scheduler_info()["workers"]) == 2
        # Retires both workers, then `scancel`s their jobs (a worker that left first ends
        # its job itself: COMPLETED rather than CANCELLED).
        cluster.scale(0)
        wait_for("the workers to leave", lambda: not client.scheduler_info()["workers"] or None)
        ended = wait_for("both jobs to end", lambda: _ended(slurm, running) or None)
        assert set(ended) <= {"CD", "CA"}, ended
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == sorted(f"dask-sum-{j}.{ext}" for j in running for ext in ("err", "out"))


def test_dask_jobqueues_own_slurm_test_passes_against_the_shims(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    # One test of dask-jobqueue's Slurm-marked suite (the full run is in docs/slurm.md):
    # test_basic scales to two 2-core, 2 GiB workers, checks their memory limit and
    # threads, computes, and scales back to none.
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = {**slurm.env, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tmp_path),
            "-p", "tests.slurmcli.djq_plugin", "-p", "no:cacheprovider",
            "--pyargs", "dask_jobqueue.tests.test_slurm", "-E", "slurm", "-k", "test_basic",
            "-q",
        ],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
