"""A job the agent cannot launch fails alone (LaunchFailed); the agent and its other jobs
live on (issue 12: a NUL byte or an impossible `-o` path once crashed every agent it reached)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.agent.main import AgentConfig, run_agent
from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.api.models import Assignment, Heartbeat, ProcessStatus
from phalanx.testing.processes import pid_alive

from .helpers import assignment, desired, wait_for
from .stubhead import JOIN, StubHead, serve


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Reconciler]:
    ctx = LaunchContext(state_dir=tmp_path / "state", base_env={"PATH": os.environ["PATH"]})
    r = Reconciler(ctx, ProcessManager())
    yield r
    r.shutdown()


def one_gpu(job_id: int, workdir: Path, **changes: Any) -> Assignment:
    """A 1-node, 1-GPU torchrun assignment of `job_id` on GPU `job_id % 2`."""
    fields: dict[str, Any] = {
        "job_id": job_id,
        "command": ["sleep", "30"],
        "workdir": str(workdir),
        "nodes": ["n1"],
        "addresses": ["127.0.0.2"],
        "agent_urls": ["http://127.0.0.2:9001"],
        "gpus_per_node": 1,
        "gpus": [job_id % 2],
        "step_token": f"step-token-of-job-{job_id}-0123456789",
    }
    return assignment(**{**fields, **changes})


def status_of(statuses: list[ProcessStatus], job_id: int) -> ProcessStatus:
    [s] = [s for s in statuses if s.job_id == job_id]
    return s


@pytest.mark.parametrize(
    ("what", "output", "needle"),
    [
        ("a directory", "{workdir}", "names a directory"),
        ("a directory by pattern", "out-%j", "names a directory"),
        ("an impossible path", "/proc/nope/out-%j.txt", "cannot write /proc/nope/out-9.txt"),
    ],
)
def test_unusable_output_fails_that_job_only(
    rec: Reconciler, tmp_path: Path, what: str, output: str, needle: str
) -> None:
    (tmp_path / "out-9").mkdir()
    good = one_gpu(8, tmp_path)
    bad = one_gpu(9, tmp_path, output=output.format(workdir=tmp_path))
    rec.apply(desired(good, bad))  # used to raise (IsADirectoryError, PermissionError)
    statuses = rec.process_statuses()
    failed = status_of(statuses, 9)
    assert not failed.running and failed.pid is None and failed.exit_code == 1, what
    assert failed.launch_error is not None
    assert failed.launch_error.startswith("LaunchFailed: -o ")
    assert needle in failed.launch_error, failed.launch_error
    running = status_of(statuses, 8)
    assert running.running and running.pid is not None and pid_alive(running.pid)
    assert running.launch_error is None
    # The reason is in the rank's log too, under the state dir (`phalanx logs`).
    _, err, ended = rec.rank_log(9, 0) or (None, Path("/nonexistent"), False)
    assert ended and needle in err.read_text()
    rec.apply(desired(good, bad))  # idempotent: reported once, never started
    assert status_of(rec.process_statuses(), 9).pid is None


def test_a_launch_that_raises_fails_that_job_only(
    rec: Reconciler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever no check foresaw (here: a bug in building the environment) fails the job
    # whose launch raised, with the exception as its reason, and is counted.
    import phalanx.agent.env
    import phalanx.agent.reconcile as reconcile

    real = phalanx.agent.env.job_env

    def job_env(a: Assignment, **kw: Any) -> dict[str, str]:
        if a.job_id == 9:
            raise RuntimeError("boom")
        return real(a, **kw)

    monkeypatch.setattr(reconcile, "job_env", job_env)
    rec.apply(desired(one_gpu(8, tmp_path), one_gpu(9, tmp_path)))
    statuses = rec.process_statuses()
    assert status_of(statuses, 9).launch_error == "LaunchFailed: RuntimeError: boom"
    assert status_of(statuses, 8).running
    assert rec.survivals.counts() == {"reconcile": 1}


# ----------------------------------------------------------------------------- the whole agent
NUL_CASES = {
    "name": {"name": "tr\x00ain"},
    "command": {"command": ["sleep", "3\x000"]},
    "env": {"env": {"A": "x\x00y"}},
    "workdir": {"workdir": "/tmp/\x00"},
    "script": {"launcher": "batch", "command": None, "script": "#!/bin/sh\nsleep 30\x00\n"},
}


@pytest.mark.parametrize("field", sorted(NUL_CASES))
def test_a_nul_from_the_head_fails_that_job_and_the_agent_lives_on(
    tmp_path: Path, field: str
) -> None:
    good = one_gpu(8, tmp_path)
    state = desired(good, one_gpu(9, tmp_path), version=3, heartbeat_s=0.5, lease_s=30.0)
    raw = state.model_dump(mode="json")
    raw["jobs"][1].update(NUL_CASES[field])  # what the head's own checks would refuse
    cfg_dir = tmp_path / "agent"
    with serve(StubHead(state, raw=raw)) as head:
        stop = threading.Event()
        errors: list[BaseException] = []

        def target() -> None:
            try:
                run_agent(_config(head, cfg_dir), stop)
            except BaseException as e:  # surfaced by the assertions below
                errors.append(e)

        agent = threading.Thread(target=target)
        agent.start()
        try:

            def reported() -> Heartbeat | None:
                for beat in reversed(head.beats):
                    jobs = {p.job_id: p for p in beat.processes or []}
                    if 9 in jobs and 8 in jobs and jobs[8].running:
                        return beat
                return None

            beat = wait_for("a heartbeat reporting both jobs", reported)
            failed = status_of(beat.processes or [], 9)
            assert failed.launch_error is not None and not failed.running
            assert failed.launch_error.startswith("LaunchFailed: invalid assignment: "), failed
            assert field in failed.launch_error, failed.launch_error
            assert "NUL" in failed.launch_error, failed.launch_error
            # Later beats still carry both: the agent keeps its jobs and keeps reporting.
            seen = len(head.beats)
            wait_for("more heartbeats", lambda: len(head.beats) > seen + 1)
            last = head.beats[-1]
            assert last.processes is not None  # a stub head never acks: full reports
            assert status_of(last.processes, 8).running
            pid = status_of(last.processes, 8).pid
            assert pid is not None and pid_alive(pid)
            assert status_of(last.processes, 9).launch_error == failed.launch_error
            assert agent.is_alive() and errors == []
        finally:
            stop.set()
            agent.join(timeout=30)
    assert errors == [] and not agent.is_alive()


def _config(head: StubHead, state_dir: Path) -> AgentConfig:
    return AgentConfig(
        head_url=head.url,
        token=JOIN,
        address="127.0.0.2",
        name="n1",
        state_dir=state_dir,
        fake_gpus=2,
        heartbeat_s=0.5,
    )
