"""The environment of every job process: Slurm, torchrun and Phalanx variables, no agent secrets."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from phalanx.api.models import Assignment, StepTask
from phalanx.jobspec.hostlist import compress
from phalanx.tls import CA_PEM_ENV

# Variables in these families come only from the agent: stale copies inherited from the
# agent's own environment or captured from the submitting shell would lie to the job.
_AGENT_OWNED_PREFIXES = ("SLURM_", "PHALANX_", "SLURMD_")


def tasks_per_node(a: Assignment) -> int:
    """Processes per node as Slurm counts them: GPUs (torchrun), 1 (node), ntasks (batch)."""
    if a.launcher == "torchrun":
        return a.gpus_per_node
    if a.launcher == "node":
        return 1
    return a.ntasks_per_node or 1


def _tasks_per_node_list(a: Assignment) -> str:
    """SLURM_TASKS_PER_NODE in Slurm's compressed form: `4(x2)` for 4 on each of 2 nodes."""
    n = len(a.nodes)
    return f"{tasks_per_node(a)}(x{n})" if n > 1 else str(tasks_per_node(a))


def ntasks(a: Assignment) -> int:
    """SLURM_NTASKS: nodes × tasks per node."""
    return len(a.nodes) * tasks_per_node(a)


def local_ranks(a: Assignment) -> list[int]:
    """The local ranks this node launches: one per GPU (torchrun), one (node), one on node 0
    only (batch: the script; other nodes hold the allocation for srun)."""
    if a.launcher == "torchrun":
        return list(range(a.gpus_per_node))
    if a.launcher == "batch" and a.node_rank != 0:
        return []
    return [0]


def global_rank(a: Assignment, local_rank: int) -> int:
    """The global rank (SLURM_PROCID) of a local rank; the batch script is rank 0."""
    if a.launcher == "torchrun":
        return a.node_rank * a.gpus_per_node + local_rank
    if a.launcher == "node":
        return a.node_rank
    return 0


def seconds(value: float) -> str:
    """A number of seconds as a variable holds it: "30", "30.5" (no exponent, no ".0")."""
    if value == int(value):
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _clean(env: Mapping[str, str], secrets: Collection[str]) -> dict[str, str]:
    """Drop agent-owned families and any variable whose value is one of the agent's secrets."""
    return {
        k: v
        for k, v in env.items()
        if not k.startswith(_AGENT_OWNED_PREFIXES) and (not v or v not in secrets)
    }


