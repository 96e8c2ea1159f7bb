"""submitit, unchanged, on a Phalanx cluster through the Slurm shims.

submitit writes an sbatch script (`#SBATCH --signal=USR2@90`, `--open-mode=append`,
`--wckey=submitit`, `srun --unbuffered --output … --error …` inside), submits it with
`sbatch FILE` and parses `Submitted batch job N`, polls `sacct -o JobID,State,NodeList
--parsable2 -j N`, cancels with `scancel N`, preempts (its own test path) with `scancel N
--signal SIGTERM` then `--signal USR2`, and a Checkpointable job requeues itself with
`scontrol requeue N` from inside the job. Each test below runs that real code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import cloudpickle
import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from tests.slurmcli.clientenv import ShimCluster, shim_cluster, wait_for

R = TypeVar("R")
TERMINAL = frozenset({"CD", "F", "CA", "TO", "NF", "OOM"})

# The functions below travel to the jobs by value: the job's interpreter need not import
# this test module (or pytest).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShimCluster]:
    with shim_cluster(tmp_path_factory.mktemp("submitit")) as running:
        yield running


def sacct_state(job: submitit.Job[object]) -> str:
    """The job's state as submitit reads it from `sacct` (asked now, not from its cache)."""
    state: str = job.watcher.get_state(job.job_id, mode="force")
    return state


def result(job: submitit.Job[R], timeout: float = 90.0) -> R:
    """The job's result, as `job.result()` gives it, but failing the test (not hanging it)
    if submitit does not see the job end in time."""
    wait_for(f"job {job.job_id} to end", lambda: job.done() or None, timeout)
    return job.result()


def _state(slurm: ShimCluster, job: submitit.Job[object]) -> str:
    """The job's state code as the head has it (cheaper to poll than a `sacct` process)."""
    with slurm.cluster.client() as api:
        return api.job(job.job_id).job.state


def ended(slurm: ShimCluster, *jobs: submitit.Job[object]) -> None:
    """Wait until the head has every job ended: submitit's result file appears just before
    its process exits, so sacct may still say RUNNING for a moment."""
    wait_for("the jobs to end", lambda: all(_state(slurm, j) in TERMINAL for j in jobs) or None)


def executor(folder: Path, **parameters: object) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(**{"timeout_min": 10, **parameters})
    return ex


def where_am_i(a: int, b: int) -> tuple[int, str, str, str]:
    print(f"adding {a} and {b}")
    return (
        a + b,
        os.environ.get("SLURM_JOB_ID", ""),
        os.environ.get("SUBMITIT_EXECUTOR", ""),
        os.getcwd(),
    )


def square(x: int) -> tuple[int, str, str]:
    env = os.environ
    return x * x, env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")


def boom() -> None:
    raise ValueError("boom from inside the job")


