"""srun's option parsing and task layout, and scontrol, in process (no agents needed)."""

from __future__ import annotations

import pytest

from phalanx.agent.slurm_cmds import scontrol_main, srun_main
from phalanx.agent.stepplan import JobContext, SrunError, parse_srun, plan_step

JOB = JobContext(
    job_id=7,
    nodes=["n1", "n2", "n3"],
    agent_urls=["http://a1", "http://a2", "http://a3"],
    step_token="t",
    ntasks=6,
    job_dir=None,
)


def layout(argv: list[str], job: JobContext = JOB) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """(node, [(task, local, node_id)…]) per node of the planned step."""
    plan = plan_step(parse_srun(argv), job, {"HOME": "/h"})
    return [(n.node, [(t.task_id, t.local_id, t.node_id) for t in n.tasks]) for n in plan]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (  # default: $SLURM_NTASKS over all nodes, block
            ["hostname"],
            [
                ("n1", [(0, 0, 0), (1, 1, 0)]),
                ("n2", [(2, 0, 1), (3, 1, 1)]),
                ("n3", [(4, 0, 2), (5, 1, 2)]),
            ],
        ),
        (["-N", "2", "hostname"], [("n1", [(0, 0, 0)]), ("n2", [(1, 0, 1)])]),
        (
            ["-n", "5", "-N2", "x"],
            [("n1", [(0, 0, 0), (1, 1, 0), (2, 2, 0)]), ("n2", [(3, 0, 1), (4, 1, 1)])],
        ),
        (["-n", "1", "x"], [("n1", [(0, 0, 0)])]),
        (["-w", "n[3,2]", "x"], [("n2", [(0, 0, 0)]), ("n3", [(1, 0, 1)])]),
        (["--ntasks-per-node=2", "-w", "n3", "x"], [("n3", [(0, 0, 0), (1, 1, 0)])]),
        (
            ["-n", "3", "--ntasks-per-node", "2", "-N", "2", "x"],
            [("n1", [(0, 0, 0), (1, 1, 0)]), ("n2", [(2, 0, 1)])],
        ),
    ],
)
def test_layout(argv: list[str], expected: list[tuple[str, list[tuple[int, int, int]]]]) -> None:
    assert layout(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-N", "4", "x"], "only 3 node(s)"),
        (["-w", "n9", "x"], "n9 not in this job's allocation"),
        (["-n", "1", "-N", "2", "x"], "cannot spread"),
        (["-n", "5", "--ntasks-per-node", "1", "x"], "do not fit"),
        (["-N", "2"], "no command given"),
        (["--kill-on-bad-exit=yes", "x"], "expected 0 or 1"),
    ],
)
def test_layout_errors(argv: list[str], message: str) -> None:
    with pytest.raises(SrunError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout(argv)


def test_parse_keeps_the_command_whole() -> None:
    opts = parse_srun(["-l", "-K", "--mpi=pmix", "--", "bash", "-c", "echo -N $X", "-l"])
    assert opts.command == ["bash", "-c", "echo -N $X", "-l"]
    assert (opts.label, opts.kill_on_bad_exit, opts.ignored) == (True, True, ("--mpi",))
    assert parse_srun(["--kill-on-bad-exit=0", "x"]).kill_on_bad_exit is False


def test_export_and_step_variables() -> None:
    environ = {"HOME": "/h", "SECRETISH": "s", "SLURM_JOB_ID": "7", "PHALANX_STEP_TOKEN": "t"}
    [node] = plan_step(parse_srun(["--export=NONE,", "-n", "1", "-c", "4", "x"]), JOB, environ)
    env = node.tasks[0].env
    assert env == {
        "SLURM_JOB_ID": "7",
        "PHALANX_STEP_TOKEN": "t",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_CPUS_PER_TASK": "4",
    }
    [node] = plan_step(parse_srun(["--export=HOME,A=1", "-n", "1", "x"]), JOB, environ)
    assert {k: node.tasks[0].env.get(k) for k in ("HOME", "A", "SECRETISH")} == {
        "HOME": "/h",
        "A": "1",
        "SECRETISH": None,
    }
    [node] = plan_step(parse_srun(["-n", "1", "x"]), JOB, environ)  # default: ALL
    assert node.tasks[0].env["SECRETISH"] == "s"


def test_srun_outside_a_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("PHALANX_STEP_TOKEN", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "PHALANX_AGENT_URLS"):
        monkeypatch.delenv(key, raising=False)
    assert srun_main(["true"]) == 1
    assert "srun: error: not inside a Phalanx job" in capsys.readouterr().err


def test_scontrol(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert scontrol_main(["show", "hostnames"]) == 0
    assert capsys.readouterr().out == "n1\nn2\n"
    assert scontrol_main(["show", "job", "7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("JobId=7 JobName=train")
    assert "NodeList=n[1-2]" in out
    # Other jobs and other subcommands go to the submit-side scontrol (a new program:
    # tested through real jobs in tests/slurmcli/test_scontrol.py).
    assert scontrol_main(["show", "hostnames", "n[1-"]) == 1
    assert "scontrol: error:" in capsys.readouterr().err
