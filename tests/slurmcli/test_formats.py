"""The pure parts of squeue/sacct/sinfo: Slurm's time forms, state words, array ids, `%`
formats and sacct's field matching, against what Slurm 22.05's sources and man pages say."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from phalanx.slurmcli import sacct
from phalanx.slurmcli.fields import (
    FormatError,
    Job,
    collapse_arrays,
    parse_states,
    ranges,
    sacct_secs,
    squeue_secs,
)
from phalanx.slurmcli.formats import Spec, parse_format
from phalanx.slurmcli.slurmtime import parse_time

NOW = datetime(2026, 3, 10, 14, 30, 15).timestamp()  # a Tuesday, local time


def at(*parts: int) -> float:
    return datetime(*parts).timestamp()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("now-2days", NOW - 2 * 86400),
        ("now+90", NOW + 90),
        ("NOW-3hours", NOW - 3 * 3600),
        ("now-1weeks", NOW - 7 * 86400),
        ("today", at(2026, 3, 10)),
        ("midnight", at(2026, 3, 10)),
        ("noon", at(2026, 3, 10, 12)),
        ("teatime", at(2026, 3, 9, 16)),  # 16:00 is still to come: yesterday's
        ("09:15", at(2026, 3, 10, 9, 15)),
        ("15:00:01", at(2026, 3, 9, 15, 0, 1)),
        ("3:00pm", at(2026, 3, 9, 15)),
        ("1:05am", at(2026, 3, 10, 1, 5)),
        ("2026-03-01", at(2026, 3, 1)),
        ("2026-03-01T08:00", at(2026, 3, 1, 8)),
        ("2026-03-01T08:00:30", at(2026, 3, 1, 8, 0, 30)),
        ("1970-01-01-00:00:01", at(1970, 1, 1, 0, 0, 1)),  # TorchX's `sacct -S…`
        ("0301", at(2026, 3, 1)),
        ("030125", at(2025, 3, 1)),
        ("12/24", at(2025, 12, 24)),  # not yet this year: last year's
        ("03/01/26-10:00", at(2026, 3, 1, 10)),
        ("03.01-10:00:05", at(2026, 3, 1, 10, 0, 5)),
        ("1773100000", 1773100000.0),
    ],
)
def test_slurm_time_forms(text: str, expected: float) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterdayish", "now-2fortnights", "2026-02-30", "25:00", "13:00pm", "1/2/3/4"]
)
def test_bad_times_are_refused(text: str) -> None:
    with pytest.raises(FormatError, match="Invalid time specification"):
        parse_time(text, NOW)


def test_states_take_words_codes_any_case_and_all() -> None:
    assert parse_states("pd,RUNNING,Completed") == {"PD", "R", "CD"}
    assert parse_states("OUT_OF_MEMORY,nf,PREEMPTED,to,ca,f,cg") == {
        "OOM", "NF", "PR", "TO", "CA", "F", "CG",
    }  # fmt: skip
    assert parse_states("all") is None
    assert parse_states("SUSPENDED,RQ") == set()  # Slurm's, never a Phalanx job's
    with pytest.raises(FormatError, match="Invalid job state specified: bogus"):
        parse_states("R,bogus")
    with pytest.raises(FormatError):
        parse_states("all", allow_all=False)


def wire(job_id: int, state: str = "PD", **fields: Any) -> dict[str, Any]:
    return {
        "id": job_id, "name": "j", "user": "u", "team": "t", "state": state, "nodes": 1,
        "gpus_per_node": 1, "submit_time": NOW, **fields,
    }  # fmt: skip


def test_job_words_ids_and_exit_codes() -> None:
    oom = Job.from_wire(wire(5, "OOM", reason="oom", exit_code="0:9", end_time=NOW))
    assert (oom.word, oom.slurm_reason(), oom.exit_pair) == ("OUT_OF_MEMORY", "OutOfMemory", (0, 9))
    nf = Job.from_wire(wire(6, "NF", reason="node_fail"))
    assert (nf.word, nf.slurm_reason(), nf.job_id) == ("NODE_FAIL", "NodeDown", "6")
    task = Job.from_wire(wire(9, "R", array_job_id=7, array_task_id=2, start_time=NOW - 65))
    assert (task.job_id, task.word, task.elapsed(NOW)) == ("7_2", "RUNNING", 65)


def test_pending_array_tasks_collapse_as_slurmctld_shows_them() -> None:
    tasks = [
        wire(7, "R", array_job_id=7, array_task_id=1, start_time=NOW),
        *(wire(7 + i, array_job_id=7, array_task_id=1 + i) for i in (1, 2, 3, 5)),
        wire(20, array_job_id=7, array_task_id=9, restart_count=1),  # requeued: on its own
        wire(21, array_job_id=7, array_task_id=10, hold="user"),  # held: on its own
        wire(30),
    ]
    jobs = collapse_arrays([Job.from_wire({**t, "array_max_parallel": 2}) for t in tasks])
    assert [j.job_id for j in jobs] == ["7_1", "7_[2-4,6%2]", "7_9", "7_10", "30"]
    assert jobs[1].task_string == "2-4,6%2" and jobs[1].id == 8
    assert ranges([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10"


def test_time_forms_of_squeue_and_sacct() -> None:
    assert [squeue_secs(s) for s in (0, 59, 61, 3600, 86399, 90061, None)] == [
        "0:00", "0:59", "1:01", "1:00:00", "23:59:59", "1-01:01:01", "UNLIMITED",
    ]  # fmt: skip
    assert squeue_secs(366 * 86400) == "INVALID"
    assert [sacct_secs(s) for s in (0, 61, 90061, None)] == [
        "00:00:00", "00:01:01", "1-01:01:01", "UNLIMITED",
    ]  # fmt: skip


def test_percent_formats_parse_as_slurms() -> None:
    assert parse_format("id=%.18i|%-5j %10Rend%") == [
        Spec("", 0, False, "id="),
        Spec("i", 18, True, "|"),
        Spec("-", 0, False, "5j "),  # Slurm has no `-`: an invalid field `-`
        Spec("R", 10, False, "end"),
    ]


def test_sacct_fields_match_by_prefix_with_widths() -> None:
    cols = sacct._columns("jobid,JobName%30,state%-8,alloctres,end,elapsedr")
    assert [(c.name, c.width) for c in cols] == [
        ("JobID", -12), ("JobName", 30), ("State", -8), ("AllocTRES", 10), ("End", 19),
        ("ElapsedRaw", 10),
    ]  # fmt: skip
    assert len(sacct._columns("ALL")) == len(sacct.FIELDS)
    with pytest.raises(FormatError, match='Invalid field requested: "Nope"'):
        sacct._columns("JobID,Nope")
    # A field Phalanx has no data for prints blank, as Slurm does for what it lacks.
    maxrss = sacct._columns("MaxRSS")[0]
    assert maxrss.value is None and maxrss.name == "MaxRSS"


def test_dates_are_local_iso_without_zone() -> None:
    stamp = at(2026, 3, 1, 8, 5, 9)
    job = Job.from_wire(wire(1, "CD", start_time=stamp, end_time=stamp + 1, exit_code="0:0"))
    start = next(f for f in sacct.FIELDS if f.name == "Start")
    assert start.value is not None and start.value(job, time.time()) == "2026-03-01T08:05:09"


def test_cancelled_by_a_user_or_by_the_head() -> None:
    state = next(f for f in sacct.FIELDS if f.name == "State").value
    assert state is not None
    by_head = Job.from_wire(wire(3, "CA", cancelled_by="the idle-GPU policy: idle 2 h"))
    assert state(by_head, NOW) == "CANCELLED by 0"
    nobody = "no-such-account-here"
    assert state(Job.from_wire(wire(4, "CA", cancelled_by=nobody)), NOW) == f"CANCELLED by {nobody}"
    assert state(Job.from_wire(wire(5, "CA")), NOW) == "CANCELLED"
