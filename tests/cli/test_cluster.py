"""The CLI against a real local cluster: a head and two agents with two fake GPUs each."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from phalanx.api.models import JobDetail, JobList, NodeList, WhoAmI
from phalanx.local import LocalCluster
from tests.cli.conftest import invoke, run_cli

HELLO = ("python", "-c", "import os; print('hi from rank', os.environ['RANK'])")


def _detail(env: dict[str, str], job_id: int) -> JobDetail:
    result = invoke("show", str(job_id), "--json", env=env)
    assert result.exit_code == 0, result.stderr
    return JobDetail.model_validate_json(result.stdout)


def _wait_state(env: dict[str, str], job_id: int, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = _detail(env, job_id).job.state
        if state in states or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def test_nodes_lists_both_agents(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    result = invoke("nodes", "--json", env=admin_env)
    assert result.exit_code == 0, result.stderr
    listed = NodeList.model_validate_json(result.stdout)
    assert sorted(n.name for n in listed.nodes) == ["127.0.0.2", "127.0.0.3"]
    assert all(n.state == "up" and len(n.gpus) == 2 for n in listed.nodes)
    table = invoke("nodes", env=admin_env).stdout
    assert "127.0.0.2" in table and "127.0.0.3" in table and "/2" in table


def test_whoami_is_admin(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    result = invoke("whoami", "--json", env=admin_env)
    assert WhoAmI.model_validate_json(result.stdout).role == "admin"


def test_submit_wait_then_show_logs_history(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_cli(
        "submit", "-J", "hello", "-N", "2", "--gpus-per-node", "1", "--wait", "--", *HELLO,
        env=admin_env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.split("Submitted job ")[1].split()[0])
    assert f"job {job_id}: CD" in proc.stderr  # the final status line

    detail = _detail(admin_env, job_id)
    assert detail.job.state == "CD" and detail.job.exit_code == "0:0"
    assert detail.spec.workdir == str(tmp_path)
    assert sorted({p.node for p in detail.job.placement}) == ["127.0.0.2", "127.0.0.3"]
    assert detail.events[0].kind == "submitted"
    shown = invoke("show", str(job_id), env=admin_env).stdout
    assert "hello" in shown and "127.0.0.3" in shown

    every = invoke("logs", str(job_id), env=admin_env).stdout
    assert every == "[rank 0] hi from rank 0\n[rank 1] hi from rank 1\n"
    rank1 = invoke("logs", str(job_id), "--rank", "1", "-f", env=admin_env)
    assert rank1.stdout == "hi from rank 1\n"

    history = invoke("history", "--since", "1h", "--json", env=admin_env)
    ended = JobList.model_validate_json(history.stdout).jobs
    assert any(j.id == job_id and j.state == "CD" for j in ended)
    table = invoke("history", env=admin_env).stdout
    line = next(row for row in table.splitlines() if row.startswith(f"{job_id} "))
    assert "hello" in line and "CD" in line and "0:0" in line


def test_wait_exits_with_the_jobs_exit_code(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_cli(
        "submit", "--wait", "--", "python", "-c", "import sys; sys.exit(3)",
        env=admin_env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    # stderr is a pipe: status lines, the last one ending the output with a newline.
    assert re.fullmatch(r"(job \d+: [A-Z]+ .*\n)*job \d+: F .*exit 3:0\n", proc.stderr), proc.stderr


def test_ctrl_c_during_wait_leaves_the_job_running_and_says_how_to_cancel_it(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "submit", "--wait", "--", "sleep", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **admin_env},
    )
    assert proc.stdout is not None
    job_id = int(proc.stdout.readline().split("Submitted job ")[1])
    assert _wait_state(admin_env, job_id, {"R"}) == "R"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.endswith(f"job {job_id} keeps running; `phalanx cancel {job_id}`\n"), err
    assert _detail(admin_env, job_id).job.state == "R"  # only the waiting stopped
    assert invoke("cancel", str(job_id), env=admin_env).exit_code == 0


def test_queue_then_cancel(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    sleeper = ("python", "-c", "import time; time.sleep(120)")
    result = invoke("submit", "-J", "sleeper", "--json", "--", *sleeper, env=admin_env)
    assert result.exit_code == 0, result.stderr
    job_id = json.loads(result.stdout)["job_ids"][0]
    assert _wait_state(admin_env, job_id, {"R"}) == "R"

    queued = invoke("queue", "--json", "--state", "R", env=admin_env)
    assert job_id in [j.id for j in JobList.model_validate_json(queued.stdout).jobs]
    table = invoke("queue", "--me", env=admin_env).stdout
    line = next(row for row in table.splitlines() if row.startswith(f"{job_id} "))
    assert "sleeper" in line and " R " in line and "127.0.0." in line

    cancelled = invoke("cancel", str(job_id), env=admin_env)
    assert cancelled.exit_code == 0, cancelled.stderr
    assert _wait_state(admin_env, job_id, {"CA"}) == "CA"
    after = invoke("queue", "--json", env=admin_env)
    assert job_id not in [j.id for j in JobList.model_validate_json(after.stdout).jobs]
    again = invoke("cancel", str(job_id), env=admin_env)  # the job's id said once
    assert (again.exit_code, again.stderr) == (2, f"error: job {job_id} already ended (CA)\n")


def test_unknown_job_is_a_one_line_error(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    result = invoke("show", "999999", env=admin_env)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "999999" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    cancelled = invoke("cancel", "999999", env=admin_env)  # not "job 999999: no job 999999"
    assert (cancelled.exit_code, cancelled.stderr) == (2, "error: no job 999999\n")


def test_a_new_user_with_a_token_sees_only_their_jobs(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    assert invoke("admin", "team", "set", "ml", "--quota", "2", env=admin_env).exit_code == 0
    added = invoke("admin", "user", "add", "alice", "--team", "ml", env=admin_env)
    assert added.exit_code == 0, added.stderr
    token = invoke("admin", "token", "create", "alice", env=admin_env).stdout.strip()
    alice = cluster.client_env(token)
    me = WhoAmI.model_validate_json(invoke("whoami", "--json", env=alice).stdout)
    assert (me.user, me.role, me.teams) == ("alice", "user", ["ml"])
    denied = invoke("drain", "127.0.0.2", "--reason", "x", env=alice)
    # The head's words, without an HTTP status code: that is noise to a user.
    assert (denied.exit_code, denied.stderr) == (2, "error: this needs an admin token\n")


def test_a_token_is_read_from_a_file_never_taken_as_an_argument(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    env = cluster.client_env()
    del env["PHALANX_TOKEN"]
    token_file = tmp_path / "admin.token"
    token_file.write_text(cluster.admin_token + "\n")
    token_file.chmod(0o600)
    me = invoke("whoami", "--json", "--token-file", str(token_file), env=env)
    assert me.exit_code == 0, me.stderr
    assert WhoAmI.model_validate_json(me.stdout).user == "admin"
    # The token itself on the command line (every user sees it in `ps`) is no option.
    visible = run_cli("whoami", "--token", cluster.admin_token, env=env)
    assert visible.returncode == 2 and "--token-file" in visible.stderr
    assert "Traceback" not in visible.stderr
    missing = invoke("whoami", "--token-file", str(tmp_path / "nope"), env=env)
    assert missing.exit_code == 2 and "cannot read it" in missing.stderr


def test_memory_or_cpus_beyond_every_node_are_refused_at_submit(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    listed = NodeList.model_validate_json(invoke("nodes", "--json", env=admin_env).stdout)
    mem = max(n.memory_mb for n in listed.nodes)  # what the agents measured on this host
    cpus = max(n.cpus for n in listed.nodes)
    result = invoke("submit", "--mem", f"{mem + 1}M", "--", "true", env=admin_env)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: asks for {mem + 1} MB of memory per node (--mem); "
        f"the node with the most has {mem} MB\n",
    )
    result = invoke("submit", "-c", str(cpus + 1), "--", "true", env=admin_env)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: asks for {cpus + 1} CPUs per node; the node with the most has {cpus} CPUs\n",
    )
    result = invoke("submit", "-N", "3", "--", "true", env=admin_env)
    assert (result.exit_code, result.stderr) == (
        2,
        "error: asks for 3 nodes with 1 GPU each; the cluster has 2 such nodes\n",
    )


def test_a_missing_workdir_is_never_created_and_fails_the_job(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    typo = tmp_path / "no-such" / "dir"
    proc = run_cli(
        "submit", "-D", str(typo), "--wait", "--", "true", env=admin_env, cwd=tmp_path
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(
        f"warning: working directory {typo} does not exist on this machine; "
        "the job fails (LaunchFailed) unless it exists on its nodes\n"
    )
    job_id = int(proc.stdout.split("Submitted job ")[1].split()[0])
    info = _detail(admin_env, job_id).job
    assert (info.state, info.reason, info.restart_count) == ("F", "LaunchFailed", 0)
    assert f"working directory {typo} does not exist on this node" in (info.reason_message or "")
    assert not (tmp_path / "no-such").exists()
