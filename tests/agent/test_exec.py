"""`phalanx exec` on the agent: a real agent API with a running job, no head. The command
runs beside its rank with the rank's environment, streams back, and is bounded: killed at
its timeout, past its output limit, with its job and when its reader goes away."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api.models import Assignment, ExecFrame
from phalanx.testing.processes import pid_alive

from .harness import AGENT_SECRET, Agent, start_agent
from .helpers import STEP_TOKEN, assignment, desired, wait_for


@dataclass
class Running:
    agent: Agent
    job: Assignment
    workdir: Path


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    agent = start_agent("127.0.0.2", tmp_path / "agent")
    try:
        job = assignment(command=["sleep", "60"], workdir=str(tmp_path), env={"FOO": "bar"})
        done = assignment(job_id=8, step_token="step-token-job-8-xxxxxxxxxx", command=["true"])
        agent.apply(desired(job, done))

        def ranks_up() -> bool:
            states = {(p.job_id, p.rank): p for p in agent.reconciler.process_statuses()}
            return (
                states.get((7, 0)) is not None
                and states[(7, 0)].running
                and states[(7, 1)].running
                and (8, 0) in states
                and not states[(8, 0)].running
            )

        wait_for("job 7's ranks to run and job 8's to end", ranks_up)
        yield Running(agent, job, tmp_path)
    finally:
        agent.close()


def _body(argv: list[str], **fields: Any) -> dict[str, Any]:
    return {"job_id": 7, "epoch": 1, "rank": 0, "argv": argv, "timeout_s": 30, **fields}


def _exec(
    agent: Agent, argv: list[str], token: str | None = AGENT_SECRET, **fields: Any
) -> tuple[int, list[ExecFrame], str]:
    """POST an exec and read its whole answer: (status, frames, error detail)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.stream(
        "POST", f"{agent.url}/v1/exec", json=_body(argv, **fields), headers=headers, timeout=60
    ) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [], r.json()["detail"]
        frames = [ExecFrame.model_validate_json(line) for line in r.iter_lines() if line]
    return 200, frames, ""


def _text(frames: list[ExecFrame], kind: str) -> str:
    return "".join(f.data for f in frames if f.kind == kind)


def test_exec_runs_beside_its_rank_with_the_ranks_environment(running: Running) -> None:
    script = "echo $RANK $LOCAL_RANK $MASTER_PORT $FOO $PHALANX_JOB_ID; pwd; echo oops >&2; exit 3"
    status, frames, _ = _exec(running.agent, ["bash", "-c", script], rank=1)
    assert status == 200
    assert _text(frames, "stdout") == f"1 1 29500 bar 7\n{running.workdir}\n"
    assert _text(frames, "stderr") == "oops\n"
    assert frames[-1].kind == "exit" and frames[-1].exit_code == 3
    status, frames, _ = _exec(running.agent, ["env"])
    assert AGENT_SECRET not in _text(frames, "stdout")  # the agent's credentials stay its own
    # Once streamed, an exec leaves nothing behind: no books, no files.
    wait_for("the execs to be reaped", lambda: running.agent.execs.active() == 0)
    logs = running.agent.ctx.state_dir / "logs" / "7" / "e1"
    assert not list(logs.glob("exec-*"))


def test_a_command_that_cannot_start_says_why(running: Running) -> None:
    status, frames, _ = _exec(running.agent, ["no-such-command-here"])
    assert status == 200
    assert "no-such-command-here: command not found" in _text(frames, "stderr")
    assert frames[-1].exit_code == 127


def test_an_exec_is_killed_at_its_timeout(running: Running) -> None:
    status, frames, _ = _exec(running.agent, ["bash", "-c", "echo $$; exec sleep 60"], timeout_s=1)
    assert status == 200
    last = frames[-1]
    assert last.kind == "exit" and last.timed_out and last.signal is not None
    assert "timeout of 1 s" in (last.message or "")
    pid = int(_text(frames, "stdout").split()[0])
    wait_for("the timed-out command to be gone", lambda: not pid_alive(pid))


