"""srun/scontrol end to end against two real agent APIs (127.0.0.2, 127.0.0.3), no head."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from phalanx.api.models import Assignment, LogChunk, StepStatus
from phalanx.testing.processes import pid_alive

from .harness import AGENT_SECRET, Agent, start_agent
from .helpers import STEP_TOKEN, assignment, desired, wait_for

NODES = ["127.0.0.2", "127.0.0.3"]
OTHER_TOKEN = "step-token-of-job-8-xxxxxxxx"


@dataclass
class Cluster:
    agents: list[Agent]
    job: list[Assignment]  # job 7's assignment per node
    env: dict[str, str]  # what job 7's batch script sees on node 0
    workdir: Path

    def sh(
        self, script: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` with bash as job 7's batch script would (srun/scontrol on PATH)."""
        return subprocess.run(
            ["bash", "-c", script],
            env={**self.env, **(env or {})},
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    agents = [start_agent(addr, tmp_path / f"agent{i}") for i, addr in enumerate(NODES)]
    try:
        job = [
            assignment(
                launcher="batch",
                command=None,
                script="true",
                workdir=str(tmp_path),
                node_rank=i,
                nodes=NODES,
                addresses=NODES,
                agent_urls=[a.url for a in agents],
                master_addr=NODES[0],
                ntasks_per_node=2,
            )
            for i in range(2)
        ]
        other = assignment(job_id=8, step_token=OTHER_TOKEN, nodes=[NODES[0]], gpus_per_node=1)
        agents[0].apply(desired(job[0], other.model_copy(update={"command": ["sleep", "30"]})))
        agents[1].apply(desired(job[1]))
        yield Cluster(agents, job, agents[0].job_env(job[0]), tmp_path)
    finally:
        for a in agents:
            a.close()


def test_srun_two_nodes_two_tasks_each(cluster: Cluster) -> None:
    r = cluster.sh(
        "srun -N 2 --ntasks-per-node 2 bash -c 'echo $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID'"
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 0 0", "1 0 1", "2 1 0", "3 1 1"]


def test_srun_default_layout_label_and_step_env(cluster: Cluster) -> None:
    """No options: $SLURM_NTASKS (4) tasks, block over both nodes; -l labels lines."""
    r = cluster.sh(
        "srun -l -u --cpu-bind=cores bash -c "
        "'echo $SLURMD_NODENAME $SLURM_STEP_NUM_TASKS $SLURM_STEP_NODELIST $SLURM_JOB_ID'"
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        "0: 127.0.0.2 4 127.0.0.[2-3] 7",
        "1: 127.0.0.2 4 127.0.0.[2-3] 7",
        "2: 127.0.0.3 4 127.0.0.[2-3] 7",
        "3: 127.0.0.3 4 127.0.0.[2-3] 7",
    ]
    assert "srun: note: --cpu-bind is accepted and ignored by Phalanx" in r.stderr


def test_srun_nodelist_and_stderr(cluster: Cluster) -> None:
    r = cluster.sh("srun -w 127.0.0.3 -- bash -c 'hostname >/dev/null; echo oops >&2'")
    assert (r.returncode, r.stdout) == (0, "")
    assert "oops" in r.stderr
    logs = cluster.agents[1].ctx.state_dir / "logs" / "7" / "e1"
    [task_err] = list(logs.glob("step-*/task-0.err"))
    assert task_err.read_text() == "oops\n"


def test_srun_output_and_error_files_per_task(cluster: Cluster) -> None:
    """submitit's form: `srun --unbuffered --output DIR/%j_%t_log.out --error …`; each
    task's streams go to its own file, appended after what the batch script wrote."""
    out = cluster.workdir / "7_0_log.out"
    out.write_text("batch line\n")
    r = cluster.sh(
        "srun -vv --unbuffered --output %j_%t_log.out --error=%j_%t_%N.err -n 3 "
        "bash -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2'",
        env={"SLURM_OPEN_MODE": "append"},
    )
    assert (r.returncode, r.stdout) == (0, "")
    assert out.read_text() == "batch line\nout 0\n"
    assert (cluster.workdir / "7_2_log.out").read_text() == "out 2\n"
    assert (cluster.workdir / "7_1_127.0.0.2.err").read_text() == "err 1\n"
    assert (cluster.workdir / "7_2_127.0.0.3.err").read_text() == "err 2\n"
    # Without a per-task field every task shares one file; truncate (Slurm's default)
    # empties it once, `none` discards a stream.
    (cluster.workdir / "all.out").write_text("old\n")
    r = cluster.sh("srun -n 2 -o all.out -e none bash -c 'echo t$SLURM_PROCID; echo x >&2'")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert sorted((cluster.workdir / "all.out").read_text().splitlines()) == ["t0", "t1"]
    # A requeued job's later runs append (the earlier run's lines stay).
    r = cluster.sh("srun -n 1 -o all.out echo again", env={"SLURM_RESTART_COUNT": "1"})
    assert r.returncode == 0
    assert (cluster.workdir / "all.out").read_text().endswith("\nagain\n")
    assert len((cluster.workdir / "all.out").read_text().splitlines()) == 3
    # A relative pattern is relative to the step's working directory (-D).
    (cluster.workdir / "sub").mkdir()
    r = cluster.sh("srun -n 1 -D sub -o t%t.out echo in-sub")
    assert (r.returncode, (cluster.workdir / "sub" / "t0.out").read_text()) == (0, "in-sub\n")


def test_srun_output_file_errors_are_clean(cluster: Cluster) -> None:
    r = cluster.sh("srun -n 1 --open-mode=sideways -o x.out true")
    assert r.returncode == 1
    assert r.stderr.strip() == "srun: error: --open-mode=sideways: expected append or truncate"
    r = cluster.sh("srun -n 1 -o /nonexistent/dir/x.out echo hi")
    assert r.returncode == 1
    assert "srun: error: cannot open stdout file /nonexistent/dir/x.out" in r.stderr
    assert "Traceback" not in r.stderr


def test_srun_exit_code_is_the_worst_task(cluster: Cluster) -> None:
    r = cluster.sh("srun -n 3 bash -c 'exit $((SLURM_PROCID + 3))'")
    assert r.returncode == 5
    killed = cluster.sh("srun -N 1 bash -c 'kill -9 $$'")
    assert killed.returncode == 137


def test_srun_kill_on_bad_exit(cluster: Cluster) -> None:
    r = cluster.sh(
        "srun -K -n 2 bash -c '[ $SLURM_PROCID = 1 ] && exit 3; sleep 30; echo never'", timeout=30
    )
    assert r.returncode == 143  # the sleeping task was terminated (128 + SIGTERM)
    assert "never" not in r.stdout


def test_srun_wrong_token_refused(cluster: Cluster) -> None:
    cluster.env["PHALANX_STEP_TOKEN"] = "wrong-token-0000000000"
    r = cluster.sh("srun -N 2 true")
    assert r.returncode == 1
    assert "401" in r.stderr and "invalid token" in r.stderr


def test_srun_sigterm_cancels_the_step(cluster: Cluster) -> None:
    srun = subprocess.Popen(
        ["srun", "-N", "2", "sleep", "30"],
        env=cluster.env,
        cwd=cluster.workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def running() -> list[int] | None:
            found = [a.steps.status(7, 0) for a in cluster.agents]
            pids = [t.pid for st in found if st for t in st.tasks if t.pid and t.running]
            return pids if len(pids) == 2 else None

        pids = wait_for("both step tasks to run", running)
        srun.send_signal(signal.SIGTERM)
        assert srun.wait(timeout=30) == 128 + signal.SIGTERM
        wait_for("step tasks to die", lambda: not any(pid_alive(p) for p in pids))
    finally:
        srun.kill()
        srun.communicate()


def test_srun_stopped_still_prints_what_the_tasks_wrote(cluster: Cluster) -> None:
    """A stopped srun (a requeue, a preemption) reads the tasks' last lines before it
    cancels the step: submitit logs its checkpoint and requeue just before it exits."""
    srun = subprocess.Popen(
        ["srun", "-N", "1", "bash", "-c", "echo first; sleep 3; echo last words; sleep 30"],
        env=cluster.env,
        cwd=cluster.workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        logs = cluster.agents[0].ctx.state_dir / "logs" / "7" / "e1"

        def written() -> bool | None:
            return any("last words" in p.read_text() for p in logs.glob("step-*/task-0.out"))

        wait_for("the task's last line", written)
        srun.send_signal(signal.SIGTERM)  # srun polls every 0.5 s by now: it has not read it
        out, _ = srun.communicate(timeout=30)
        assert srun.returncode == 128 + signal.SIGTERM
        assert out == "first\nlast words\n"
    finally:
        srun.kill()
        srun.communicate()


def test_step_tasks_die_with_their_job(cluster: Cluster) -> None:
    r = httpx.post(
        f"{cluster.agents[1].url}/v1/steps",
        json={
            "job_id": 7,
            "step_id": 40,
            "workdir": str(cluster.workdir),
            "tasks": [{"task_id": 0, "local_id": 0, "node_id": 0, "argv": ["sleep", "30"]}],
        },
        headers={"Authorization": f"Bearer {STEP_TOKEN}"},
    )
    assert r.status_code == 200, r.text
    [task] = StepStatus.model_validate_json(r.content).tasks
    assert task.running and task.pid is not None
    cluster.agents[1].apply(desired(version=2))  # job 7 no longer desired here
    wait_for("the step task to die", lambda: not pid_alive(task.pid or 0))


def test_step_api_auth(cluster: Cluster) -> None:
    url = cluster.agents[0].url
    body = {
        "job_id": 7,
        "step_id": 41,
        "workdir": "/",
        "tasks": [{"task_id": 0, "local_id": 0, "node_id": 0, "argv": ["true"]}],
    }

    def post(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(f"{url}/v1/steps", json=body, headers=headers).status_code

    assert post(None) == 401
    basic = httpx.post(
        f"{url}/v1/steps", json=body, headers={"Authorization": f"Basic {STEP_TOKEN}"}
    )
    assert basic.status_code == 401
    assert post("nope") == 401
    assert post(AGENT_SECRET) == 401  # steps need the job's own token
    assert post(OTHER_TOKEN) == 403
    assert post(STEP_TOKEN) == 200
    assert post(STEP_TOKEN) == 409  # that step id is taken
    gone = {**body, "job_id": 99}
    r = httpx.post(
        f"{url}/v1/steps", json=gone, headers={"Authorization": f"Bearer {AGENT_SECRET}"}
    )
    assert r.status_code == 401


def test_rank_logs_api(cluster: Cluster) -> None:
    agent = cluster.agents[0]
    wait_for("the batch script to end", lambda: not agent.reconciler.process_statuses()[0].running)
    out = agent.ctx.state_dir / "logs" / "7" / "e1" / "rank-0.out"
    out.write_text("héllo\nworld\n")

    def get(token: str | None, **params: str | int) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{agent.url}/v1/logs/7", params=params, headers=headers)

    first = LogChunk.model_validate_json(get(AGENT_SECRET, rank=0).content)
    assert (first.data, first.offset, first.next_offset, first.eof) == (
        "héllo\nworld\n",
        0,
        13,
        True,
    )
    tail = LogChunk.model_validate_json(get(STEP_TOKEN, rank=0, offset=7).content)
    assert (tail.data, tail.next_offset) == ("world\n", 13)
    assert get(None).status_code == 401
    assert get(OTHER_TOKEN).status_code == 403
    assert get(AGENT_SECRET, rank=5).status_code == 404
    assert get(AGENT_SECRET, stream="bogus").status_code == 422
    assert httpx.get(f"{agent.url}/healthz").json()["status"] == "ok"


def test_scontrol_hostnames(cluster: Cluster) -> None:
    r = cluster.sh("scontrol show hostnames 127.0.0.[2-3]")
    assert (r.returncode, r.stdout) == (0, "127.0.0.2\n127.0.0.3\n")
