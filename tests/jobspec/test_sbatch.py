"""Reading #SBATCH directives, from realistic training scripts and from edge cases."""

from __future__ import annotations

import pytest

from phalanx.api.models import ArraySpec, SignalSpec
from phalanx.jobspec import JobSpecError, SubmitOptions, build_spec, parse_sbatch
from tests.jobspec.scripts import ACCELERATE, NANOTRON, TITAN

ENV = {"HOME": "/home/ada", "PATH": "/usr/bin", "SLURM_JOB_ID": "7", "HF_TOKEN": "hf_x"}


def test_torchtitan_shaped_script() -> None:
    opts, warnings = parse_sbatch(TITAN)
    assert opts == SubmitOptions(
        job_name="titan-8b",
        ntasks="2",
        nodes="2",
        gpus_per_task="8",
        cpus_per_task="96",
        partition="train",
        mail_type="END,FAIL",
    )
    assert warnings == []
    spec, more = build_spec(opts, command=None, script=TITAN, cwd="/home/ada", environ=ENV)
    # Read, and said to go nowhere: no --mail-user URL or --notify-url to post to.
    assert "--mail-type=END,FAIL: no --notify-url (or --mail-user URL) to post to; ignored" in more
    assert spec.notify_url is None and spec.notify_on is None
    assert (spec.name, spec.launcher, spec.nodes) == ("titan-8b", "batch", 2)
    assert (spec.ntasks_per_node, spec.gpus_per_node, spec.cpus_per_task) == (1, 8, 96)
    assert spec.team == "train"
    assert spec.script == TITAN
    assert spec.workdir == "/home/ada"


def test_accelerate_shaped_script() -> None:
    opts, warnings = parse_sbatch(ACCELERATE)
    assert warnings == ["line 12: --hint is not supported by Phalanx; ignored"]
    spec, _ = build_spec(opts, command=None, script=ACCELERATE, cwd="/home/ada", environ=ENV)
    assert spec.name == "accel-nlp"
    assert spec.workdir == "/home/ada/runs/accel"  # -D relative to the submit directory
    assert (spec.output, spec.error) == ("logs/%x-%j.out", "logs/%x-%j.err")
    assert (spec.nodes, spec.ntasks_per_node, spec.gpus_per_node) == (4, 1, 4)
    assert spec.cpus_per_task == 160
    assert spec.exclusive is True
    assert spec.time_limit_s == 4 * 3600
    assert spec.gpu_model is None


def test_nanotron_shaped_script() -> None:
    opts, warnings = parse_sbatch(NANOTRON)
    assert warnings == [
        "line 14: --mem-per-cpu is not supported by Phalanx; ignored",
        "line 15: --open-mode is not supported by Phalanx; ignored",
    ]
    spec, _ = build_spec(opts, command=None, script=NANOTRON, cwd="/fsx/ada", environ=ENV)
    assert spec.time_limit_s == 2 * 86400
    assert spec.qos == "high"
    assert (spec.nodes, spec.ntasks_per_node, spec.gpus_per_node) == (8, 1, 8)
    assert spec.mem_mb == 512 * 1024
    assert spec.exclusive is True
    assert spec.array == ArraySpec(indices=[1, 2, 3, 4], max_parallel=1)
    assert spec.requeue is True
    assert spec.signal == SignalSpec(signal="SIGUSR1", seconds_before=120, batch_only=True)
    assert spec.output == "/fsx/logs/%x-%A_%a.out"
    assert "HF_TOKEN" not in spec.env and "SLURM_JOB_ID" not in spec.env
    assert spec.env["HOME"] == "/home/ada"


@pytest.mark.parametrize(
    ("directive", "field", "value"),
    [
        ("-J name", "job_name", "name"),
        ("-Jname", "job_name", "name"),
        ("--job-name name", "job_name", "name"),
        ('--job-name="two words"', "job_name", "two words"),
        ("-N 2", "nodes", "2"),
        ("-N2", "nodes", "2"),
        ("-n 16", "ntasks", "16"),
        ("-t 1:00:00", "time", "1:00:00"),
        ("-p gpu", "partition", "gpu"),
        ("-A proj", "account", "proj"),
        ("-q high", "qos", "high"),
        ("-o out-%j.log", "output", "out-%j.log"),
        ("-e err-%j.log", "error", "err-%j.log"),
        ("-c 8", "cpus_per_task", "8"),
        ("-D /scratch", "workdir", "/scratch"),
        ("--chdir=/scratch", "workdir", "/scratch"),
        ("-x node[1-2]", "exclude", "node[1-2]"),
        ("-G h100:8", "gpus", "h100:8"),
        ("-d afterok:4", "dependency", "afterok:4"),
        ("-a 0-3", "array", "0-3"),
        ("-C h100", "constraint", "h100"),
        ("--part=train", "partition", "train"),  # getopt_long takes unique prefixes
        ("--requeue", "requeue", True),
        ("--no-requeue", "requeue", False),
        ("--exclusive", "exclusive", True),
        ("-s", "exclusive", False),
        ("--export=ALL,FOO=bar", "export", "ALL,FOO=bar"),
        ("--launcher node", "launcher", "node"),
        ("--max-restarts=5", "max_restarts", "5"),
        ("--restart-on-failure", "restart_on_failure", True),
        ("--no-restart-on-failure", "restart_on_failure", False),
        ("--checkpoint-dir=ckpt/run", "checkpoint_dir", "ckpt/run"),
        ("--checkpoint-dir '/my ckpt'", "checkpoint_dir", "/my ckpt"),
        ("--preempt-signal USR2", "preempt_signal", "USR2"),
        ("--preempt-grace=2:00", "preempt_grace", "2:00"),
        ("--hang-timeout 0", "hang_timeout", "0"),
        ("--hang=600", "hang_timeout", "600"),  # a unique prefix, as for Slurm's options
    ],
)
def test_directive_forms(directive: str, field: str, value: object) -> None:
    opts, warnings = parse_sbatch(f"#!/bin/sh\n#SBATCH {directive}\nrun\n")
    assert getattr(opts, field) == value
    assert warnings == []


