"""Routine operations, short form: with ledger jobs running on a PostgreSQL cluster with a
standby head, the head is killed and restarted, frozen, and taken over by the standby, and
the agents are upgraded one by one; no job may be killed, and the chaos invariants hold
(phalanx.testing.operations; the long form is `bench/chaos.py --operations`). The checkers
that tell a killed job are tested first, on hand-written inputs, so that a pass means
something."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from phalanx.testing.continuity import Running, disturbed
from phalanx.testing.invariants import check_none_killed
from phalanx.testing.operations import OPERATIONS, OperationsConfig, run_operations
from phalanx.testing.postgres import PostgresServer
from phalanx.testing.processes import pid_alive
from phalanx.testing.workload import command, lives, read_ledger
from tests.e2e.helpers import job_info, life

RUN = OPERATIONS  # all four: head restart, head pause, standby takeover, agent upgrades


def test_routine_operations_kill_no_job(postgres: PostgresServer, tmp_path: Path) -> None:
    # A 22 s outage is 3.1 × (lease 6 s + margin 1 s): only riding it out on the peers
    # keeps the jobs. The lease also bounds an agent's upgrade (SIGUSR2 → the new agent
    # registered): 4 s was too short for a Python start on a machine busy with more than
    # this suite (8.3 s seen). ~15 s to start, 8 s of jobs alone, then per operation the
    # outage (or the agent restart) and a quiet lease + margin + 2 heartbeats to catch a late
    # requeue: about 3 minutes in all.
    config = OperationsConfig(
        operations=RUN,
        lease_s=6.0,
        outage_s=22.0,
        baseline_s=8.0,
        db_url=postgres.new_database("operations"),
    )

    report = run_operations(tmp_path, config)

    summary = json.dumps(report.to_json(), indent=1, default=str)
    assert report.ok, summary
    # In order; the upgrade as one step per node's agent, one by one.
    expected = [o for op in RUN for o in [op] * (config.nodes if op == "agent_upgrade" else 1)]
    assert [s.operation for s in report.steps] == expected, summary
    for step in report.steps:
        # The long jobs ran through every operation, none disturbed (report.ok).
        assert step.running_before >= config.long_jobs, summary
        if step.operation in ("head_restart", "head_pause"):
            assert step.leader_after == step.leader_before, summary  # no takeover
        if step.operation == "failover":
            assert step.leader_after != step.leader_before, summary
            assert step.timings["old_leader_back_as"] == "standby", summary
        if step.operation == "agent_upgrade":
            old, new = step.timings["agent_pids"]
            assert old != new and step.timings["runs_upgrade_argv"], summary
    # Short jobs started and ended during the operations too, and every job ended CD.
    during = [s for s in report.submissions if report.phases[s.seq] == "operations"]
    assert sum(s.job_id is not None for s in during) >= 5, summary
    assert set(report.audit.final_states) == {"CD"}, summary
    assert report.leftover_processes == 0, summary
    pids = [e["pid"] for p in tmp_path.glob("jobs/*/ledger.jsonl") for e in read_ledger(p)]
    assert not [p for p in set(pids) if pid_alive(p)], summary


def test_an_operations_config_that_cannot_work_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    one = ("head_restart",)
    for bad, words in [
        (OperationsConfig(operations=("reboot",)), "unknown"),
        (OperationsConfig(one, outage_s=15.0), "outage_s"),  # not past 3 × (lease + margin)
        (OperationsConfig(one, nodes=2), "at least 3"),
        (OperationsConfig(one, long_jobs=4), "long_jobs"),  # 3 + 3 of 6 GPUs: none left
    ]:
        with pytest.raises(ValueError, match=words):
            run_operations(tmp_path, bad)
    assert not any(tmp_path.iterdir())  # nothing was started


def test_none_killed_catches_a_restart_a_second_process_and_a_rank_that_did_not_end() -> None:
    head = {1: job_info(1, "a", "CD"), 2: job_info(2, "b", "CD")}
    clean = [life(1, 1, 0, 0, 1, end=0), life(1, 1, 1, 0, 1, end=0), life(2, 1, 0, 0, 1, end=0)]
    assert check_none_killed(clean, head, {1: 2, 2: 1}).ok

    restarted = {**head, 2: job_info(2, "b", "CD", epoch=2, restarts=1)}
    again = [*clean[:2], life(2, 1, 0, 0, 1), life(2, 2, 0, 2, 3, end=0)]
    verdict = check_none_killed(again, restarted, {1: 2, 2: 1})
    # The restart as the head tells it, as the ledger shows it (two epochs, rank 0 twice),
    # and the first run's process that never logged its end.
    assert verdict.count == 4, verdict.violations
    assert all(line.startswith("job 2 ") for line in verdict.violations)
    missing = check_none_killed(clean[:1] + clean[2:], head, {1: 2, 2: 1})
    assert missing.violations == ("job 1 rank 1 ran as 0 processes (not 1)",)
    failed = check_none_killed(clean, {**head, 1: job_info(1, "a", "F")}, {1: 2, 2: 1})
    assert failed.violations == ("job 1 ended F after 0 restart(s)",)


def test_disturbed_names_the_jobs_an_operation_restarted_or_whose_processes_died() -> None:
    before = {
        1: Running(1, frozenset({10, 11})),  # runs on
        2: Running(1, frozenset({20})),  # ended by itself meanwhile
        3: Running(1, frozenset({30})),  # requeued: a new epoch
        4: Running(1, frozenset({40})),  # its rank died
    }
    head = {
        1: job_info(1, "a", "R"),
        2: job_info(2, "b", "CD"),
        3: job_info(3, "c", "R", epoch=2, restarts=1),
        4: job_info(4, "d", "R"),
    }
    ended = [replace(life(2, 1, 0, 0, 1, end=0), pid=20), replace(life(4, 1, 0, 0, 1), pid=40)]

    found = disturbed(before, head, ended, alive=lambda pid: pid in {10, 11, 30})

    assert found == [
        "job 3: epoch 1 → 2, restart_count 1",
        "job 4: processes gone (pid 40: no end line)",
    ]
    assert disturbed(before, {}, [], alive=lambda pid: True)[0] == "job 1: unknown to the head"


def test_a_hurried_ledger_job_runs_its_remaining_steps_without_sleeping(tmp_path: Path) -> None:
    (tmp_path / "hurry").touch()
    env = {
        **os.environ,
        "LEDGER": str(tmp_path / "ledger.jsonl"),
        "PHALANX_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "PHALANX_JOB_ID": "5",
        "PHALANX_EPOCH": "1",
    }
    # 600 steps of 10 s: only a job that skips the sleeps ends before the timeout.
    argv = command(600, 10.0, "--hurry-file", str(tmp_path / "hurry"))
    done = subprocess.run(argv, env=env, timeout=60, capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    [run] = lives(read_ledger(tmp_path / "ledger.jsonl"))
    assert (run.begin_step, run.last_step, run.end_code) == (0, 600, 0)
