"""Helpers for the end-to-end tests: job specs, waiting on states, logs and process checks."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Literal, TypeVar

from phalanx.api.models import JobInfo, JobSpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.testing.processes import pid_alive
from phalanx.testing.workload import Life

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]

TERMINAL = frozenset({"CD", "F", "CA", "TO", "NF", "OOM"})
# torch in several ranks on a 2-core machine: one thread each, or they fight for the cores.
JOB_ENV = {"OMP_NUM_THREADS": "1"}

# A real torch.distributed all-reduce over gloo, configured from the environment only.
ALLREDUCE_PY = """\
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
assert value.item() == expected, (value.item(), expected)
# One write per line: ranks that share a stdout (torchrun's children) must not interleave.
sys.stdout.write(f"rank {rank} of {world}: allreduce sum {value.item():g}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def job(workdir: Path, command: list[str], **fields: Any) -> JobSpec:
    """A job spec running `command` in `workdir` (1 node × 1 GPU unless `fields` say else)."""
    env = {**JOB_ENV, **fields.pop("env", {})}
    return JobSpec(command=command, workdir=str(workdir), env=env, **fields)


def sh(script: str) -> list[str]:
    """argv running `script` with bash."""
    return ["bash", "-c", script]


def py(code: str) -> list[str]:
    """argv running `code` with this interpreter (the venv's, which has torch)."""
    return [sys.executable, "-c", code]


def submit(client: PhalanxClient, spec: JobSpec) -> int:
    """Submit a (non-array) job; its id."""
    answer = client.submit(spec)
    assert len(answer.job_ids) == 1, answer
    return answer.job_ids[0]


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something other than None (or fail after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def describe(client: PhalanxClient, job_id: int) -> str:
    """A job's state, reason and event log, for assertion messages."""
    detail = client.job(job_id)
    info = detail.job
    lines = [f"job {job_id}: {info.state} exit {info.exit_code} reason {info.reason!r}"]
    lines += [f"  {e.kind}: {e.message}" for e in detail.events]
    return "\n".join(lines)


def wait_state(
    client: PhalanxClient, job_id: int, states: Collection[str] | str, timeout: float = 30.0
) -> JobInfo:
    """Poll the API until the job is in one of `states`; fail early if it ends elsewhere."""
    wanted = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    while True:
        info = client.job(job_id).job
        if info.state in wanted:
            return info
        if info.state in TERMINAL:
            raise AssertionError(f"wanted {sorted(wanted)}\n{describe(client, job_id)}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not in {sorted(wanted)} after {timeout:.0f} s\n{describe(client, job_id)}"
            )
        time.sleep(0.05)


def wait_reason(client: PhalanxClient, job_id: int, reason: str, timeout: float = 30.0) -> JobInfo:
    """Poll until the pending job's reason is `reason`."""

    def probe() -> JobInfo | None:
        info = client.job(job_id).job
        assert info.state == "PD", describe(client, job_id)
        return info if info.reason == reason else None

    return wait_for(f"job {job_id} pending with reason {reason}", probe, timeout)


def read_log(
    client: PhalanxClient, job_id: int | str, rank: int = 0, stream: Stream = "stdout"
) -> tuple[str, bool]:
    """Everything in one rank's log so far, through the head, and whether it is complete."""
    data, offset = [], 0
    while True:
        chunk = client.logs(job_id, rank, stream, offset)
        data.append(chunk.data)
        if chunk.next_offset == offset or chunk.eof:
            return "".join(data), chunk.eof
        offset = chunk.next_offset


def final_log(
    client: PhalanxClient, job_id: int | str, rank: int = 0, stream: Stream = "stdout"
) -> str:
    """A rank's whole log once the agent reports it complete (the rank has ended)."""

    def probe() -> str | None:
        text, eof = read_log(client, job_id, rank, stream)
        return text if eof else None

    return wait_for(f"the end of job {job_id} rank {rank}'s {stream}", probe, timeout=15)


def printed_pids(client: PhalanxClient, job_id: int, rank: int) -> list[int]:
    """The pids a rank printed on a `pids …` line of its stdout (waits for the line)."""

    def probe() -> list[int] | None:
        try:
            text = read_log(client, job_id, rank)[0]
        except ApiError as exc:
            # 409: not placed yet; 404: the rank's agent has not received the job yet
            if exc.status in (404, 409):
                return None
            raise
        match = re.search(r"^pids ([\d ]+)$", text, re.MULTILINE)
        return [int(p) for p in match.group(1).split()] if match else None

    return wait_for(f"job {job_id} rank {rank} to print its pids", probe, timeout=30)


def all_gone(pids: list[int]) -> bool | None:
    """True once none of `pids` is alive (a probe for `wait_for`)."""
    return True if not any(pid_alive(p) for p in pids) else None


def cancel_all(client: PhalanxClient, timeout: float = 30.0) -> None:
    """Cancel every job still queued or running, and wait until none is."""
    for info in client.jobs(active=True).jobs:
        if info.state in ("PD", "R"):
            try:
                client.cancel(info.id)
            except ApiError as exc:
                if exc.status != 409:  # 409: it ended meanwhile
                    raise

    def idle() -> bool | None:
        return True if not client.jobs(active=True).jobs else None

    wait_for("every job to end", idle, timeout)


# ----------------------------------------------------------------------------- checker inputs
def life(
    job: int,
    epoch: int,
    rank: int,
    first: float,
    last: float,
    *,
    node: str = "n1",
    gpus: tuple[int, ...] = (0,),
    begin: int = 0,
    step: int = 5,
    end: int | None = None,
) -> Life:
    """One process of a ledger (tests of the invariant checkers), its pid made of its ids."""
    pid = 1000 * job + 10 * epoch + rank
    return Life(job, epoch, rank, pid, node, gpus, first, last, begin, step, end)


def job_info(job_id: int, name: str, state: str, *, epoch: int = 1, restarts: int = 0) -> JobInfo:
    """What the head answers for a job (tests of the invariant checkers)."""
    return JobInfo.model_validate(
        {
            **dict.fromkeys(["account", "reason", "reason_message", "time_limit_s"]),
            **dict.fromkeys(["start_time", "end_time", "exit_code", "array_job_id"]),
            "array_task_id": None,
            **{"id": job_id, "name": name, "user": "u", "team": "t", "qos": "normal"},
            **{"priority": 0, "state": state, "nodes": 1, "gpus_per_node": 1},
            **{"launcher": "torchrun", "submit_time": 0.0, "restart_count": restarts},
            **{"epoch": epoch, "placement": [], "workdir": "/w"},
        }
    )