def job_env(
    a: Assignment,
    *,
    base: Mapping[str, str],
    local_rank: int = 0,
    master_port: int | None = None,
    head_url: str | None = None,
    bin_dir: Path | None = None,
    job_dir: Path | None = None,
    secrets: Collection[str] = (),
    head_ca_pem: str | None = None,
) -> dict[str, str]:
    """The full environment of one process of assignment `a` (docs/control-plane.md).

    Layers, later wins: `base` (the agent's environment) → the job's own `env` → the
    variables the agent sets. `master_port` overrides `a.master_port` (the rank-0 node
    launches with the port it picked before the head echoes it). `bin_dir` goes first on
    PATH (the srun/scontrol shims). `secrets` are the agent's credentials: any variable
    holding one is dropped, as is every inherited SLURM_*/PHALANX_* variable.
    `head_ca_pem`: the CA certificate the head's TLS is pinned to (PHALANX_CA_PEM).
    """
    env = _clean(base, secrets)
    env.update(_clean(a.env, secrets))
    procid = global_rank(a, local_rank)
    port = master_port if master_port is not None else a.master_port
    nodelist = compress(a.nodes)
    gpus = ",".join(str(g) for g in a.gpus)
    n = ntasks(a)
    env.update(
        {
            "SLURM_JOB_ID": str(a.job_id),
            "SLURM_JOBID": str(a.job_id),
            "SLURM_JOB_NAME": a.name,
            "SLURM_JOB_USER": a.user,
            "SLURM_JOB_PARTITION": a.team,
            "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(a.nodes)),
            "SLURM_NNODES": str(len(a.nodes)),
            "SLURM_NTASKS": str(n),
            "SLURM_NPROCS": str(n),
            "SLURM_NTASKS_PER_NODE": str(tasks_per_node(a)),
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(local_rank),
            "SLURM_NODEID": str(a.node_rank),
            "SLURMD_NODENAME": a.nodes[a.node_rank],
            "SLURM_RESTART_COUNT": str(a.restart_count),
            "SLURM_SUBMIT_DIR": a.submit_dir,
            "SLURM_GPUS_ON_NODE": str(len(a.gpus)),
            "SLURM_GPUS_PER_NODE": str(a.gpus_per_node),
            "SLURM_GPUS": str(a.gpus_per_node * len(a.nodes)),
            "SLURM_TASKS_PER_NODE": _tasks_per_node_list(a),
            "SLURM_CLUSTER_NAME": "phalanx",
            "SLURM_JOB_GPUS": gpus,
            "CUDA_VISIBLE_DEVICES": gpus,
            "PHALANX_JOB_ID": str(a.job_id),
            "PHALANX_JOB_NAME": a.name,
            # Comma-separated in rank order (a compressed hostlist is sorted, and srun needs
            # the order that matches PHALANX_AGENT_URLS).
            "PHALANX_NODELIST": ",".join(a.nodes),
            "PHALANX_NUM_NODES": str(len(a.nodes)),
            "PHALANX_NTASKS": str(n),
            "PHALANX_PROCID": str(procid),
            "PHALANX_LOCALID": str(local_rank),
            "PHALANX_NODEID": str(a.node_rank),
            "PHALANX_RESTART_COUNT": str(a.restart_count),
            "PHALANX_EPOCH": str(a.epoch),
            "PHALANX_SUBMIT_DIR": a.submit_dir,
            "PHALANX_STEP_TOKEN": a.step_token,
            "PHALANX_AGENT_URLS": ",".join(a.agent_urls),
            "PHALANX_PREEMPT_SIGNAL": a.preempt_signal,
            "PHALANX_PREEMPT_DEADLINE": seconds(a.preempt_grace_s),
        }
    )
    if a.checkpoint_dir:
        env["PHALANX_CHECKPOINT_DIR"] = a.checkpoint_dir
    if a.account is not None:
        env["SLURM_JOB_ACCOUNT"] = a.account
    if a.cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(a.cpus_per_task)
    if a.array_task_id is not None:
        env["SLURM_ARRAY_TASK_ID"] = str(a.array_task_id)
        env["PHALANX_ARRAY_TASK_ID"] = str(a.array_task_id)
    if a.array_job_id is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(a.array_job_id)
    for name, value in (
        ("SLURM_ARRAY_TASK_COUNT", a.array_task_count),
        ("SLURM_ARRAY_TASK_MIN", a.array_task_min),
        ("SLURM_ARRAY_TASK_MAX", a.array_task_max),
        ("SLURM_ARRAY_TASK_STEP", a.array_task_step),
        ("SLURM_MEM_PER_NODE", a.mem_mb),
        ("SLURM_JOB_UID", a.uid),
        ("SLURM_JOB_GID", a.gid),
    ):
        if value is not None:
            env[name] = str(value)
    if head_url is not None:
        env["PHALANX_HEAD"] = head_url
    if head_ca_pem:
        env[CA_PEM_ENV] = head_ca_pem
    if job_dir is not None:
        env["PHALANX_JOB_DIR"] = str(job_dir)
    if bin_dir is not None:
        rest = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["PATH"] = f"{bin_dir}:{rest}" if rest else str(bin_dir)
    if port is not None:
        env["MASTER_ADDR"] = a.master_addr
        env["MASTER_PORT"] = str(port)
    if a.launcher == "torchrun":
        env.update(_torchrun_vars(a, local_rank, procid))
    elif a.launcher == "node":
        env.update(
            {
                "PET_NNODES": str(len(a.nodes)),
                "PET_NPROC_PER_NODE": str(a.gpus_per_node),
                "PET_NODE_RANK": str(a.node_rank),
                "PET_MASTER_ADDR": a.master_addr,
            }
        )
        if port is not None:
            env["PET_MASTER_PORT"] = str(port)
    return env


