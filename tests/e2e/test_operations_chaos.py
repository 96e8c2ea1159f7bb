"""Routine operations, short form: with ledger jobs running on a PostgreSQL cluster with a
standby head, the head is killed and restarted, frozen, and taken over by the standby, and
the agents are upgraded one by one; no job may be killed, and the chaos invariants hold
(phalanx.testing.operations; the long form is `bench/chaos.py --operations`). The checkers
that tell a killed job are tested first, on hand-written inputs, so that a pass means
something."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

from phalanx.testing.continuity import Running, disturbed
from phalanx.testing.invariants import check_none_killed
from phalanx.testing.workload import command, lives, read_ledger
from tests.e2e.helpers import job_info, life


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
