"""The launch environment, variable by variable, for every launcher (docs/control-plane.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from phalanx.agent.env import job_env, seconds, step_env
from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.api.models import StepTask

from .helpers import STEP_TOKEN, assignment, desired, wait_for

# Every process, whatever the launcher, for the default 2-node assignment on node 0.
COMMON = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NAME": "train",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_RESTART_COUNT": "0",
    "SLURM_SUBMIT_DIR": "/home/alice",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURMD_NODENAME": "n1",
    "PHALANX_JOB_ID": "7",
    "PHALANX_JOB_NAME": "train",
    "PHALANX_NODELIST": "n1,n2",
    "PHALANX_NUM_NODES": "2",
    "PHALANX_RESTART_COUNT": "0",
    "PHALANX_EPOCH": "1",
    "PHALANX_SUBMIT_DIR": "/home/alice",
    "PHALANX_STEP_TOKEN": STEP_TOKEN,
    "PHALANX_AGENT_URLS": "http://127.0.0.2:9001,http://127.0.0.3:9001",
    "PHALANX_HEAD": "http://127.0.0.1:8265",
    "CUDA_VISIBLE_DEVICES": "0,1",
}
TORCHRUN_ONLY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
ARRAY = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID", "PHALANX_ARRAY_TASK_ID")


@dataclass(frozen=True)
class Case:
    name: str
    changes: dict[str, Any]
    local_rank: int
    expected: dict[str, str]
    absent: tuple[str, ...] = ()
    master_port: int | None = None
    common: dict[str, str] = field(default_factory=lambda: dict(COMMON))


CASES = [
    Case(
        "torchrun node 1, local rank 1",
        {"node_rank": 1},
        1,
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "ROLE_RANK": "3",
            "ROLE_WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.2",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "SLURM_NTASKS": "4",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1",
            "PHALANX_NTASKS": "4",
            "PHALANX_PROCID": "3",
            "PHALANX_LOCALID": "1",
            "PHALANX_NODEID": "1",
            "SLURMD_NODENAME": "n2",
            "OMP_NUM_THREADS": "1",
        },
        absent=(*PET, *ARRAY, "SLURM_CPUS_PER_TASK"),
    ),
    Case(
        "torchrun rank 0 with its own picked port, restarted, array task, cpus",
        {
            "master_port": None,
            "restart_count": 2,
            "array_job_id": 5,
            "array_task_id": 3,
            "cpus_per_task": 8,
        },
        0,
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "GROUP_RANK": "0",
            "MASTER_PORT": "40001",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "SLURM_RESTART_COUNT": "2",
            "PHALANX_RESTART_COUNT": "2",
            "SLURM_ARRAY_TASK_ID": "3",
            "SLURM_ARRAY_JOB_ID": "5",
            "PHALANX_ARRAY_TASK_ID": "3",
            "SLURM_CPUS_PER_TASK": "8",
            "OMP_NUM_THREADS": "8",
        },
        master_port=40001,
    ),
    Case(
        "node launcher on node 1",
        {"launcher": "node", "node_rank": 1, "gpus_per_node": 2},
        0,
        {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "127.0.0.2",
            "PET_MASTER_PORT": "29500",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_PROCID": "1",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "PHALANX_NTASKS": "2",
            "PHALANX_PROCID": "1",
            "SLURMD_NODENAME": "n2",
        },
        absent=(*TORCHRUN_ONLY, *ARRAY),
    ),
    Case(
        "batch script with ntasks-per-node",
        {"launcher": "batch", "command": None, "script": "echo hi", "ntasks_per_node": 3},
        0,
        {
            "SLURM_NTASKS": "6",
            "SLURM_NTASKS_PER_NODE": "3",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "PHALANX_NTASKS": "6",
            "MASTER_ADDR": "127.0.0.2",
            "MASTER_PORT": "29500",
        },
        absent=(*TORCHRUN_ONLY, *PET, *ARRAY),
    ),
    Case(
        "batch script, one task per node by default",
        {"launcher": "batch", "command": None, "script": "echo hi", "nodes": ["a1", "b7", "a2"]},
        0,
        {
            "SLURM_NTASKS": "3",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_JOB_NUM_NODES": "3",
            "SLURM_NNODES": "3",
            "PHALANX_NUM_NODES": "3",
            "SLURM_NODELIST": "a1,b7,a2",
            "SLURM_JOB_NODELIST": "a1,b7,a2",
            "PHALANX_NODELIST": "a1,b7,a2",
            "SLURMD_NODENAME": "a1",
        },
        absent=TORCHRUN_ONLY,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_job_env(case: Case) -> None:
    a = assignment(**case.changes)
    env = job_env(
        a,
        base={"PATH": "/usr/bin:/bin", "HOME": "/home/alice"},
        local_rank=case.local_rank,
        master_port=case.master_port,
        head_url="http://127.0.0.1:8265",
        bin_dir=Path("/state/bin"),
    )
    want = {**case.common, **case.expected}
    assert {k: env.get(k) for k in want} == want
    assert [k for k in case.absent if k in env] == []
    assert env["PATH"] == "/state/bin:/usr/bin:/bin"
    assert env["HOME"] == "/home/alice"


def test_job_env_layers_and_secrets() -> None:
    """The job's env beats the agent's; agent-owned families and secrets never leak."""
    a = assignment(env={"FOO": "job", "SLURM_STEP_ID": "stale", "PHALANX_TOKEN": "user-tok"})
    base = {
        "FOO": "agent",
        "KEEP": "1",
        "PHALANX_TOKEN": "admin-token",
        "PHALANX_AGENT_SECRET": "s3cret",
        "SLURM_JOB_ID": "999",
        "SOME_JOIN": "join-token-value",
    }
    env = job_env(a, base=base, secrets={"join-token-value", "node-token-value"})
    assert env["FOO"] == "job"
    assert env["KEEP"] == "1"
    assert env["SLURM_JOB_ID"] == "7"
    for gone in ("PHALANX_TOKEN", "PHALANX_AGENT_SECRET", "SLURM_STEP_ID", "SOME_JOIN"):
        assert gone not in env
    assert "join-token-value" not in env.values()
    assert "PHALANX_HEAD" not in env


def test_no_master_port_yet_means_no_master_vars() -> None:
    env = job_env(assignment(master_port=None, node_rank=1), base={})
    assert "MASTER_PORT" not in env
    assert "MASTER_ADDR" not in env


def test_step_env_overrides_per_task_and_node() -> None:
    """srun's forwarded environment is the user layer; node and task variables win."""
    a = assignment(launcher="batch", command=None, script="x", node_rank=1, gpus=[2, 3])
    forwarded = {
        "PATH": "/node0/bin:/opt/bin",
        "USER_VAR": "u",
        "SLURMD_NODENAME": "n1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "2",
        "LEAK": "node-token-value",
    }
    task = StepTask(task_id=3, local_id=1, node_id=1, argv=["x"], env=forwarded)
    env = step_env(
        a,
        task,
        step_id=5,
        base={"PATH": "/usr/bin"},
        bin_dir=Path("/s/bin"),
        secrets={"node-token-value"},
    )
    assert {
        k: env[k]
        for k in (
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NODEID",
            "SLURM_STEP_ID",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_NTASKS",
            "SLURM_STEP_NODELIST",
            "SLURM_STEP_NUM_NODES",
            "SLURMD_NODENAME",
            "CUDA_VISIBLE_DEVICES",
            "USER_VAR",
            "PATH",
            "SLURM_JOB_ID",
        )
    } == {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_ID": "5",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURMD_NODENAME": "n2",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "USER_VAR": "u",
        "PATH": "/s/bin:/node0/bin:/opt/bin",
        "SLURM_JOB_ID": "7",
    }
    assert "LEAK" not in env


