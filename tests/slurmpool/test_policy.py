"""The pool's pure decisions (table-driven) and the Slurm job it submits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from phalanx.slurmpool.payload import AgentJob, address_lines, check_args
from phalanx.slurmpool.policy import Member, PendingJob, PoolLimits, decide

LIMITS = PoolLimits(min_nodes=1, max_nodes=4, gpus_per_node=8, idle_timeout_s=300.0)


def joined(slurm_id: str, jobs: int = 0, idle_s: float | None = None) -> Member:
    return Member(slurm_id, "RUNNING", f"slurm-{slurm_id}", True, jobs, idle_s)


def queued(slurm_id: str) -> Member:
    return Member(slurm_id, "PENDING", f"slurm-{slurm_id}", False, 0, None)


def starting(slurm_id: str) -> Member:
    return Member(slurm_id, "RUNNING", f"slurm-{slurm_id}", False, 0, None)


def waiting(job_id: int, nodes: int, reason: str | None = "Resources", gpus: int = 8) -> PendingJob:
    return PendingJob(job_id, nodes, gpus, reason)


CASES = [
    # (what, members, pending jobs, target, submit, released slurm ids)
    ("empty pool keeps its minimum", [], [], 1, 1, []),
    ("a 2-node job grows it to 2", [joined("1")], [waiting(7, 2)], 2, 1, []),
    # An idle node counts: one 2-node job on top of a busy node needs 2 more.
    ("busy nodes stay, demand adds", [joined("1", jobs=1)], [waiting(7, 2)], 3, 2, []),
    ("max caps the growth", [], [waiting(7, 3), waiting(8, 3)], 4, 4, []),
    ("jobs behind others are demand too", [], [waiting(7, 1, "Priority")], 1, 1, []),
    ("no node up at all", [], [waiting(7, 2, "ReqNodeNotAvail")], 2, 2, []),
    (
        "waiting on a dependency is no demand",
        [joined("1")],
        [waiting(7, 2, "Dependency")],
        1,
        0,
        [],
    ),
    ("over quota is no demand", [joined("1")], [waiting(7, 2, "QuotaExceeded")], 1, 0, []),
    ("not yet considered is no demand", [joined("1")], [waiting(7, 2, None)], 1, 0, []),
    ("a job no pool node fits", [joined("1")], [waiting(7, 1, gpus=16)], 1, 0, []),
    (
        "idle past the timeout: released, longest idle first",
        [joined("1", idle_s=900), joined("2", idle_s=600), joined("3", jobs=1)],
        [],
        1,
        0,
        ["1", "2"],
    ),
    (
        "idle but not long enough: kept",
        [joined("1", idle_s=10), joined("2", idle_s=299)],
        [],
        1,
        0,
        [],
    ),
    (
        "still queued in Slurm goes first, newest first",
        [queued("5"), queued("6"), joined("1", idle_s=900)],
        [],
        1,
        0,
        ["6", "5"],
    ),
    ("a starting agent is never idle", [starting("4"), starting("5")], [], 1, 0, []),
    ("the minimum is kept even idle", [joined("1", idle_s=9999)], [], 1, 0, []),
]


@pytest.mark.parametrize(
    ("members", "jobs", "target", "submit", "released"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    members: list[Member], jobs: list[PendingJob], target: int, submit: int, released: list[str]
) -> None:
    d = decide(members, jobs, LIMITS)
    assert (d.target, d.submit, [m.slurm_id for m in d.release]) == (target, submit, released)


def test_held_jobs_and_too_big_jobs_are_told_apart() -> None:
    jobs = [
        PendingJob(1, 1, 8, "Resources", held=True),
        PendingJob(2, 1, 16, "Resources"),
        PendingJob(3, 2, 4, "Resources"),
    ]
    d = decide([], jobs, LIMITS)
    assert (d.demanding, d.too_big, d.demand_nodes) == ((3,), (2,), 2)


def agent_job(**fields: object) -> AgentJob:
    base: dict[str, object] = {
        "pool": "p",
        "head_url": "https://head:8443",
        "token_file": "/shared/phalanx/join token",
        "node_prefix": "slurm-",
        "state_root": "/tmp/pool/",
        "phalanx": ("/opt/phalanx/bin/python", "-m", "phalanx"),
    }
    base.update(fields)
    return AgentJob(**base)  # type: ignore[arg-type]  # the fields above, as declared


def test_the_agent_job_asks_for_a_whole_node_and_warns_ahead_of_its_limit() -> None:
    job = agent_job(partition="a100", gpus_per_node=8, time_limit="4:00:00", leave_before_s=300)
    opts = job.sbatch_options()
    for expected in (
        "--job-name=phalanx-pool-p",
        "--nodes=1",
        "--exclusive",
        "--partition=a100",
        "--gres=gpu:8",
        "--time=4:00:00",
        "--signal=B:TERM@300",
        "--no-requeue",
    ):
        assert expected in opts
    plain = agent_job().sbatch_options()
    assert not any(o.startswith(("--signal", "--time", "--gres", "--partition")) for o in plain)


def test_the_script_runs_one_leaving_agent_named_after_the_slurm_job(tmp_path: Path) -> None:
    job = agent_job(address="auto", ca_file="/shared/ca.crt", agent_args=("--label=rack=r1",))
    script = job.script()
    assert "--on-sigterm leave" in script and "--leave-grace 60" in script
    assert "'/shared/phalanx/join token'" in script  # the file's path, quoted; never a token
    # Run it with `exec` swapped for echo: what would the agent be started with?
    probe = script.replace("exec ", "printf '%s\\n' ", 1)
    env = {"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    argv = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert argv[argv.index("--name") + 1] == "slurm-42"
    assert argv[argv.index("--state-dir") + 1] == "/tmp/pool/slurm-42"
    assert argv[argv.index("--token-file") + 1] == "/shared/phalanx/join token"
    assert argv[argv.index("--ca-file") + 1] == "/shared/ca.crt"
    assert argv[argv.index("--address") + 1]  # the node's own address, found at run time
    assert "--label=rack=r1" in argv


def test_extra_options_must_be_options() -> None:
    assert check_args(["--account=ml", "-q", "--qos=high"], "--sbatch-arg") == [
        "--account=ml",
        "-q",
        "--qos=high",
    ]
    with pytest.raises(ValueError, match="not an option"):
        check_args(["account=ml"], "--sbatch-arg")
    with pytest.raises(ValueError, match="not an option"):
        check_args(["--x\n#SBATCH --y"], "--agent-arg")


@pytest.mark.parametrize(
    ("address", "expected"),
    [("iface:lo", "127.0.0.1"), ("10.1.2.3", "10.1.2.3")],
)
def test_the_address_is_found_on_the_node(address: str, expected: str) -> None:
    script = address_lines(address) + '\nprintf "%s" "$address"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, expected), out.stderr


def test_an_interface_name_is_checked() -> None:
    with pytest.raises(ValueError, match="not an interface name"):
        address_lines("iface:eth0; rm -rf /")
    missing = subprocess.run(
        ["bash", "-c", address_lines("iface:nosuch0")], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "no IPv4 address on nosuch0" in missing.stderr