def test_several_options_per_line_and_later_directive_wins() -> None:
    opts, warnings = parse_sbatch(
        "#SBATCH -N 2 --time=10 -J first  # a comment\n#SBATCH -J second\nrun\n"
    )
    assert (opts.nodes, opts.time, opts.job_name) == ("2", "10", "second")
    assert warnings == []


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("#SBATCH --job-name=a#b", "a#b"),  # '#' inside a word is not a comment
        ('#SBATCH -J "x # y" # the name', "x # y"),
        ("#SBATCH -J 'q#' #c", "q#"),
        ("#SBATCH -J a\\ #b", "a #b"),  # an escaped blank does not start a word
    ],
)
def test_comments_are_cut_as_the_shell_does(line: str, name: str) -> None:
    opts, warnings = parse_sbatch(f"{line}\nrun\n")
    assert (opts.job_name, warnings) == (name, [])


def test_reading_stops_at_first_command_and_warns_about_later_directives() -> None:
    script = "#!/bin/bash\n\n# setup\n#SBATCH -N 2\necho hi\n#SBATCH -N 4\n"
    opts, warnings = parse_sbatch(script)
    assert opts.nodes == "2"
    assert warnings == [
        "line 6: #SBATCH after the first command is ignored (as sbatch does); move it to "
        "the top of the script"
    ]


@pytest.mark.parametrize(
    ("line", "warning"),
    [
        ("#SBATCH --mem-per-gpu=40G", "line 2: --mem-per-gpu is not supported"),
        ("#SBATCH --hint nomultithread", "line 2: --hint is not supported"),
        ("#SBATCH -F hosts.txt", "line 2: -F/--nodefile is not supported"),
        ("#SBATCH --frobnicate=3", "line 2: unknown option --frobnicate; ignored"),
        ("#SBATCH --nodez=3", "line 2: unknown option --nodez (did you mean --nodes?); ignored"),
        ("#SBATCH --frobnicate 3", "line 2: unknown option --frobnicate 3"),
        ("#SBATCH -Z", "line 2: unknown option -Z"),
        ("#SBATCH stray", "line 2: unexpected argument 'stray'"),
        ("#SBATCH --exclusive=user", "line 2: --exclusive=user is not supported"),
        (
            "#SBATCH --restart-on-failure=yes",
            "line 2: --restart-on-failure=yes is not supported (only a plain",
        ),
        ("   #SBATCH -N 2", "line 2: an indented #SBATCH is only a comment"),
    ],
)
def test_unused_directives_are_named_with_their_line(line: str, warning: str) -> None:
    opts, warnings = parse_sbatch(f"#!/bin/bash\n{line}\nrun\n")
    assert len(warnings) == 1
    assert warnings[0].startswith(warning)
    assert opts == SubmitOptions()


def test_unknown_option_value_is_not_read_as_an_option() -> None:
    opts, warnings = parse_sbatch("#SBATCH --reservation now -N 3\nrun\n")
    assert opts.nodes == "3"
    assert warnings == ["line 1: --reservation is not supported by Phalanx; ignored"]


def test_commented_out_directive_is_silent() -> None:
    opts, warnings = parse_sbatch("#!/bin/bash\n# SBATCH -N 9\n##SBATCH -N 8\nrun\n")
    assert opts == SubmitOptions()
    assert warnings == []


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("#SBATCH --time\nrun\n", "line 1: --time needs a value"),
        ("#!/bin/sh\n#SBATCH -J\n", "line 2: -J/--job-name needs a value"),
        ("#SBATCH --preempt-grace\nrun\n", "line 1: --preempt-grace needs a value"),
        ('#SBATCH --job-name="open\n', "line 1: cannot read #SBATCH line"),
    ],
)
def test_unreadable_directives(script: str, message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        parse_sbatch(script)
