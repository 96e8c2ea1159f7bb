"""Confinement end to end: a real head and agent; a job over its --mem ends OOM, and the
node says how it confines jobs. Skipped, with the reason, where cgroups cannot be used."""

from __future__ import annotations

from pathlib import Path

from phalanx.local import LocalCluster
from tests.agent.cgroup_fixtures import cgroup_parent  # noqa: F401  (a fixture)
from tests.e2e.helpers import describe, job, py, submit, wait_state

HOG = "chunks = []\nfor _ in range(64):\n    chunks.append(b'x' * (16 << 20))\n"


def test_a_job_over_its_mem_ends_oom(
    tmp_path: Path,
    cgroup_parent: str,  # noqa: F811  (the fixture)
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["--cgroup-parent", cgroup_parent]
    cluster = LocalCluster(tmp_path / "state", nodes=1, gpus_per_node=1, agent_args=args)
    with cluster, cluster.client() as client:
        [node] = client.nodes().nodes
        assert node.confinement.startswith("cgroup-v"), node.confinement
        job_id = submit(client, job(workdir, py(HOG), mem_mb=64))
        info = wait_state(client, job_id, "OOM", timeout=60.0)
        assert info.reason == "OutOfMemory", describe(client, job_id)
        assert info.exit_code == "0:9"
        kinds = [e.kind for e in client.job(job_id).events]
        assert "oom" in kinds and "requeued" not in kinds
        # A job within its limit completes as before.
        ok = submit(client, job(workdir, py("print('fits')"), mem_mb=256))
        wait_state(client, ok, "CD", timeout=60.0)
