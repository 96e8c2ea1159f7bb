"""A job no agent can launch ends F with reason LaunchFailed, is not requeued, and the
node's other jobs and every daemon live on (issue 12: an `-o` naming a directory crashed
the agent, which crash-looped; requeued, the job crashed the next node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import job, sh, submit, wait_state


@pytest.mark.parametrize(
    ("output", "needle"),
    [
        ("{workdir}", "names a directory"),
        ("/proc/nope/out-%j.txt", "cannot write /proc/nope/out-"),
    ],
    ids=["directory", "impossible-path"],
)
def test_unlaunchable_job_fails_with_launch_failed_and_is_not_requeued(
    api: PhalanxClient, cluster: LocalCluster, workdir: Path, output: str, needle: str
) -> None:
    pin = ["127.0.0.3"]  # both jobs on 127.0.0.2
    neighbour = submit(api, job(workdir, sh("sleep 60"), exclude_nodes=pin))
    wait_state(api, neighbour, "R")
    spec = job(
        workdir,
        sh("echo never"),
        output=output.format(workdir=workdir),
        exclude_nodes=pin,
        restart_on_failure=True,  # even so: no restart would help
        max_restarts=3,
    )
    bad = submit(api, spec)
    info = wait_state(api, bad, "F")
    detail = api.job(bad)
    assert info.reason == "LaunchFailed", info
    assert info.reason_message is not None and needle in info.reason_message, info
    assert info.restart_count == 0
    kinds = [e.kind for e in detail.events]
    assert "launch_failed" in kinds and "requeued" not in kinds, kinds
    [event] = [e for e in detail.events if e.kind == "launch_failed"]
    assert event.message.startswith("LaunchFailed: rank 0 on 127.0.0.2: -o ")
    assert api.job(neighbour).job.state == "R"  # the node's other job runs on
    cluster.check()  # no head or agent died