def test_a_function_runs_as_a_slurm_job_and_returns_its_result(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    job = executor(tmp_path / "jobs", name="adder").submit(where_am_i, 2, 3)
    assert job.job_id.isdigit()
    total, job_id, executor_name, cwd = result(job)
    assert (total, job_id, executor_name) == (5, job.job_id, "slurm")
    assert cwd == os.getcwd()  # the job runs in the submit directory
    # sacct, as submitit reads it, says how the job ended.
    ended(slurm, job)
    # srun's --output (with %j and %t) inside the job took the function's print (srun
    # writes the task's output as it streams it; complete once the job has ended).
    assert "adding 2 and 3" in Path(job.paths.stdout).read_text()
    assert sacct_state(job) == "COMPLETED"
    with slurm.cluster.client() as api:
        info = api.job(int(job.job_id)).job
    assert info.name == "adder"


def test_an_exception_in_the_job_reaches_the_caller(slurm: ShimCluster, tmp_path: Path) -> None:
    job = executor(tmp_path / "jobs").submit(boom)
    with pytest.raises(FailedJobError, match="boom from inside the job"):
        result(job)


def test_map_array_runs_a_job_array_with_its_parallelism_limit(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    ex = executor(tmp_path / "jobs", slurm_array_parallelism=2)
    jobs = ex.map_array(square, [1, 2, 3, 4])
    array_id = jobs[0].job_id.split("_")[0]
    assert [j.job_id for j in jobs] == [f"{array_id}_{i}" for i in range(4)]
    results = [result(j) for j in jobs]
    assert results == [(x * x, array_id, str(i)) for i, x in enumerate([1, 2, 3, 4])]
    ended(slurm, *jobs)
    sacct_state(jobs[0])  # one sacct call for the array (-j N), as submitit makes it
    states = {j.job_id: j.watcher.get_state(j.job_id, mode="cache") for j in jobs}
    assert set(states.values()) == {"COMPLETED"}, states


def test_a_cancelled_job_ends_cancelled_and_has_no_result(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    job = executor(tmp_path / "jobs").submit(time.sleep, 600)
    wait_for("the job to run", lambda: _state(slurm, job) == "R" or None)
    assert sacct_state(job) == "RUNNING"
    job.cancel()  # scancel N
    wait_for("the job to end", lambda: _state(slurm, job) == "CA" or None)
    assert sacct_state(job).startswith("CANCELLED by ")
    assert job.done()
    with pytest.raises(UncompletedJobError):
        result(job)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class Counter(submitit.helpers.Checkpointable):
    """Counts to `steps`, writing progress to a file. The first run stops halfway and waits
    to be preempted; submitit's checkpoint pickles this object (with `done`) for the rerun."""

    def __init__(self) -> None:
        self.done = 0

    def __call__(self, progress: str, steps: int) -> tuple[int, int, str]:
        first = self.done
        restarts = os.environ.get("SLURM_RESTART_COUNT", "")
        while self.done < steps:
            if self.done == steps // 2 and restarts in ("", "0"):
                time.sleep(0.1)  # first run: wait here for the preemption signal
                continue
            self.done += 1
            Path(progress).write_text(str(self.done))
        return self.done, first, restarts


def test_a_checkpointable_job_preempted_requeues_itself_and_resumes(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    # timeout_min=60: submitit calls a USR2 before 80% of the time limit a preemption.
    job = executor(tmp_path / "jobs", timeout_min=60).submit(Counter(), str(progress), 10)
    reached = wait_for("the first run to reach step 5", lambda: _read(progress) == "5" or None)
    assert reached
    # submitit's own preemption path: `scancel N --signal SIGTERM`, then `--signal USR2`;
    # its handler checkpoints and runs `scontrol requeue N` inside the job.
    job._interrupt()  # type: ignore[attr-defined]
    done, first, restarts = result(job)
    assert (done, first, restarts) == (10, 5, "1")
    ended(slurm, job)
    assert sacct_state(job) == "COMPLETED"
    with slurm.cluster.client() as api:
        info = api.job(int(job.job_id)).job
    assert info.restart_count == 1


def test_a_checkpointable_job_preempted_by_the_scheduler_resumes(
    slurm: ShimCluster, tmp_path: Path
) -> None:
    """A real Phalanx preemption: a low-QOS submitit job holding a node's GPUs, asking for
    its preemption notice as USR2 (submitit's signal), gives way to a high-QOS job needing
    every GPU; submitit's handler checkpoints, the job is requeued and resumes."""
    progress = tmp_path / "progress"
    job = executor(
        tmp_path / "jobs",
        gpus_per_node=2,
        slurm_qos="low",
        slurm_additional_parameters={"preempt-signal": "USR2"},
        timeout_min=60,
    ).submit(Counter(), str(progress), 10)
    reached = wait_for("the first run to reach step 5", lambda: _read(progress) == "5" or None)
    assert reached
    urgent = slurm.run(
        "sbatch", "--parsable", "-q", "high", "-N", "2", "--gpus-per-node=2", "--wrap=true",
        cwd=tmp_path,
    )  # fmt: skip
    assert urgent.returncode == 0, urgent.stderr
    assert result(job) == (10, 5, "1")
    ended(slurm, job)
    with slurm.cluster.client() as api:
        detail = api.job(int(job.job_id))
    kinds = [e.kind for e in detail.events]
    assert "preempting" in kinds and "requeued" in kinds, kinds
    assert any(e.kind == "signal" and e.message.startswith("SIGUSR2") for e in detail.events)
    # Both runs are in the log (the rerun's srun appends to the file).
    log = Path(job.paths.stdout).read_text()
    assert log.count(f"Starting with JobEnvironment(job_id={job.job_id},") == 2, log
    assert log.rstrip().endswith("Exiting after successful completion"), log
