"""`--begin` and `-w/--nodelist`: from flags, `#SBATCH` and YAML into the JobSpec."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from phalanx.jobspec import JobSpecError, SubmitOptions, build_spec, load_yaml, parse_sbatch
from phalanx.jobspec.begin import parse_begin

# A fixed local "now" (Wednesday 2026-11-25 10:30:00 local time) so each form is arithmetic.
NOW = datetime(2026, 11, 25, 10, 30, 0).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("now+90", NOW + 90),
        ("now+10minutes", NOW + 600),
        ("now+2h", NOW + 7200),
        ("now+1day", NOW + 86400),
        ("NOW+1W", NOW + 7 * 86400),
        ("16:00", datetime(2026, 11, 25, 16, 0).timestamp()),
        ("09:15:30", datetime(2026, 11, 26, 9, 15, 30).timestamp()),  # passed: tomorrow
        ("2026-12-01", datetime(2026, 12, 1).timestamp()),
        ("2026-12-01T08:05", datetime(2026, 12, 1, 8, 5).timestamp()),
        ("2026-12-01T08:05:09", datetime(2026, 12, 1, 8, 5, 9).timestamp()),
        ("midnight", datetime(2026, 11, 26).timestamp()),
        ("noon", datetime(2026, 11, 25, 12).timestamp()),
        ("teatime", datetime(2026, 11, 25, 16).timestamp()),
        ("today", datetime(2026, 11, 25).timestamp()),
        ("tomorrow", datetime(2026, 11, 26).timestamp()),
    ],
)
def test_begin_forms(text: str, expected: float) -> None:
    assert parse_begin(text, NOW) == expected


@pytest.mark.parametrize("text", ["soon", "now+3fortnights", "25:00", "2026-02-30", "", "now-5"])
def test_a_bad_begin_is_one_clear_error(text: str) -> None:
    with pytest.raises(JobSpecError, match=r"^--begin=.*: not a time; use now\+N"):
        parse_begin(text, NOW)


def _build(**options: Any) -> tuple[list[str], int, float | None]:
    spec, _ = build_spec(
        SubmitOptions(**options), command=["run"], script=None, cwd="/w", environ={}
    )
    return spec.nodelist, spec.nodes, spec.begin_time


def test_a_nodelist_is_expanded_and_sets_the_node_count_as_sbatch() -> None:
    assert _build(nodelist="n[1-3]")[:2] == (["n1", "n2", "n3"], 3)
    assert _build(nodelist="n[1-3]", nodes="2")[:2] == (["n1", "n2", "n3"], 2)
    assert _build(nodelist="gpu7")[:2] == (["gpu7"], 1)


def test_a_bad_nodelist_is_refused() -> None:
    with pytest.raises(JobSpecError):
        _build(nodelist="n[3-1]")


def test_begin_lands_in_the_spec() -> None:
    before = datetime.now().timestamp()
    begin = _build(begin="now+1h")[2]
    assert begin is not None and before + 3600 <= begin <= datetime.now().timestamp() + 3600


def test_sbatch_directives_are_honoured_not_warned() -> None:
    opts, warnings = parse_sbatch("#!/bin/bash\n#SBATCH -w n[1-2]\n#SBATCH --begin=now+60\nrun\n")
    assert (opts.nodelist, opts.begin, warnings) == ("n[1-2]", "now+60", [])


def test_yaml_keys() -> None:
    spec, _ = load_yaml(
        "command: run\nnodelist: [n1, n2]\nbegin: '2030-01-01'\n", cwd="/w", environ={}
    )
    assert (spec.nodelist, spec.nodes) == (["n1", "n2"], 2)
    assert spec.begin_time == datetime(2030, 1, 1).timestamp()