def _torchrun_vars(a: Assignment, local_rank: int, procid: int) -> dict[str, str]:
    """What torchrun's elastic agent sets for each worker it starts."""
    world = ntasks(a)
    out = {
        "RANK": str(procid),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(a.gpus_per_node),
        "GROUP_RANK": str(a.node_rank),
        "GROUP_WORLD_SIZE": str(len(a.nodes)),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(procid),
        "ROLE_WORLD_SIZE": str(world),
        "TORCHELASTIC_RESTART_COUNT": str(a.restart_count),
        "TORCHELASTIC_RUN_ID": str(a.job_id),
    }
    # torchrun pins OMP_NUM_THREADS=1 with several workers per node unless the user chose.
    if a.gpus_per_node > 1 and "OMP_NUM_THREADS" not in a.env:
        out["OMP_NUM_THREADS"] = str(a.cpus_per_task or 1)
    return out


# What differs between the node srun runs on and the node a task runs on: these come from
# the task's own node, never from srun's forwarded environment.
_NODE_SPECIFIC = frozenset(
    {
        "SLURMD_NODENAME",
        "SLURM_NODEID",
        "SLURM_GPUS_ON_NODE",
        "SLURM_JOB_GPUS",
        "CUDA_VISIBLE_DEVICES",
        "PHALANX_NODEID",
        "PHALANX_JOB_DIR",
        "PHALANX_HEAD",
    }
)


def step_env(
    a: Assignment,
    task: StepTask,
    *,
    step_id: int,
    base: Mapping[str, str],
    head_url: str | None = None,
    bin_dir: Path | None = None,
    job_dir: Path | None = None,
    secrets: Collection[str] = (),
    head_ca_pem: str | None = None,
) -> dict[str, str]:
    """The environment of one `srun` task on this node.

    Layers, later wins, as Slurm's srun --export=ALL: the agent's clean `base` → the
    node's job variables (SLURM_*, PHALANX_*) → srun's forwarded environment (`task.env`,
    what the batch script saw; minus node-specific variables and secrets) → the task's
    own: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_ID, SLURM_NTASKS and
    CUDA_VISIBLE_DEVICES = this node's allocation. SLURM_STEP_NODELIST,
    SLURM_STEP_NUM_TASKS and SLURM_STEP_NUM_NODES come from srun, which alone knows the
    whole step.
    """
    node = job_env(
        a,
        base=base,
        head_url=head_url,
        bin_dir=bin_dir,
        job_dir=job_dir,
        secrets=secrets,
        head_ca_pem=head_ca_pem,
    )
    env = _clean(base, secrets)
    env.update({k: v for k, v in node.items() if k.startswith(_AGENT_OWNED_PREFIXES)})
    env["CUDA_VISIBLE_DEVICES"] = node["CUDA_VISIBLE_DEVICES"]
    env.update(
        {
            k: v
            for k, v in task.env.items()
            if k not in _NODE_SPECIFIC and (not v or v not in secrets)
        }
    )
    if bin_dir is not None and not env.get("PATH", "").startswith(f"{bin_dir}:"):
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    num_tasks = task.env.get("SLURM_STEP_NUM_TASKS", "1")
    env.update(
        {
            "SLURM_STEP_ID": str(step_id),
            "SLURM_STEPID": str(step_id),
            "SLURM_PROCID": str(task.task_id),
            "SLURM_LOCALID": str(task.local_id),
            "SLURM_NODEID": str(task.node_id),
            "SLURM_STEP_NUM_TASKS": num_tasks,
            "SLURM_NTASKS": num_tasks,
            "SLURM_NPROCS": num_tasks,
            "SLURM_STEP_NODELIST": task.env.get("SLURM_STEP_NODELIST", a.nodes[a.node_rank]),
            "SLURM_STEP_NUM_NODES": task.env.get("SLURM_STEP_NUM_NODES", "1"),
            "PHALANX_PROCID": str(task.task_id),
            "PHALANX_LOCALID": str(task.local_id),
            "PHALANX_NODEID": str(task.node_id),
            "PHALANX_STEP_ID": str(step_id),
        }
    )
    return env
