"""What every job process sees: the launch environment of docs/control-plane.md, no secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from phalanx.api.models import ArraySpec, JobInfo
from phalanx.client.api import PhalanxClient
from phalanx.jobspec import hostlist
from phalanx.local import LocalCluster
from tests.e2e.helpers import job, submit, wait_state

DUMP_ENV_PY = """\
import json, os, pathlib
name = f"env-{os.environ['SLURM_JOB_ID']}-{os.environ['SLURM_PROCID']}.json"
pathlib.Path(name).write_text(json.dumps(dict(os.environ)))
"""
# Token prefixes of the head's credentials (phalanx.head.auth): API, join and node tokens.
# A job's own step token (`phxs_`) is the one credential it is meant to hold.
CREDENTIAL_PREFIXES = ("phx_", "phxj_", "phxn_")


def _run(api: PhalanxClient, workdir: Path, **fields: object) -> JobInfo:
    (workdir / "dump_env.py").write_text(DUMP_ENV_PY)
    job_id = submit(api, job(workdir, [sys.executable, "dump_env.py"], **fields))
    return wait_state(api, job_id, "CD", timeout=60)


def _envs(workdir: Path, job_id: int, tasks: int) -> list[dict[str, str]]:
    paths = [workdir / f"env-{job_id}-{rank}.json" for rank in range(tasks)]
    assert sorted(workdir.glob(f"env-{job_id}-*.json")) == sorted(paths)
    return [json.loads(p.read_text()) for p in paths]


def _agent_urls(api: PhalanxClient, info: JobInfo) -> str:
    urls = {n.name: n.agent_url for n in api.nodes().nodes}
    return ",".join(urls[p.node] for p in info.placement)


def _assert_no_credentials(cluster: LocalCluster, env: dict[str, str]) -> None:
    secrets = {cluster.admin_token, cluster.join_token}
    for name, value in env.items():
        assert not any(s in value for s in secrets), f"{name} holds a cluster secret"
        assert not value.startswith(CREDENTIAL_PREFIXES), f"{name} holds a credential"
    assert "PHALANX_TOKEN" not in env
    assert "PHALANX_JOIN_TOKEN" not in env
    assert env["PHALANX_STEP_TOKEN"].startswith("phxs_")


def test_torchrun_ranks_get_torchrun_slurm_and_phalanx_variables(
    api: PhalanxClient, cluster: LocalCluster, workdir: Path
) -> None:
    info = _run(api, workdir, name="envjob", nodes=2, gpus_per_node=2)
    envs = _envs(workdir, info.id, 4)

    nodes = [p.node for p in info.placement]
    assert sorted(nodes) == ["127.0.0.2", "127.0.0.3"]
    # Slurm numbers an allocation's nodes in host-list order; the list is compressed.
    assert nodes == ["127.0.0.2", "127.0.0.3"]
    master_port = envs[0]["MASTER_PORT"]
    assert 0 < int(master_port) < 65536
    assert cluster.ca_file is not None  # the head serves TLS by default
    ca_pem = cluster.ca_file.read_text()
    for rank, env in enumerate(envs):
        node = rank // 2
        expected = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % 2),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(node),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "4",
            "MASTER_ADDR": info.placement[0].address,
            "MASTER_PORT": master_port,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, info.placement[node].gpus)),
            "SLURM_JOB_ID": str(info.id),
            "SLURM_JOB_NAME": "envjob",
            "SLURM_NODELIST": "127.0.0.[2-3]",
            "SLURM_JOB_NODELIST": "127.0.0.[2-3]",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS": "4",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % 2),
            "SLURM_NODEID": str(node),
            "SLURM_RESTART_COUNT": "0",
            "SLURM_SUBMIT_DIR": str(workdir),
            "SLURM_GPUS_ON_NODE": "2",
            "PHALANX_JOB_ID": str(info.id),
            "PHALANX_JOB_NAME": "envjob",
            "PHALANX_NODELIST": ",".join(nodes),
            "PHALANX_NUM_NODES": "2",
            "PHALANX_NTASKS": "4",
            "PHALANX_PROCID": str(rank),
            "PHALANX_LOCALID": str(rank % 2),
            "PHALANX_NODEID": str(node),
            "PHALANX_RESTART_COUNT": "0",
            "PHALANX_EPOCH": str(info.epoch),
            "PHALANX_SUBMIT_DIR": str(workdir),
            "PHALANX_AGENT_URLS": _agent_urls(api, info),
            "PHALANX_HEAD": cluster.url,
            # The CA the head's TLS is pinned to: phalanx.train reports progress over it.
            "PHALANX_CA_PEM": ca_pem,
            "OMP_NUM_THREADS": "1",  # the job's own env
        }
        assert {k: env.get(k) for k in expected} == expected, f"rank {rank}"
        assert hostlist.expand(env["SLURM_JOB_NODELIST"]) == nodes
        for absent in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID", "PHALANX_ARRAY_TASK_ID"):
            assert absent not in env, f"rank {rank}: {absent} outside an array"
        assert "SLURM_CPUS_PER_TASK" not in env
        _assert_no_credentials(cluster, env)
    assert len({env["PHALANX_STEP_TOKEN"] for env in envs}) == 1


def test_node_launcher_gets_pet_variables_for_torchrun(
    api: PhalanxClient, cluster: LocalCluster, workdir: Path
) -> None:
    info = _run(api, workdir, launcher="node", nodes=2, gpus_per_node=2, cpus_per_task=2)
    envs = _envs(workdir, info.id, 2)  # one process per node

    port = envs[0]["PET_MASTER_PORT"]
    assert 0 < int(port) < 65536
    for node, env in enumerate(envs):
        expected = {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": info.placement[0].address,
            "PET_MASTER_PORT": port,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, info.placement[node].gpus)),
            "SLURM_JOB_ID": str(info.id),
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(node),
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "PHALANX_PROCID": str(node),
            "PHALANX_NODEID": str(node),
        }
        assert {k: env.get(k) for k in expected} == expected, f"node {node}"
        _assert_no_credentials(cluster, env)


def test_array_tasks_get_their_index_and_the_array_id(
    api: PhalanxClient, cluster: LocalCluster, workdir: Path
) -> None:
    (workdir / "dump_env.py").write_text(DUMP_ENV_PY)
    answer = api.submit(
        job(workdir, [sys.executable, "dump_env.py"], array=ArraySpec(indices=[3, 5]))
    )
    assert answer.array_job_id == answer.job_ids[0]
    for task_id, index in zip(answer.job_ids, [3, 5], strict=True):
        info = wait_state(api, task_id, "CD", timeout=60)
        assert (info.array_job_id, info.array_task_id) == (answer.array_job_id, index)
        (env,) = _envs(workdir, task_id, 1)
        expected = {
            "SLURM_JOB_ID": str(task_id),
            "SLURM_ARRAY_JOB_ID": str(answer.array_job_id),
            "SLURM_ARRAY_TASK_ID": str(index),
            "PHALANX_ARRAY_TASK_ID": str(index),
        }
        assert {k: env.get(k) for k in expected} == expected
        _assert_no_credentials(cluster, env)


def test_the_submitting_users_token_never_reaches_the_job(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path, tmp_path: Path
) -> None:
    (workdir / "dump_env.py").write_text(DUMP_ENV_PY)
    # `phalanx submit` exports the submit environment (sbatch's --export=ALL): the token
    # the CLI authenticates with is in it, and so is a look-alike credential variable.
    env = {
        **os.environ,
        **cluster.client_env(),
        "PHALANX_CONFIG_DIR": str(tmp_path / "config"),
        "MY_API_TOKEN": cluster.admin_token,
        "PLAIN_SETTING": "kept",
    }
    done = subprocess.run(
        [sys.executable, "-m", "phalanx", "submit", "--json", "--", sys.executable, "dump_env.py"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (job_id,) = json.loads(done.stdout)["job_ids"]
    wait_state(api, job_id, "CD", timeout=60)
    (job_env,) = _envs(workdir, job_id, 1)
    assert job_env["PLAIN_SETTING"] == "kept"  # the export happened
    assert "MY_API_TOKEN" not in job_env
    _assert_no_credentials(cluster, job_env)
    spec = api.job(job_id).spec
    assert cluster.admin_token not in json.dumps(spec.env)  # not stored with the job either