def test_output_past_the_limit_is_cut_and_the_command_killed(running: Running) -> None:
    status, frames, _ = _exec(running.agent, ["yes"], max_output_bytes=10_000)
    assert status == 200
    assert 0 < len(_text(frames, "stdout").encode()) <= 10_000
    last = frames[-1]
    assert last.kind == "exit" and last.truncated and last.signal is not None
    assert "passed 10000 bytes" in (last.message or "")


def _first_pid(lines: Iterator[str]) -> int:
    for line in lines:
        frame = ExecFrame.model_validate_json(line)
        if frame.kind == "stdout" and frame.data.strip():
            return int(frame.data.split()[0])
    raise AssertionError("the exec printed no pid")


def test_a_reader_that_goes_away_kills_the_exec(running: Running) -> None:
    headers = {"Authorization": f"Bearer {AGENT_SECRET}"}
    body = _body(["bash", "-c", "echo $$; exec sleep 60"])
    with httpx.stream(
        "POST", f"{running.agent.url}/v1/exec", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()  # kept: a dropped line iterator closes the stream
        pid = _first_pid(lines)
        assert pid_alive(pid)
    wait_for("the abandoned command to be killed", lambda: not pid_alive(pid))
    wait_for("its exec to be reaped", lambda: running.agent.execs.active() == 0)


def test_an_exec_dies_with_its_job(running: Running) -> None:
    headers = {"Authorization": f"Bearer {AGENT_SECRET}"}
    body = _body(["bash", "-c", "echo $$; exec sleep 60"])
    with httpx.stream(
        "POST", f"{running.agent.url}/v1/exec", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        pid = _first_pid(lines)
        running.agent.apply(desired(version=2))  # the head no longer wants job 7 here
        rest = [ExecFrame.model_validate_json(line) for line in lines if line]
    assert rest[-1].kind == "exit"
    assert "the job stopped on this node" in (rest[-1].message or "")
    wait_for("the command to be gone", lambda: not pid_alive(pid))


def test_execs_per_node_are_capped(running: Running) -> None:
    running.agent.execs.max_execs = 1
    headers = {"Authorization": f"Bearer {AGENT_SECRET}"}
    body = _body(["bash", "-c", "echo $$; exec sleep 60"])
    with httpx.stream(
        "POST", f"{running.agent.url}/v1/exec", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()  # kept: a dropped line iterator closes the stream
        _first_pid(lines)
        status, _, detail = _exec(running.agent, ["true"])
        assert status == 429 and "already runs 1 execs" in detail
    wait_for("the first exec to be reaped", lambda: running.agent.execs.active() == 0)
    assert _exec(running.agent, ["true"])[0] == 200


@pytest.mark.parametrize(
    ("what", "token", "fields", "status", "needle"),
    [
        ("no token", None, {}, 401, "missing"),
        ("the job's own step token", STEP_TOKEN, {}, 401, "with the agent secret"),
        ("an unknown token", "not-a-token", {}, 401, "invalid token"),
        ("another epoch", AGENT_SECRET, {"epoch": 2}, 409, "does not run on this node"),
        ("a job not here", AGENT_SECRET, {"job_id": 99}, 409, "does not run on this node"),
        ("a rank not here", AGENT_SECRET, {"rank": 5}, 409, "rank 5 of job 7 does not run"),
        ("a rank that ended", AGENT_SECRET, {"job_id": 8}, 409, "rank 0 of job 8 has ended"),
        ("no command", AGENT_SECRET, {"argv": []}, 422, "argv"),
        ("a NUL in the command", AGENT_SECRET, {"argv": ["a\x00b"]}, 422, "NUL"),
        ("a huge command", AGENT_SECRET, {"argv": ["x" * 60_000] * 3}, 422, "bytes"),
        ("a timeout too long", AGENT_SECRET, {"timeout_s": 3601}, 422, "timeout_s"),
    ],
)
def test_exec_refusals(
    running: Running,
    what: str,
    token: str | None,
    fields: dict[str, Any],
    status: int,
    needle: str,
) -> None:
    argv = fields.pop("argv", ["true"])
    got, frames, detail = _exec(running.agent, argv, token=token, **fields)
    assert (got, frames) == (status, []), what
    assert needle in detail, (what, detail)
    assert running.agent.execs.active() == 0
