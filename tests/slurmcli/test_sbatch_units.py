"""The pure parts of the submit-side commands, without a cluster: getopt's reading and
errors, script arguments, exit statuses, Slurm's layouts of times, TRES and node states."""

from __future__ import annotations

import pytest

from phalanx.api.models import GpuInfo, JobInfo, NodeInfo
from phalanx.slurmcli.getopts import Opt, UsageError, parse
from phalanx.slurmcli.scontrol_show import duration, gres, node_state, tres
from phalanx.slurmcli.submitting import ScriptError, exit_status, with_arguments

OPTS = [Opt("signal", "s", True), Opt("batch", "b"), Opt("full", "f"), Opt("name", "n", True)]


def test_getopt_forms_and_permutation() -> None:
    got = parse("scancel", ["12", "--signal", "TERM", "-bfnjob", "--na=x", "13", "--", "-1"], OPTS)
    assert got.arguments == ["12", "13", "-1"]
    assert got.last("signal") == "TERM" and got.has("batch") and got.has("full")
    assert got.all("name") == ["job", "x"]
    first = parse("srun", ["-n", "x", "cmd", "-s", "y"], OPTS, permute=False)
    assert first.arguments == ["cmd", "-s", "y"] and first.values == {"name": ["x"]}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--frob"], "scancel: unrecognized option '--frob'"),
        (["-z"], "scancel: invalid option -- 'z'"),
        (["--signal"], "scancel: option '--signal' requires an argument"),
        (["-s"], "scancel: option requires an argument -- 's'"),
        (["--batch=1"], "scancel: option '--batch' doesn't allow an argument"),
        (["--"], None),
    ],
)
def test_getopt_errors_are_getopts_lines(argv: list[str], said: str | None) -> None:
    if said is None:
        assert parse("scancel", argv, OPTS).arguments == []
        return
    with pytest.raises(UsageError) as err:
        parse("scancel", argv, OPTS)
    assert str(err.value) == f'{said}\nTry "scancel --help" for more information'


def test_ambiguous_prefixes_are_refused() -> None:
    with pytest.raises(UsageError, match="ambiguous option '--f'"):
        parse("x", ["--f"], [Opt("full"), Opt("force")])


def test_script_arguments_go_after_the_sbatch_header_of_shell_scripts() -> None:
    script = "#!/usr/bin/env bash\n#SBATCH -N1\n\n# note\necho $1\n"
    assert with_arguments(script, ["a b", "c"]) == (
        "#!/usr/bin/env bash\n#SBATCH -N1\n\n# note\nset -- 'a b' c\necho $1\n"
    )
    assert with_arguments(script, []) == script
    with pytest.raises(ScriptError, match="need a shell script"):
        with_arguments("#!/usr/bin/python3\nprint(1)\n", ["x"])


def _job(state: str, exit_code: str | None) -> JobInfo:
    return JobInfo.model_validate(
        {
            "id": 1, "name": "j", "user": "u", "team": "t", "account": None, "qos": "normal",
            "priority": 1, "state": state, "reason": None, "reason_message": None, "nodes": 1,
            "gpus_per_node": 1, "launcher": "batch", "time_limit_s": None, "submit_time": 0.0,
            "start_time": None, "end_time": None, "exit_code": exit_code, "restart_count": 0,
            "epoch": 1, "array_job_id": None, "array_task_id": None, "placement": [],
            "workdir": "/w",
        }
    )  # fmt: skip


def test_exit_status_as_a_shell_reports_it() -> None:
    assert exit_status(_job("CD", "0:0")) == 0
    assert exit_status(_job("F", "3:0")) == 3
    assert exit_status(_job("CA", "0:15")) == 143
    assert exit_status(_job("CA", None)) == 1
    assert exit_status(_job("NF", "0:0")) == 1


def test_slurm_layouts_of_times_tres_and_nodes() -> None:
    assert [duration(s) for s in (None, 0, 59, 3661, 90061)] == [
        "UNLIMITED",
        "00:00:00",
        "00:00:59",
        "01:01:01",
        "1-01:01:01",
    ]
    assert tres(4, 8192, 2, 4) == "cpu=4,mem=8G,node=2,billing=4,gres/gpu=4"
    assert tres(1, 1000, 1, 1) == "cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1"

    def node(state: str, used: int, jobs: list[int]) -> NodeInfo:
        gpus = [GpuInfo(index=i, uuid=f"u{i}", model="NVIDIA H100", memory_mb=1) for i in range(2)]
        return NodeInfo.model_validate(
            {
                "name": "n1", "address": "a", "agent_url": "http://a", "state": state,
                "reason": None, "cpus": 2, "memory_mb": 1, "gpus": gpus, "gpus_used": used,
                "labels": {}, "last_heartbeat": None, "heartbeat_age_s": None, "jobs": jobs,
            }
        )  # fmt: skip

    assert node_state(node("up", 0, [])) == "IDLE"
    assert node_state(node("up", 1, [3])) == "MIXED"
    assert node_state(node("up", 2, [3])) == "ALLOCATED"
    assert node_state(node("drain", 0, [])) == "IDLE+DRAIN"
    assert node_state(node("down", 0, [])) == "DOWN*"
    assert gres(node("up", 0, [])) == "gpu:nvidia_h100:2"
