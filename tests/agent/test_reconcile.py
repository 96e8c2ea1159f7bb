"""Reconcile hand-made desired states into real processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler, script_argv
from phalanx.api.models import ProcessStatus
from phalanx.testing.processes import pid_alive

from .helpers import assignment, desired, wait_for

ECHO_ENV = ["sh", "-c", 'echo "$RANK $LOCAL_RANK $MASTER_PORT $CUDA_VISIBLE_DEVICES"']


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Reconciler]:
    ctx = LaunchContext(state_dir=tmp_path / "state", base_env={"PATH": os.environ["PATH"]})
    r = Reconciler(ctx, ProcessManager())
    yield r
    r.shutdown()


def statuses(r: Reconciler, n: int) -> list[ProcessStatus]:
    """Wait until `n` processes are reported and all have ended."""

    def probe() -> list[ProcessStatus] | None:
        s = r.process_statuses()
        return s if len(s) == n and not any(p.running for p in s) else None

    return wait_for(f"{n} ended processes", probe)


def test_starts_local_ranks_with_logs(rec: Reconciler, tmp_path: Path) -> None:
    a = assignment(command=ECHO_ENV, workdir=str(tmp_path), node_rank=1)
    rec.apply(desired(a))
    done = statuses(rec, 2)
    assert [(p.job_id, p.epoch, p.rank, p.local_rank, p.exit_code) for p in done] == [
        (7, 1, 2, 0, 0),
        (7, 1, 3, 1, 0),
    ]
    logs = tmp_path / "state" / "logs" / "7" / "e1"
    assert (logs / "rank-2.out").read_text() == "2 0 29500 0,1\n"
    assert (logs / "rank-3.out").read_text() == "3 1 29500 0,1\n"
    assert (logs / "rank-3.err").read_text() == ""
    rec.apply(desired(a))  # idempotent: finished ranks stay reported, nothing restarts
    assert [p.rank for p in rec.process_statuses()] == [2, 3]
    assert rec.rank_log(7, 3) == (logs / "rank-3.out", logs / "rank-3.err", True)


def test_stops_what_is_no_longer_desired(rec: Reconciler, tmp_path: Path) -> None:
    a = assignment(command=["sleep", "30"], workdir=str(tmp_path), gpus_per_node=1, gpus=[0])
    rec.apply(desired(a))
    [running] = rec.process_statuses()
    assert running.running and running.pid is not None
    rec.apply(desired(version=2))  # job 7 gone: SIGTERM its group
    dead = wait_for("the rank to die", lambda: not rec.process_statuses()[0].running)
    assert dead
    assert rec.process_statuses()[0].signal == 15  # still reported until the next apply
    rec.apply(desired(version=2))
    assert rec.process_statuses() == []
    assert not pid_alive(running.pid)


def test_rank0_picks_master_port_others_wait(tmp_path: Path) -> None:
    ctx0 = LaunchContext(state_dir=tmp_path / "s0", base_env={"PATH": os.environ["PATH"]})
    ctx1 = LaunchContext(state_dir=tmp_path / "s1", base_env={"PATH": os.environ["PATH"]})
    changes0: list[int] = []
    node0 = Reconciler(ctx0, ProcessManager(), on_change=lambda: changes0.append(1))
    node1 = Reconciler(ctx1, ProcessManager())
    try:
        common = {"command": ECHO_ENV, "workdir": str(tmp_path), "master_port": None}
        node0.apply(desired(assignment(node_rank=0, **common)))
        node1.apply(desired(assignment(node_rank=1, **common)))
        ports = node0.master_ports()
        assert list(ports) == ["7"] and 1024 <= ports["7"] <= 65535
        assert changes0  # the heartbeat goes out at once with the port
        assert node1.process_statuses() == []  # waits for the port
        statuses(node0, 2)
        out = (tmp_path / "s0" / "logs" / "7" / "e1" / "rank-0.out").read_text()
        assert out == f"0 0 {ports['7']} 0,1\n"
        # The head echoes the port; node 1 launches with it, node 0 keeps its ranks.
        echoed = {**common, "master_port": ports["7"]}
        node1.apply(desired(assignment(node_rank=1, **echoed), version=2))
        node0.apply(desired(assignment(node_rank=0, **echoed), version=2))
        statuses(node1, 2)
        assert len(node0.process_statuses()) == 2
        out1 = (tmp_path / "s1" / "logs" / "7" / "e1" / "rank-3.out").read_text()
        assert out1 == f"3 1 {ports['7']} 0,1\n"
    finally:
        node0.shutdown()
        node1.shutdown()


def test_batch_runs_script_on_node0_only(tmp_path: Path) -> None:
    script = f"#!{sys.executable} -u\nimport os\nprint(os.environ['SLURM_NTASKS'], os.getcwd())\n"
    common = {
        "launcher": "batch",
        "command": None,
        "script": script,
        "workdir": str(tmp_path),
        "master_port": None,
    }
    ctx = LaunchContext(state_dir=tmp_path / "s", base_env={"PATH": os.environ["PATH"]})
    node0, node1 = Reconciler(ctx, ProcessManager()), Reconciler(ctx, ProcessManager())
    try:
        node0.apply(desired(assignment(node_rank=0, **common)))
        node1.apply(desired(assignment(node_rank=1, **common)))
        [p] = statuses(node0, 1)
        assert (p.rank, p.exit_code) == (0, 0)
        assert node1.process_statuses() == []
        out = (tmp_path / "s" / "logs" / "7" / "e1" / "rank-0.out").read_text()
        assert out == f"2 {tmp_path}\n"
    finally:
        node0.shutdown()
        node1.shutdown()


def test_script_argv() -> None:
    p = Path("/s/script")
    assert script_argv("echo hi\n", p) == ["bash", "/s/script"]
    assert script_argv("#!/bin/bash\nx", p) == ["/bin/bash", "/s/script"]
    assert script_argv("#!/usr/bin/env python3\n", p) == ["/usr/bin/env", "python3", "/s/script"]


def test_output_pattern_relative_to_workdir(rec: Reconciler, tmp_path: Path) -> None:
    a = assignment(
        command=["sh", "-c", "echo out-$RANK; echo err-$RANK >&2"],
        workdir=str(tmp_path),
        output="res-%j-%t.txt",
    )
    rec.apply(desired(a))
    statuses(rec, 2)
    assert (tmp_path / "res-7-0.txt").read_text() == "out-0\nerr-0\n"
    assert (tmp_path / "res-7-1.txt").read_text() == "out-1\nerr-1\n"
    assert rec.rank_log(7, 1) == (tmp_path / "res-7-1.txt", tmp_path / "res-7-1.txt", True)


def test_output_and_error_patterns(rec: Reconciler, tmp_path: Path) -> None:
    a = assignment(
        command=["sh", "-c", "echo o; echo e >&2"],
        workdir=str(tmp_path),
        gpus_per_node=1,
        output="%x.out",
        error="%x-%N.err",
    )
    rec.apply(desired(a))
    statuses(rec, 1)
    assert (tmp_path / "train.out").read_text() == "o\n"
    assert (tmp_path / "train-n1.err").read_text() == "e\n"


def test_missing_workdir_fails_the_launch_and_is_never_created(
    rec: Reconciler, tmp_path: Path
) -> None:
    # The head always sends a checkpoint dir inside the workdir; creating it once made a
    # mistyped -D appear, and the job ran there (review M5).
    gone = tmp_path / "gone"
    a = assignment(
        workdir=str(gone), gpus_per_node=1, output="x.out", checkpoint_dir=str(gone / "ckpt")
    )
    rec.apply(desired(a))
    [p] = statuses(rec, 1)
    assert (p.pid, p.exit_code) == (None, 1)
    # LaunchFailed: the head fails the job, without requeueing it.
    assert p.launch_error == f"LaunchFailed: working directory {gone} does not exist on this node"
    err = (tmp_path / "state" / "logs" / "7" / "e1" / "rank-0.err").read_text()
    assert f"working directory {gone} does not exist on this node" in err
    assert not gone.exists()


def test_workdir_that_is_a_file_fails_the_launch(rec: Reconciler, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    a = assignment(workdir=str(tmp_path / "file"), gpus_per_node=1)
    rec.apply(desired(a))
    [p] = statuses(rec, 1)
    assert (
        p.launch_error == f"LaunchFailed: working directory {tmp_path / 'file'} is not a directory"
    )


def test_new_epoch_waits_for_the_old_one(rec: Reconciler, tmp_path: Path) -> None:
    """A requeued job (epoch 2) starts only once epoch 1's processes are gone."""
    # Epoch 1 takes its time to exit on SIGTERM: until the test creates `release`.
    slow = [
        "sh",
        "-c",
        "trap 'until [ -f release ]; do sleep 0.02; done; exit 1' TERM; touch trapped;"
        " sleep 30 & wait",
    ]
    rec.apply(desired(assignment(command=slow, workdir=str(tmp_path), gpus_per_node=1)))
    # A SIGTERM that arrives before the shell has set its trap would end it at once.
    wait_for("the trap", lambda: (tmp_path / "trapped").exists())
    old = rec.process_statuses()[0]
    nxt = assignment(command=["true"], workdir=str(tmp_path), gpus_per_node=1, epoch=2)
    rec.apply(desired(nxt, version=2))
    rec.apply(desired(nxt, version=2))
    assert [(p.epoch, p.running) for p in rec.process_statuses()] == [(1, True)]
    (tmp_path / "release").touch()
    wait_for("epoch 1 to end", lambda: not rec.process_statuses()[0].running)
    rec.apply(desired(nxt, version=2))
    [p] = statuses(rec, 1)
    assert (p.epoch, p.exit_code) == (2, 0)
    assert old.pid is not None and not pid_alive(old.pid)


