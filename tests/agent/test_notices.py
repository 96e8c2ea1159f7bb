"""Notices: each signal reaches the job's processes once, batch-only ones only the script."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.api.models import Assignment, Notice

from .harness import start_agent
from .helpers import assignment, desired, wait_for

# Notes each signal it gets in `got`: dash runs pending traps in signal-number order, so a
# USR1 sent before a USR2 is always written first.
TRAPS = (
    "trap 'echo {who}-usr1 >> got' USR1; trap 'echo {who}-usr2 >> got' USR2; touch {who}-ready;"
    " while :; do sleep 0.05; done"
)
PREEMPT = Notice(id=1, signal="SIGUSR1", reason="preempted by job 9")
SENTINEL = Notice(id=2, signal="SIGUSR2", reason="time limit in 60 s")


def with_notices(a: Assignment, *notices: Notice) -> Assignment:
    return a.model_copy(update={"notices": list(notices)})


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def ctx(tmp_path: Path) -> LaunchContext:
    return LaunchContext(state_dir=tmp_path / "state", base_env={"PATH": os.environ["PATH"]})


@pytest.fixture
def rec(ctx: LaunchContext) -> Iterator[Reconciler]:
    r = Reconciler(ctx, ProcessManager())
    yield r
    r.shutdown()


def test_each_notice_once_across_applies_and_agent_restart(
    rec: Reconciler, ctx: LaunchContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = assignment(
        command=["sh", "-c", TRAPS.format(who="rank")], workdir=str(tmp_path), gpus_per_node=1
    )
    rec.apply(desired(a))
    wait_for("the traps", lambda: (tmp_path / "rank-ready").exists())
    for version in (2, 3, 4):
        rec.apply(desired(with_notices(a, PREEMPT), version=version))
    wait_for("the notice", lambda: lines(tmp_path / "got"))
    unknown = Notice(id=3, signal="SIGNOPE", reason="no such signal here: skipped")
    for version in (5, 6):
        rec.apply(desired(with_notices(a, PREEMPT, unknown), version=version))
    # A second notice as a sentinel: any repeat of the first would be written before it.
    rec.apply(desired(with_notices(a, PREEMPT, unknown, SENTINEL), version=7))
    wait_for("the sentinel", lambda: "rank-usr2" in lines(tmp_path / "got"))
    assert lines(tmp_path / "got") == ["rank-usr1", "rank-usr2"]
    assert rec.process_statuses()[0].running  # the unknown signal was skipped

    # The agent is killed and starts again: the epoch is reported lost, the delivered ids
    # are read back from the launch dir, and nothing is sent (or skipped) a second time.
    caplog.set_level(logging.INFO, logger="phalanx.agent.notices")
    caplog.clear()
    again = Reconciler(ctx, ProcessManager())
    try:
        again.apply(desired(with_notices(a, PREEMPT, unknown, SENTINEL), version=8))
        assert again.notices_delivered(7, 1) == {1, 2, 3}
        assert [r.getMessage() for r in caplog.records if "notice" in r.getMessage()] == []
        [p] = again.process_statuses()
        assert (p.running, p.lost) == (False, True)
    finally:
        again.shutdown()
    rec.apply(desired(with_notices(a, PREEMPT, unknown, SENTINEL), version=9))
    assert lines(tmp_path / "got") == ["rank-usr1", "rank-usr2"]


def test_notice_for_a_rank_not_started_yet_follows_its_start(
    rec: Reconciler, tmp_path: Path
) -> None:
    # Node 1 of 2 waits for the master port; the notice comes first.
    trap = "trap 'echo rank-usr1 >> got' USR1; while :; do sleep 0.05; done"
    a = assignment(command=["sh", "-c", trap], workdir=str(tmp_path), node_rank=1, gpus_per_node=1)
    waiting = with_notices(a.model_copy(update={"master_port": None}), PREEMPT)
    rec.apply(desired(waiting))
    assert rec.process_statuses() == [] and rec.notices_delivered(7, 1) == set()
    rec.apply(desired(with_notices(a, PREEMPT), version=2))
    assert rec.notices_delivered(7, 1) == {1}

    def reached() -> bool:
        # Sent right after the start: before the trap is set, USR1 (10) ends the shell.
        [p] = rec.process_statuses()
        return p.signal == 10 or lines(tmp_path / "got") == ["rank-usr1"]

    assert wait_for("the notice to reach the new rank", reached)


def test_batch_only_notice_reaches_the_script_not_its_steps(tmp_path: Path) -> None:
    agent = start_agent("127.0.0.5", tmp_path / "agent")
    try:
        # bash runs the script; srun (in the script's process group) starts the step task.
        script = "\n".join(
            [
                "trap 'echo batch-usr1 >> got' USR1",
                "trap 'echo batch-usr2 >> got' USR2",
                f"srun sh -c {shlex.quote(TRAPS.format(who='step'))} &",
                "touch batch-ready",
                "while :; do sleep 0.05; done",
            ]
        )
        a = assignment(
            launcher="batch",
            command=None,
            script=script,
            workdir=str(tmp_path),
            nodes=["127.0.0.5"],
            addresses=["127.0.0.5"],
            agent_urls=[agent.url],
            master_addr="127.0.0.5",
            gpus=[0],
            gpus_per_node=1,
        )
        agent.apply(desired(a))
        wait_for("the batch script", lambda: (tmp_path / "batch-ready").exists())
        wait_for("the step", lambda: (tmp_path / "step-ready").exists())
        batch_only = PREEMPT.model_copy(update={"batch_only": True})
        agent.apply(desired(with_notices(a, batch_only), version=2))
        agent.apply(desired(with_notices(a, batch_only, SENTINEL), version=3))
        wait_for(
            "the sentinel everywhere",
            lambda: {"batch-usr2", "step-usr2"} <= set(lines(tmp_path / "got")),
        )
        assert sorted(lines(tmp_path / "got")) == ["batch-usr1", "batch-usr2", "step-usr2"]
    finally:
        agent.close()
