"""The simulated fleet speaks the real agent protocol to a real head process."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

from phalanx.api.models import JobSpec
from phalanx.local.cluster import LocalCluster
from phalanx.testing.fleet import Fleet


def test_simulated_nodes_join_run_a_gang_job_and_end_it(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=0, head_args=["--heartbeat", "0.3"]) as cluster:
        assert cluster.ca_file is not None
        verify = ssl.create_default_context(cafile=str(cluster.ca_file))
        fleet = Fleet.make(cluster.url, cluster.join_token, 6, gpus=8, verify=verify)
        client = cluster.client()
        job = client.submit(
            JobSpec(command=["true"], workdir="/tmp", nodes=2, gpus_per_node=8, name="gang")
        ).job_ids[0]

        async def scenario() -> None:
            runner = asyncio.create_task(fleet.run(20.0))
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and sum(job in n.running for n in fleet.nodes) < 2:
                await asyncio.sleep(0.1)  # state R comes at placement; ranks once both nodes heard
            assert client.job(job).job.state == "R"
            assert fleet.finish(job, 0) == 2  # two nodes hold its ranks
            while time.monotonic() < deadline and client.job(job).job.state in ("R", "CG"):
                await asyncio.sleep(0.2)
            runner.cancel()

        asyncio.run(scenario())
        assert client.job(job).job.state == "CD"
        listed = {n.name: n for n in client.nodes().nodes}
        assert len(listed) == 6 and all(n.state == "up" for n in listed.values())
        assert not fleet.errors
        assert all(node.heartbeats > 0 for node in fleet.nodes)
