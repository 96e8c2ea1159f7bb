"""Builders and waiting helpers shared by the agent tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.api.models import Assignment, DesiredState

T = TypeVar("T")

STEP_TOKEN = "step-token-job-7-0123456789"


def assignment(**changes: Any) -> Assignment:
    """A 2-node torchrun assignment of job 7 on node 0, with `changes` applied."""
    fields: dict[str, Any] = {
        "job_id": 7,
        "epoch": 1,
        "name": "train",
        "user": "alice",
        "launcher": "torchrun",
        "command": ["true"],
        "script": None,
        "workdir": "/tmp",
        "env": {},
        "gpus": [0, 1],
        "node_rank": 0,
        "nodes": ["n1", "n2"],
        "addresses": ["127.0.0.2", "127.0.0.3"],
        "agent_urls": ["http://127.0.0.2:9001", "http://127.0.0.3:9001"],
        "gpus_per_node": 2,
        "ntasks_per_node": None,
        "cpus_per_task": None,
        "master_addr": "127.0.0.2",
        "master_port": 29500,
        "restart_count": 0,
        "submit_dir": "/home/alice",
        "output": None,
        "error": None,
        "array_job_id": None,
        "array_task_id": None,
        "time_limit_s": None,
        "step_token": STEP_TOKEN,
        "account": None,
        "team": "default",
    }
    fields.update(changes)
    return Assignment(**fields)


def desired(*jobs: Assignment, version: int = 1, kill_grace_s: float = 5.0) -> DesiredState:
    """A desired state holding `jobs`."""
    return DesiredState(
        version=version, jobs=list(jobs), heartbeat_s=1.0, lease_s=10.0, kill_grace_s=kill_grace_s
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 20.0) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
