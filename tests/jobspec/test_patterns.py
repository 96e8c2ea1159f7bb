"""Slurm filename patterns for --output and --error."""

from __future__ import annotations

import pytest

from phalanx.jobspec import expand_pattern


def _plain(
    pattern: str,
    *,
    job_id: int = 42,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
) -> str:
    return expand_pattern(
        pattern,
        job_id=job_id,
        name="train",
        task=3,
        node="127.0.0.2",
        user="ada",
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        node_id=1,
    )


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("%x-%j.out", "train-42.out"),
        ("slurm-%j.out", "slurm-42.out"),
        ("%5j", "00042"),
        ("%12j", "0000000042"),  # padding is capped at 10, as in Slurm
        ("rank%t-%2t", "rank3-03"),
        ("%N.log", "127.0.0.2.log"),
        ("%3N", "127.0.0.2"),  # padding is ignored for text
        ("node%n", "node1"),
        ("%u/%x", "ada/train"),
        ("100%%", "100%"),
        ("%%j", "%j"),
        ("%A_%a", "42_4294967294"),  # outside an array: the job id, and Slurm's NO_VAL
        ("%q%", "%q%"),  # unknown sequences are left alone
        ("logs\\%j.out", "logs%j.out"),  # a backslash turns expansion off
    ],
)
def test_patterns(pattern: str, expected: str) -> None:
    assert _plain(pattern) == expected


def test_array_patterns() -> None:
    out = _plain("%A_%a-%3a.%j", job_id=57, array_job_id=50, array_task_id=7)
    assert out == "50_7-007.57"
