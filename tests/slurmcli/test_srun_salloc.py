"""`srun` and `salloc` on the submitting host through the installed scripts, against a real
local cluster: srun outside an allocation allocates, runs the tasks, streams their output
and exits with their code; salloc gives a command Slurm's allocation variables, its srun
runs on the allocation's nodes, and leaving releases the allocation."""

from __future__ import annotations

import re

from tests.slurmcli.shimrun import (  # noqa: F401 - the fixtures
    Slurm,
    cluster_fixture,
    shim_dir_fixture,
    slurm_fixture,
    write,
)


def test_srun_allocates_runs_streams_and_exits_with_the_tasks_code(slurm: Slurm) -> None:
    done = slurm(
        "srun -N 2 --ntasks-per-node=2 -l -J many sh -c "
        "'echo $SLURM_PROCID/$SLURM_NTASKS on $SLURM_NODEID; echo err$SLURM_PROCID >&2; "
        "exit $((SLURM_PROCID + 1))'"
    )
    assert done.returncode == 4  # the highest task exit code
    assert sorted(done.stdout.splitlines()) == [
        f"{task}: {task}/4 on {task // 2}" for task in range(4)
    ]
    assert sorted(re.findall(r"\d: err\d", done.stderr)) == [f"{t}: err{t}" for t in range(4)]
    assert "Traceback" not in done.stderr
    jobs = [job for job in slurm.client.jobs(ended=True).jobs if job.name == "many"]
    assert [(job.nodes, job.state) for job in jobs] == [(2, "F")]

    ok = slurm("srun hostname && srun --chdir=/ pwd")
    assert ok.returncode == 0 and ok.stdout.splitlines()[1] == "/"
    for bad, said in {
        "srun": "srun: error: No command given to execute.\n",
        "srun --pty bash": "--pty is not supported",
        "srun --frob x": "srun: unrecognized option '--frob'\n",
        "srun -N x true": "srun: error: --nodes=x: expected a whole number\n",
    }.items():
        failed = slurm(bad)
        assert failed.returncode == 1 and said in failed.stderr, (bad, failed.stderr)


def test_salloc_shell_gets_the_allocation_and_srun_runs_in_it(slurm: Slurm) -> None:
    write(
        slurm.workdir / "inside.sh",
        "#!/bin/sh\n"
        "env | grep -E '^SLURM_(JOB_ID|JOB_NODELIST|NNODES|NTASKS|JOB_NUM_NODES)=' | sort\n"
        "srun -l hostname | sort\n"
        "srun -n 3 sh -c 'echo task $SLURM_PROCID of $SLURM_NTASKS in $SLURM_JOB_ID'\n"
        "exit 7\n",
    ).chmod(0o755)
    done = slurm("salloc -N 2 -J alloc ./inside.sh")
    assert done.returncode == 7, done.stderr  # the command's exit code
    job_id = int(re.findall(r"SLURM_JOB_ID=(\d+)", done.stdout)[0])
    assert done.stdout.splitlines()[:5] == [
        f"SLURM_JOB_ID={job_id}",
        "SLURM_JOB_NODELIST=127.0.0.[2-3]",
        "SLURM_JOB_NUM_NODES=2",
        "SLURM_NNODES=2",
        "SLURM_NTASKS=2",
    ]
    hosts = done.stdout.splitlines()[5:7]
    assert [h.split(":")[0] for h in hosts] == ["0", "1"]
    assert done.stdout.splitlines()[7:] == [f"task {t} of 3 in {job_id}" for t in range(3)]
    assert done.stderr.splitlines() == [
        f"salloc: Pending job allocation {job_id}",
        f"salloc: Granted job allocation {job_id}",
        "salloc: Nodes 127.0.0.2,127.0.0.3 are ready for job",
        f"salloc: Relinquishing job allocation {job_id}",
    ]
    job = slurm.wait(job_id)
    assert (job.state, job.name, job.nodes) == ("CA", "alloc", 2)  # released on exit