def test_agent_restart_never_reruns_an_epoch(tmp_path: Path) -> None:
    ctx = LaunchContext(state_dir=tmp_path / "s", base_env={"PATH": os.environ["PATH"]})
    a = assignment(command=["sleep", "30"], workdir=str(tmp_path), gpus_per_node=1)
    first = Reconciler(ctx, ProcessManager())
    first.apply(desired(a))
    first.shutdown()  # the agent exits, stopping its processes
    second = Reconciler(ctx, ProcessManager())
    try:
        second.apply(desired(a))
        [p] = second.process_statuses()
        assert (p.running, p.signal, p.pid) == (False, 9, None)
        # A different job that happens to reuse the id (new cluster) does run.
        other = assignment(
            command=["true"], workdir=str(tmp_path), gpus_per_node=1, step_token="x" * 20
        )
        second.apply(desired(version=2))
        second.apply(desired(other, version=3))
        assert statuses(second, 1)[0].exit_code == 0
    finally:
        second.shutdown()


def test_busy_gpus(rec: Reconciler, tmp_path: Path) -> None:
    a = assignment(command=["sleep", "30"], workdir=str(tmp_path), gpus=[2, 3])
    rec.apply(desired(a))
    assert rec.busy_gpus() == {2, 3}
    rec.apply(desired(version=2))
    wait_for("GPUs to be released", lambda: rec.busy_gpus() == set())
