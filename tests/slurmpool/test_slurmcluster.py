"""The real Slurm cluster fixture: a slurmctld and two slurmd on this machine run real jobs."""

from __future__ import annotations

import time
from pathlib import Path

from phalanx.testing.processes import pid_alive
from phalanx.testing.slurmcluster import SlurmCluster


def _wait_state(slurm: SlurmCluster, job_id: str, states: set[str], timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = slurm.job_state(job_id)
        if state in states:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} is {state}, not one of {sorted(states)}")


def _wait_for_steps(slurm: SlurmCluster, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = slurm.leftover_pids()
        if pids:
            return pids
        time.sleep(0.1)
    raise AssertionError("no slurmstepd or job process appeared")


def test_sbatch_runs_on_both_nodes_with_fake_gpus_and_nothing_is_left(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with SlurmCluster(tmp_path / "slurm", nodes=2, gpus_per_node=2, kill_wait=5) as slurm:
        assert slurm.node_states() == {"n1": "idle", "n2": "idle"}
        # A 2-node job holding every GPU: it needs both slurmd and the gres.conf GPUs.
        script = tmp_path / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            "#SBATCH --nodes=2 --gres=gpu:2 --exclusive\n"
            'echo "$SLURM_JOB_NODELIST $SLURM_JOB_GPUS"\n'
        )
        submitted = slurm.run("sbatch", "--parsable", f"--output={out}/%j.out", str(script))
        job = submitted.stdout.strip()
        assert job.isdigit()
        assert _wait_state(slurm, job, {"COMPLETED", "FAILED"}) == "COMPLETED"
        assert (out / f"{job}.out").read_text().split() == ["n[1-2]", "0,1"]

        # scancel: the job's processes get SIGTERM; the cluster keeps no step behind.
        long = slurm.run("sbatch", "--parsable", "--wrap", "sleep 300").stdout.strip()
        _wait_state(slurm, long, {"RUNNING"})
        # Its slurmstepd and the sleep (squeue says RUNNING a moment before they start).
        _wait_for_steps(slurm)
        slurm.run("scancel", long)
        assert _wait_state(slurm, long, {"CANCELLED"}) == "CANCELLED"
        # Without accounting storage, `sacct -c` reads the completion log (jobcomp/filetxt).
        rows = [line.split() for line in slurm.run("sacct", "-c", "-n").stdout.splitlines()]
        assert [long, "CANCELLED"] in [[r[0], r[6]] for r in rows if len(r) > 6]
        running = slurm.run("sbatch", "--parsable", "--wrap", "sleep 300").stdout.strip()
        _wait_state(slurm, running, {"RUNNING"})
        daemons = list(slurm._procs.values())
        left_running = _wait_for_steps(slurm)
    # Leaving the context stops the daemons and the job still running.
    assert all(p.poll() is not None for p in daemons)
    assert left_running and not any(pid_alive(pid) for pid in left_running)
