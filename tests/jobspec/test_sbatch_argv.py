"""sbatch command lines read by the jobspec parser (the one `#SBATCH` lines use): getopt's
stop at the script, options the caller honours, srun's extra options, heterogeneous jobs
refused, flag clusters, `%J` in output patterns."""

from __future__ import annotations

import pytest

from phalanx.jobspec import (
    HETJOB_REFUSAL,
    JobSpecError,
    expand_pattern,
    parse_sbatch,
    parse_sbatch_argv,
    parse_sbatch_script,
)


def test_options_stop_at_the_script_and_the_rest_are_its_arguments() -> None:
    line = parse_sbatch_argv(["-N2", "--job-name", "x", "job.sh", "-N", "5", "--foo"])
    assert (line.opts.nodes, line.opts.job_name) == ("2", "x")
    assert line.arguments == ["job.sh", "-N", "5", "--foo"]
    assert line.unknown == [] and line.warnings == []


def test_stdin_dash_and_double_dash_end_the_options() -> None:
    assert parse_sbatch_argv(["-p", "a", "-"]).arguments == ["-"]
    assert parse_sbatch_argv(["-p", "a", "--", "-weird.sh"]).arguments == ["-weird.sh"]
    assert parse_sbatch_argv(["-p", "a"]).arguments == []


def test_handled_options_are_returned_not_warned_about() -> None:
    handled = frozenset({"parsable", "wrap", "hold", "wait"})
    line = parse_sbatch_argv(["--parsable", "--wrap=echo hi", "-HW", "--time=5"], handled)
    assert line.seen == {"parsable": None, "wrap": "echo hi", "hold": None, "wait": None}
    assert line.opts.time == "5" and line.warnings == []
    plain = parse_sbatch_argv(["--parsable", "job.sh"])
    assert plain.seen == {} and "--parsable is not supported" in plain.warnings[0]


def test_unknown_options_are_listed_apart_from_slurm_options_phalanx_lacks() -> None:
    line = parse_sbatch_argv(["--frobnicate", "-Z", "--mem-per-cpu=4G", "job.sh"])
    assert line.unknown == ["--frobnicate", "-Z"]
    assert any("--mem-per-cpu is not supported" in w for w in line.warnings)
    assert line.arguments == ["job.sh"]


def test_extra_options_replace_sbatch_ones_of_the_same_name() -> None:
    extra = [("label", "l", False), ("wait", "W", True)]
    line = parse_sbatch_argv(["-l", "-W", "30", "-N1", "hostname", "-l"], extra=extra)
    assert line.seen == {"label": None, "wait": "30"}
    assert line.arguments == ["hostname", "-l"] and line.opts.nodes == "1"


def test_a_handled_name_that_is_no_option_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not sbatch options"):
        parse_sbatch_argv([], frozenset({"no-such-option"}))


def test_heterogeneous_jobs_are_refused_with_the_reason() -> None:
    with pytest.raises(JobSpecError, match="heterogeneous jobs") as err:
        parse_sbatch_argv(["-N1", ":", "-N2", "job.sh"])
    assert str(err.value) == HETJOB_REFUSAL
    script = "#!/bin/sh\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -N2\necho\n"
    with pytest.raises(JobSpecError, match="line 3: heterogeneous jobs"):
        parse_sbatch(script)


def test_script_directives_report_handled_options_too() -> None:
    script = "#!/bin/sh\n#SBATCH --parsable --wckey=x -J n\nhostname\n"
    read = parse_sbatch_script(script, frozenset({"parsable", "wckey"}))
    assert read.seen == {"parsable": None, "wckey": "x"} and read.opts.job_name == "n"
    assert read.warnings == []


def test_percent_capital_j_is_the_job_id_outside_a_step() -> None:
    name = expand_pattern(
        "%J-%j-%5J.out",
        job_id=42,
        name="n",
        task=0,
        node="a",
        user="u",
        array_job_id=None,
        array_task_id=None,
    )
    assert name == "42-42-00042.out"
