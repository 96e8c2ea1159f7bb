"""Chaos, short form: ledger jobs stream into 4 nodes while a seeded driver crashes nodes,
freezes agents, kills ranks, restarts the head and injects GPU faults; the fault-tolerance
invariants must hold (phalanx.testing.chaos; the long form is bench/chaos.py). The checkers
themselves are tested first, on hand-written ledgers, so that a pass means something."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from phalanx.testing.chaos import ChaosConfig, run_chaos
from phalanx.testing.invariants import (
    check_accounted,
    check_gpu_exclusive,
    check_never_twice,
    check_no_step_back,
)
from phalanx.testing.processes import pid_alive
from phalanx.testing.workload import Life, lives, read_ledger
from tests.e2e.helpers import job_info, life


def test_the_chaos_invariants_hold_under_random_failures(tmp_path: Path) -> None:
    # ~35 s of chaos, ≤ 25 s to settle (then what is left is cancelled), ~10 s to start
    # and stop on a busy 2-core machine: bounded well under 90 s by the config alone.
    config = ChaosConfig(seed=7, duration_s=35, settle_s=25, fault_every_s=2.5)

    report = run_chaos(tmp_path, config)

    summary = json.dumps(report.to_json(), indent=1, default=str)
    assert report.ok, summary
    assert sum(report.actions.values()) >= 5, summary  # the chaos really happened
    assert any(s.job_id is not None for s in report.submissions), summary
    assert report.runs > 0, summary
    # Every process the run started is gone (the ledgers name each job process).
    pids = [e["pid"] for p in tmp_path.glob("jobs/*/ledger.jsonl") for e in read_ledger(p)]
    assert not [p for p in set(pids) if pid_alive(p)], summary


def test_never_twice_catches_overlapping_epochs_and_duplicate_ranks() -> None:
    fine = [life(1, 1, 0, 0.0, 1.0), life(1, 2, 0, 1.5, 2.0), life(1, 2, 1, 1.6, 2.5)]
    assert check_never_twice(fine).ok

    # Epoch 1's rank 1 still wrote after epoch 2's rank 0 began: two live copies.
    overlap = [life(1, 1, 0, 0.0, 1.0), life(1, 1, 1, 0.0, 1.6), life(1, 2, 0, 1.5, 2.0)]
    verdict = check_never_twice(overlap)
    assert verdict.count == 1 and "epoch 1" in verdict.violations[0], verdict
    # Touching counts (no slack), and two processes of one rank in one epoch too.
    assert not check_never_twice([life(2, 1, 0, 0.0, 1.0), life(2, 2, 0, 1.0, 2.0)]).ok
    twins = [life(3, 1, 0, 0.0, 1.0), Life(3, 1, 0, 77, "n2", (0,), 0.5, 1.5, 0, 3, None)]
    assert not check_never_twice(twins).ok


def test_no_step_back_catches_a_resume_behind_the_checkpoint_and_an_unfinished_cd() -> None:
    runs = [life(1, 1, 0, 0.0, 1.0, begin=0, step=10), life(1, 2, 0, 2.0, 3.0, begin=10, step=20)]
    one_ahead = [life(1, 1, 0, 0.0, 1.0, step=10), life(1, 2, 0, 2.0, 3.0, begin=11, step=20)]
    assert check_no_step_back(runs, {}).ok
    assert check_no_step_back(one_ahead, {}).ok  # killed between checkpoint and ledger line

    behind = [life(1, 1, 0, 0.0, 1.0, step=10), life(1, 2, 0, 2.0, 3.0, begin=7, step=20)]
    verdict = check_no_step_back(behind, {})
    assert verdict.count == 1 and "began at step 7, behind step 10" in verdict.violations[0]
    ahead = [life(1, 1, 0, 0.0, 1.0, step=10), life(1, 2, 0, 2.0, 3.0, begin=14, step=20)]
    assert not check_no_step_back(ahead, {}).ok
    # CD with 2 ranks of 20 steps: rank 1 never logged its end in the final epoch.
    done = [life(1, 2, 0, 2.0, 3.0, begin=10, step=20, end=0), life(1, 2, 1, 2.0, 3.0, step=20)]
    assert check_no_step_back(done[:1], {1: (2, 1, 20)}).ok
    assert check_no_step_back(done, {1: (2, 2, 20)}).count == 1


def test_gpu_exclusive_catches_two_jobs_on_one_gpu() -> None:
    same_gpu = [life(1, 1, 0, 0.0, 2.0, gpus=(0, 1)), life(2, 1, 0, 1.0, 3.0, gpus=(1,))]
    verdict = check_gpu_exclusive(same_gpu)
    assert verdict.count == 1 and "GPU 1" in verdict.violations[0], verdict
    other_node = [life(1, 1, 0, 0.0, 2.0), life(2, 1, 0, 1.0, 3.0, node="n2")]
    one_job = [life(1, 1, 0, 0.0, 2.0), life(1, 1, 1, 0.0, 2.0)]  # ranks share the node's GPUs
    after = [life(1, 1, 0, 0.0, 2.0), life(2, 1, 0, 2.5, 3.0)]
    assert check_gpu_exclusive(other_node + one_job + after).ok


def test_accounted_catches_lost_duplicated_and_unfinished_jobs() -> None:
    info = job_info
    head = {1: info(1, "a", "CD"), 2: info(2, "b", "PD")}
    assert check_accounted([("a", 1), ("b", 2), ("c", None)], head, Counter("abc")).ok
    lost = check_accounted([("a", 1), ("b", 3)], head, Counter("ab"))
    assert lost.count == 1 and "does not know" in lost.violations[0]
    twice = check_accounted([("a", 1), ("c", None)], head, Counter("acc"))
    assert twice.count == 1 and "c exists 2 times" in twice.violations[0]
    running = check_accounted([("a", 1)], {1: info(1, "a", "R")}, Counter("a"))
    assert running.count == 1 and "still R" in running.violations[0]


def test_the_ledger_reader_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    line = {"event": "step", "job": 1, "epoch": 1, "rank": 0, "pid": 5, "node": "n1"}
    whole = json.dumps({**line, "gpus": "0,1", "step": 3, "t": 1.0})
    path.write_text(whole + "\n" + whole[:20] + "\n")

    [one] = lives(read_ledger(path))

    assert (one.gpus, one.last_step, one.begin_step) == ((0, 1), 3, None)


def test_a_config_that_cannot_work_is_refused_before_anything_starts(tmp_path: Path) -> None:
    for bad, words in [
        (ChaosConfig(nodes=1, min_healthy_nodes=1), "min_healthy_nodes"),
        (ChaosConfig(min_steps=10, max_steps=5), "min_steps"),
        (ChaosConfig(weights=(1.0,)), "weights"),
        (ChaosConfig(duration_s=0), "positive"),
    ]:
        with pytest.raises(ValueError, match=words):
            run_chaos(tmp_path, bad)
    assert not any(tmp_path.iterdir())  # no cluster was started