def test_checkpoint_and_preemption_variables_for_ranks_and_steps() -> None:
    a = assignment(checkpoint_dir="/shared/ckpt/7", preempt_signal="SIGTERM", preempt_grace_s=30.5)
    want = {
        "PHALANX_CHECKPOINT_DIR": "/shared/ckpt/7",
        "PHALANX_PREEMPT_SIGNAL": "SIGTERM",
        "PHALANX_PREEMPT_DEADLINE": "30.5",  # seconds from a notice to the kill
    }
    env = job_env(a, base={"PHALANX_CHECKPOINT_DIR": "/stale"})
    assert {k: env.get(k) for k in want} == want
    task = StepTask(task_id=0, local_id=0, node_id=0, argv=["x"], env={})
    step = step_env(a, task, step_id=0, base={})
    assert {k: step.get(k) for k in want} == want
    whole = job_env(assignment(preempt_grace_s=60.0, checkpoint_dir=""), base={})
    assert whole["PHALANX_PREEMPT_DEADLINE"] == "60"
    assert "PHALANX_CHECKPOINT_DIR" not in whole  # none given


@pytest.mark.parametrize(
    ("value", "text"), [(30.0, "30"), (30.5, "30.5"), (0.25, "0.25"), (1e6, "1000000")]
)
def test_seconds_format(value: float, text: str) -> None:
    assert seconds(value) == text


def test_agent_creates_the_checkpoint_dir(tmp_path: Path) -> None:
    ckpt = tmp_path / "shared" / "ckpt" / "7"
    a = assignment(
        command=["sh", "-c", 'echo "$PHALANX_CHECKPOINT_DIR $PHALANX_PREEMPT_DEADLINE" > seen'],
        workdir=str(tmp_path),
        gpus_per_node=1,
        checkpoint_dir=str(ckpt),
    )
    rec = Reconciler(LaunchContext(state_dir=tmp_path / "state", base_env={}), ProcessManager())
    try:
        rec.apply(desired(a))
        wait_for("the rank to end", lambda: not rec.process_statuses()[0].running)
    finally:
        rec.shutdown()
    assert ckpt.is_dir()
    assert (tmp_path / "seen").read_text() == f"{ckpt} 30\n"
