"""Slurm time limits, durations in seconds and memory sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.jobspec import JobSpecError, parse_duration, parse_mem, parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),  # minutes
        ("5:30", 5 * 60 + 30),  # minutes:seconds
        ("1:00:00", 3600),  # hours:minutes:seconds
        ("2:03:04", 2 * 3600 + 3 * 60 + 4),
        ("1-0", 86400),  # days-hours
        ("1-12", 86400 + 12 * 3600),
        ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # days-hours:minutes
        ("1-00:00:00", 86400),  # days-hours:minutes:seconds
        ("0-00:00:30", 30),
        ("0:90", 90),  # fields are not range-checked, as in Slurm
        ("  45 ", 45 * 60),
        ("UNLIMITED", None),
        ("infinite", None),
        ("-1", None),  # Slurm's own spelling of "no limit"
        ("0", None),  # Slurm: a zero limit means no limit (never time_limit_s=0)
        ("00:00:00", None),
    ],
)
def test_time_forms(text: str, seconds: int | None) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        *("", "  ", "-5", "9" * 5000, "1:2:3:4", "1-2-3", "abc", "1h", "1.5"),
        *("1:", ":30", "1-", "-1-0", "1 0"),
    ],
)
def test_time_rejections_name_the_value_and_the_forms(text: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_time(text)
    message = str(err.value)
    assert "time limit" in message
    assert "hours:minutes:seconds" in message


@given(
    days=st.integers(0, 400),
    hours=st.integers(0, 23),
    minutes=st.integers(0, 59),
    seconds=st.integers(0, 59),
)
def test_time_forms_match_arithmetic(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    assert parse_time(f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}") == (total or None)
    assert parse_time(f"{days * 24 + hours}:{minutes}:{seconds}") == (total or None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),  # a bare number is seconds here (minutes for -t)
        (" 0 ", 0),  # zero is kept: for --hang-timeout it means "off"
        ("0:00:00", 0),
        ("1:30", 90),  # minutes:seconds, as -t
        ("1:00:00", 3600),
        ("1-0", 86400),
        ("0-00:02", 120),  # days-hours:minutes
        ("0-00:00:45", 45),
        ("86400", 86400),  # the maximum is allowed
    ],
)
def test_duration_forms(text: str, seconds: int) -> None:
    assert parse_duration("--grace", text, maximum=86400) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        *((bad, "invalid duration; use seconds, minutes:seconds") for bad in ("", "-1", "1h")),
        *((bad, "invalid duration") for bad in ("1.5", "UNLIMITED", "9" * 50, "1:2:3:4")),
        ("86401", "at most 86400 seconds (86401 given)"),
        ("1-00:00:01", "at most 86400 seconds (86401 given)"),
    ],
)
def test_duration_rejections_name_the_option_and_the_value(text: str, message: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_duration("--grace", text, maximum=86400)
    assert str(err.value).startswith(f"--grace={text}: {message}")


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("4096", 4096),
        ("4096M", 4096),
        ("4G", 4096),
        ("4g", 4096),
        ("4GB", 4096),
        ("1T", 1024 * 1024),
        ("512K", 1),  # rounded up to a whole MB
        ("1025K", 2),
        ("0", 0),
    ],
)
def test_mem_forms(text: str, mb: int) -> None:
    assert parse_mem(text) == mb


@pytest.mark.parametrize("text", ["", "G", "9" * 5000, "-4G", "1.5G", "4X", "4 G B", "four"])
def test_mem_rejections(text: str) -> None:
    with pytest.raises(JobSpecError, match=r"invalid memory size .*K, M, G or T"):
        parse_mem(text)
